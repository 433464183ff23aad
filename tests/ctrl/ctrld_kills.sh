#!/usr/bin/env bash
# Integration: workers killed at random points, again and again, under
# load. kvferry-ctrld with two stages on two nodes over two dataplanes
# (scripts/serve-lib.sh's dataplane topology: stage 0's worker on node 1
# sends to node 2 on its dataplane send lane, stage 1's on node 2 receives
# from node 2's dataplane and sends back on its own lane), the tiny
# generated model, 8 streaming clients round after round (greedy and seeded,
# half with logprobs). KILLS times (default 20; 200 by hand: about 3
# minutes) a worker of a random stage is SIGKILLed after a random pause and
# started again at once (as systemd's Restart= would); the next kill waits
# until ctrld runs the chain with the new worker (KVF_RAPID=1: only for a
# /health 200, which may come before ctrld noticed the death, so that kills
# also land while the chain re-forms). Then:
#  - every answer of every round equals the undisturbed run's (text, tokens,
#    logprobs, finish, usage), with no error event: what was in flight at
#    each death was replayed;
#  - every KV block is back, nothing live or waiting;
#  - both dataplanes' receive pools are full and every send lane is free
#    or held by a live process: what each dead worker held in shared memory
#    (receive buffers, its lane, the lane's requests) came back.
# KVF_VICTIM=ctrld kills kvferry-ctrld instead, started again at once on
# the same port: the streams it held end with a broken connection (nothing
# else holds them), the workers join the new one, and then:
#  - no client waited past its bound, and every answer that completed
#    equals the undisturbed run's; the chain serves after each restart
#    (/health 200) and a round after the last one is undisturbed;
#  - the new ctrld's KV blocks are all free, and what each dead ctrld held
#    in shared memory (the results it had taken off node 1's receive ring)
#    is back in the dataplanes' pools.
#   ctrld_kills.sh BUILD_DIR SOURCE_ROOT [KILLS]
set -u
B=$(cd "$1" && pwd) S=$(cd "$2" && pwd) KILLS=${3:-${KVF_KILLS:-20}}
skip() { echo "SKIP: $*"; exit 77; }
command -v python3 >/dev/null || skip "python3 missing"
command -v curl >/dev/null || skip "curl missing"
[ "$(id -u)" = 0 ] || skip "needs root (hugepages for two dataplanes)"

KVF_BIN=$B KVF_BACKEND=cpu KVF_THREADS=1 KVF_KV_MEMORY=16M
KVF_RUN=$(mktemp -d /tmp/kvferry-kills.XXXXXX)
KVF_MODEL=$KVF_RUN/tiny
. "$S/scripts/serve-lib.sh"
cleanup() {
  touch "$KVF_RUN/stop"
  kvf_down
  rm -f /dev/hugepages/*"${KVF_RA:-none}"* /dev/hugepages/*"${KVF_RB:-none}"* /dev/shm/*"${KVF_RA:-none}"* \
    /dev/shm/*"${KVF_RB:-none}"* 2>/dev/null
  [ -n "${KEEP:-}" ] || rm -rf "$KVF_RUN"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  [ -S "${KVF_SOCK:-}" ] && { "$B/ctrlctl" --socket "$KVF_SOCK" stages; "$B/ctrlctl" --socket "$KVF_SOCK" peers; } 2>&1
  [ -n "${HOLD:-}" ] && { echo "holding for $HOLD s (pids ${KVF_PIDS[*]})"; sleep "$HOLD"; }
  for f in "$KVF_RUN"/*.log; do echo "--- $f"; tail -n 25 "$f"; done
  exit 1
}
"$B/kvferry-mkmodel" --out "$KVF_MODEL" --preset tiny >/dev/null || fail "kvferry-mkmodel"

# a request in flight may be hit by several deaths in a row; each chain
# re-forms within a second here
export KVFERRY_REPLAY_MAX=50 KVFERRY_REPLAY_TIMEOUT=20
VICTIM=${KVF_VICTIM:-worker}
[ "$VICTIM" = ctrld ] && KVF_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
kvf_up dataplane 2 || fail "the dataplane topology did not come up"
[ "$KVF_TOPOLOGY" = dataplane ] || skip "no hugepages for two dataplanes (ran: $KVF_TOPOLOGY)"

clients() { python3 "$S/tests/ctrl/stream_clients.py" "$KVF_URL" "$KVF_RUN/$1.json" "$KVF_RUN/$1.ready" "$2" 120; }
health() { curl -s -m 2 -o /dev/null -w '%{http_code}' "$KVF_URL/health"; }
stage_pid() { # STAGE: "PID UP" as ctrld sees it
  "$B/ctrlctl" --socket "$KVF_SOCK" --json stages 2>/dev/null \
    | python3 -c 'import json,sys; s = json.load(sys.stdin)["data"]["stages"][int(sys.argv[1])]; print(s["pid"], s["up"])' "$1"
}

clients ref 8 || fail "the undisturbed clients"
python3 - "$KVF_RUN/ref.json" <<'EOF' || fail "the undisturbed run itself is not clean"
import json, sys
for i, r in enumerate(json.load(open(sys.argv[1]))):
    assert r["status"] == 200 and r["done"] and not r["errors"] and r["finish"] == "length", (i, r)
EOF
echo "ok    8 streaming clients undisturbed"

# the load: rounds of the same 8 requests until told to stop
( i=0
  while [ ! -e "$KVF_RUN/stop" ]; do
    i=$((i + 1))
    clients "round$i" 8 || echo "round $i: the clients failed" >>"$KVF_RUN/load.err"
    [ "$VICTIM" = ctrld ] && sleep 0.1 # while it restarts, a round ends at once
  done ) &
load=$!

kill_ctrld() { # K: SIGKILL ctrld, start it again on the same port, wait for /health 200
  sleep "0.$((RANDOM % 4))$((RANDOM % 10))"
  kill -9 "$KVF_CTRLD" 2>/dev/null
  wait "$KVF_CTRLD" 2>/dev/null
  "${KVF_CTRLD_CMD[@]}" >>"$KVF_RUN/ctrld.log" 2>&1 &
  KVF_CTRLD=$!
  KVF_PIDS+=($!)
  tk=$(date +%s.%N)
  back=
  for _ in $(seq 400); do
    [ "$(health)" = 200 ] && { back=1; break; }
    sleep 0.05
  done
  [ -n "$back" ] || fail "ctrld did not serve within 20 s of its restart $1"
  echo "$1 ctrld $(python3 -c "import sys, time; print('%.3f' % (time.time() - float(sys.argv[1])))" "$tk")" \
    >>"$KVF_RUN/reform.txt"
}

t0=$(date +%s.%N)
for k in $(seq "$KILLS"); do
  [ "$VICTIM" = ctrld ] && { kill_ctrld "$k"; continue; }
  s=$((RANDOM % 2))
  sleep "0.$((RANDOM % 4))$((RANDOM % 10))"
  kill -9 "${KVF_WPIDS[$s]}" 2>/dev/null
  wait "${KVF_WPIDS[$s]}" 2>/dev/null
  ${KVF_WCMD[$s]} >>"$KVF_RUN/worker$s.log" 2>&1 &
  KVF_WPIDS[$s]=$!
  KVF_PIDS+=($!)
  tk=$(date +%s.%N)
  # back: ctrld runs the chain with the new worker (a /health 200 alone may
  # come before ctrld noticed the death; KVF_RAPID=1 kills on that, so that
  # deaths also land while the chain re-forms)
  back=
  for _ in $(seq 200); do
    { [ -n "${KVF_RAPID:-}" ] || [ "$(stage_pid "$s")" = "${KVF_WPIDS[$s]} True" ]; } && [ "$(health)" = 200 ] \
      && { back=1; break; }
    sleep 0.05
  done
  # (not a second look: in rapid mode the chain may be down again by then)
  [ -n "$back" ] || fail "the chain did not re-form within 10 s of kill $k (stage $s)"
  echo "$k $s $(python3 -c "import sys, time; print('%.3f' % (time.time() - float(sys.argv[1])))" "$tk")" \
    >>"$KVF_RUN/reform.txt"
done
t1=$(date +%s.%N)
touch "$KVF_RUN/stop"
wait $load
[ -e "$KVF_RUN/load.err" ] && fail "$(cat "$KVF_RUN/load.err")"
python3 - "$KVF_RUN/reform.txt" "$KILLS" "$t0" "$t1" "$VICTIM" <<'EOF'
import sys
t = sorted(float(l.split()[2]) for l in open(sys.argv[1]))
p = lambda q: t[min(len(t) - 1, int(q * len(t)))]
print("ok    %s %ss SIGKILLed at random points and started again in %.0f s; the chain back (/health 200) "
      "p50 %.2f s, p99 %.2f s, max %.2f s after a kill" % (sys.argv[2], sys.argv[5],
                                                           float(sys.argv[4]) - float(sys.argv[3]),
                                                           p(0.5), p(0.99), t[-1]))
EOF
if [ "$VICTIM" = ctrld ]; then
  clients after 8 || fail "the clients after the last restart"
  python3 - "$KVF_RUN" <<'EOF' || fail "an answer differs from the undisturbed run, or a client waited past its bound"
import glob, json, os, sys
run = sys.argv[1]
ref = json.load(open(os.path.join(run, "ref.json")))
rounds = sorted(glob.glob(os.path.join(run, "round*.json")))
done = broken = 0
for path in rounds:
    for i, (a, b) in enumerate(zip(ref, json.load(open(path)))):
        if b["done"] and not b["errors"]:
            for k in ("text", "tokens", "token_logprobs", "top_logprobs", "finish", "usage"):
                assert a[k] == b[k], "%s client %d: %s differs from the undisturbed run" % (path, i, k)
            done += 1
        else: # its ctrld died: a broken or refused connection, never a timeout
            assert not any("timed out" in e or "timeout" in e.lower() for e in b["errors"]), (path, i, b["errors"])
            broken += 1
for i, (a, b) in enumerate(zip(ref, json.load(open(os.path.join(run, "after.json"))))):
    assert b["status"] == 200 and b["done"] and not b["errors"], ("after", i, b)
    for k in ("text", "tokens", "token_logprobs", "top_logprobs", "finish", "usage"):
        assert a[k] == b[k], "after the restarts, client %d: %s differs from the undisturbed run" % (i, k)
assert done > 0, "no request completed between the restarts"
print("ok    %d requests completed in %d rounds, each equal to the undisturbed run; %d ended with their ctrld "
      "(a broken or refused connection, none hung); the 8 after the last restart undisturbed"
      % (done, len(rounds), broken))
EOF
fi

[ "$VICTIM" = ctrld ] || python3 - "$KVF_RUN" <<'EOF' || fail "an answer differs from the undisturbed run, or a client saw an error"
import glob, json, os, sys
run = sys.argv[1]
ref = json.load(open(os.path.join(run, "ref.json")))
rounds = sorted(glob.glob(os.path.join(run, "round*.json")))
assert rounds, "no round completed"
n = 0
for path in rounds:
    for i, (a, b) in enumerate(zip(ref, json.load(open(path)))):
        assert b["status"] == 200 and not b["errors"] and b["done"], (path, i, b["status"], b["errors"])
        for k in ("text", "tokens", "token_logprobs", "top_logprobs", "finish", "usage"):
            assert a[k] == b[k], "%s client %d: %s differs from the undisturbed run" % (path, i, k)
        n += 1
print("ok    %d requests in %d rounds, every one equal to the undisturbed run, no error" % (n, len(rounds)))
EOF
if [ "$VICTIM" = worker ]; then
  replayed=$(curl -s "$KVF_URL/metrics" | sed -n 's/^kvferry_requests_replayed_total \([0-9.e+]*\)$/\1/p')
  python3 -c "import sys; sys.exit(0 if float(sys.argv[1] or 0) > 0 else 1)" "${replayed:-0}" \
    || fail "no request was replayed: the kills missed every request in flight"
  echo "ok    kvferry_requests_replayed_total ${replayed%.*}"
fi

pool() { # FIELD: replica 0's, from ctrlctl pool
  "$B/ctrlctl" --socket "$KVF_SOCK" --json pool | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0][sys.argv[1]])' "$1"
}
for _ in $(seq 100); do
  [ "$(pool blocks_in_use)" = 0 ] && [ "$(pool blocks_reserved)" = 0 ] && [ "$(pool live)" = 0 ] \
    && [ "$(pool replaying)" = 0 ] && break
  sleep 0.1
done
[ "$(pool blocks_in_use)" = 0 ] && [ "$(pool blocks_reserved)" = 0 ] && [ "$(pool live)" = 0 ] \
  || { "$B/ctrlctl" --socket "$KVF_SOCK" pool; fail "KV blocks or requests left in the scheduler"; }
echo "ok    every KV block back, nothing live"

cli=$B/tests/dataplane/dp_client
[ -x "$cli" ] || skip "tests/dataplane/dp_client not built"
for r in "$KVF_RA" "$KVF_RB"; do
  ok=
  for _ in $(seq 50); do # the dataplanes look every 50 ms; a lane waits for its completions
    "$cli" --region "$r" --check-lanes >"$KVF_RUN/lanes.out" 2>&1 \
      && "$cli" --region "$r" --check-pools --pools dp.rxs,dp.rxl >"$KVF_RUN/pools.out" 2>&1 && { ok=1; break; }
    sleep 0.1
  done
  cat "$KVF_RUN/lanes.out" "$KVF_RUN/pools.out"
  [ -n "$ok" ] || fail "region $r: a dead worker's lane or receive buffers were not given back"
done
freed=$(cat "$KVF_RUN"/dataplane*.log | grep -c "send lane [0-9]* of dead pid")
echo "ok    both dataplanes' receive pools full, every send lane free or live ($freed lanes of dead processes freed)"
if [ "$VICTIM" = ctrld ]; then
  echo "PASS: $KILLS ctrld deaths under load: no client hung, no answer changed, the workers served each new ctrld, nothing leaked"
else
  echo "PASS: $KILLS random worker deaths under load lost, repeated or changed no token and leaked nothing"
fi
