#!/usr/bin/env bash
# Integration: a request survives a worker's death. kvferry-ctrld and two
# kvferry-worker processes over shm rings (scripts/serve-lib.sh's shm
# topology) on the tiny generated model, 8 streaming clients in flight
# (greedy and seeded, half of them with logprobs):
#  1. the stage-1 worker is SIGKILLed mid-stream and started again 1 s later
#     (as systemd's Restart= would): every client completes with 200 and no
#     error event, and its text, logprobs, finish reason and usage equal
#     those of an undisturbed run of the same requests; meanwhile /health is
#     503 naming stage 1; afterwards kvferry_requests_replayed_total and
#     ctrlctl status count the replays and every KV block is back;
#  2. killed again and not started again: every request in flight, and one
#     sent meanwhile, fails once replay_timeout has passed, with an error
#     naming the stage and the setting to raise, and every block is back;
#  3. with [sched] replay_max = 0 a kill fails the requests at once, as it
#     did before replays.
# With KVFERRY_PREFIX_CACHE=yes in the environment ([sched] prefix_cache) the
# run with the kill takes its prompts' blocks from the undisturbed run's
# cache, and the kill must empty it (the restarted worker's pool holds none
# of that KV): the same answers, and /stats counts the hits and the flush.
#   ctrld_replay.sh BUILD_DIR SOURCE_ROOT
set -u
B=$(cd "$1" && pwd) S=$(cd "$2" && pwd)
skip() { echo "SKIP: $*"; exit 77; }
command -v python3 >/dev/null || skip "python3 missing"
command -v curl >/dev/null || skip "curl missing"

KVF_BIN=$B KVF_BACKEND=cpu KVF_THREADS=1 KVF_KV_MEMORY=16M
KVF_RUN=$(mktemp -d /tmp/kvferry-replay.XXXXXX)
KVF_MODEL=$KVF_RUN/tiny
TIMEOUT=8 # replay_timeout: the restart in part 1 is well within it
. "$S/scripts/serve-lib.sh"
cleanup() { kvf_down; [ -n "${KEEP:-}" ] || rm -rf "$KVF_RUN"; }
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$KVF_RUN"/*.log; do echo "--- $f"; tail -n 25 "$f"; done
  exit 1
}
now() { date +%s.%N; }
"$B/kvferry-mkmodel" --out "$KVF_MODEL" --preset tiny >/dev/null || fail "kvferry-mkmodel"

# clients NAME N BASE: N streams of BASE + 6 i tokens, enough that no stream
# can end in the moment between READY and the kill (the tiny model streams
# 90 tokens in tens of ms; 400 for the runs compared with the undisturbed one,
# 1500 for those that are never restarted)
# with the prefix cache, prompts that share their first blocks (and each run
# repeats the one before's)
[ "${KVFERRY_PREFIX_CACHE:-no}" = yes ] && export KVF_PROMPT_PREFIX="Every morning the old ferry leaves the east bank at seven, and "
clients() { python3 "$S/tests/ctrl/stream_clients.py" "$KVF_URL" "$KVF_RUN/$1.json" "$KVF_RUN/$1.ready" "$2" "$3"; }
# wait_ready NAME: until every stream of clients NAME has shown 3 tokens
wait_ready() {
  for _ in $(seq 600); do [ -e "$KVF_RUN/$1.ready" ] && return 0; sleep 0.05; done
  fail "the streams of $1 did not start"
}
probe() { curl -s -m 5 -o "$KVF_RUN/probe.json" -w '%{http_code}' "$KVF_URL$1"; echo " $(cat "$KVF_RUN/probe.json")"; }
pool() { # FIELD: replica 0's, from ctrlctl pool
  "$B/ctrlctl" --socket "$KVF_SOCK" --json pool | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0][sys.argv[1]])' "$1"
}
# blocks_back WHAT: every KV block back and nothing waiting, within 10 s
blocks_back() {
  for _ in $(seq 100); do
    [ "$(pool blocks_in_use)" = 0 ] && [ "$(pool blocks_reserved)" = 0 ] && [ "$(pool live)" = 0 ] \
      && [ "$(pool replaying)" = 0 ] && return 0
    sleep 0.1
  done
  "$B/ctrlctl" --socket "$KVF_SOCK" pool
  fail "$1: KV blocks or requests left in the scheduler"
}

export KVFERRY_REPLAY_TIMEOUT=$TIMEOUT
kvf_up shm 2 || fail "the shm topology did not come up"

# 0. the undisturbed run
clients ref 8 400 || fail "the undisturbed clients"
python3 - "$KVF_RUN/ref.json" <<'EOF' || fail "the undisturbed run itself is not clean"
import json, sys
for i, r in enumerate(json.load(open(sys.argv[1]))):
    assert r["status"] == 200 and r["done"] and not r["errors"] and r["finish"] == "length", (i, r)
    assert r["usage"]["completion_tokens"] == 400 + 6 * i, (i, r["usage"])
    assert (len(r["token_logprobs"]) == 400 + 6 * i) == (i % 4 < 2), (i, len(r["token_logprobs"]))
EOF
echo "ok    8 streaming clients (greedy, seeded, 4 with logprobs) undisturbed"

# 1. SIGKILL stage 1 mid-stream, start it again 1 s later
rm -f "$KVF_RUN/run.ready"
clients run 8 400 & cli=$!
wait_ready run
kill -9 "${KVF_WPIDS[1]}"
t_kill=$(now)
r=
for _ in $(seq 8); do
  sleep 0.1
  r=$(probe /health)
  [ "${r%% *}" = 503 ] && break
done
case $r in 503*"stage 1"*) ;; *) fail "GET /health while the requests wait for the chain: $r" ;; esac
echo "ok    /health: 503 naming stage 1 while the requests wait"
sleep 0.7
${KVF_WCMD[1]} >>"$KVF_RUN/worker1.log" 2>&1 &
w1=$!
KVF_PIDS+=($w1)
t_start=$(now)
wait $cli || fail "the clients of the run with the kill"
python3 - "$KVF_RUN/ref.json" "$KVF_RUN/run.json" "$t_kill" "$t_start" <<'EOF' || fail "a client saw the worker's death"
import json, sys
ref, run = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
t_kill, t_start = float(sys.argv[3]), float(sys.argv[4])
for i, (a, b) in enumerate(zip(ref, run)):
    assert b["status"] == 200, (i, b["status"], b["errors"])
    assert not b["errors"], (i, b["errors"])
    assert b["done"], (i, "no [DONE]")
    for k in ("text", "tokens", "token_logprobs", "top_logprobs", "finish", "usage"):
        assert a[k] == b[k], "client %d: %s differs from the undisturbed run:\n%r\n%r" % (i, k, a[k], b[k])
last = max(r["t_end"] for r in run)
print("ok    every client completed with 200, no error, the undisturbed run's text, tokens and logprobs: "
      "%.1f s after the kill, %.1f s after the worker was started again" % (last - t_kill, last - t_start))
EOF
replayed=$(curl -s "$KVF_URL/metrics" | sed -n 's/^kvferry_requests_replayed_total \([0-9.e+]*\)$/\1/p')
python3 -c "import sys; sys.exit(0 if float(sys.argv[1] or 0) > 0 else 1)" "${replayed:-0}" \
  || fail "kvferry_requests_replayed_total is '${replayed}' after the kill"
st=$("$B/ctrlctl" --socket "$KVF_SOCK" status | sed -n 's/^requests_replayed  *//p')
[ "$st" = "${replayed%.*}" ] || fail "ctrlctl status says $st requests replayed, /metrics ${replayed}"
if command -v promtool >/dev/null; then
  curl -s "$KVF_URL/metrics" | promtool check metrics || fail "promtool check metrics"
fi
blocks_back "after the replays"
echo "ok    kvferry_requests_replayed_total $replayed (ctrlctl status: $st), every KV block back in the pool"
if [ "${KVFERRY_PREFIX_CACHE:-no}" = yes ]; then
  curl -s "$KVF_URL/stats" | python3 -c '
import json, sys
r = json.load(sys.stdin)["backend"]["replicas"][0]
hits, flushes = r["prefix_hit_tokens_total"], r["prefix_flushes_total"]
assert hits > 0, "no prompt position came from the prefix cache"
assert flushes > 0, "the kill did not empty the prefix cache"
print("ok    prefix cache: %d prompt positions taken from it, emptied %d time(s) by the kill" % (hits, flushes))
' || fail "the prefix cache in the run with the kill"
fi

# 2. killed again, not started again: replay_timeout ends the requests
rm -f "$KVF_RUN/lost.ready"
clients lost 4 1500 & cli=$!
wait_ready lost
kill -9 "$w1"
t_kill=$(now)
sleep 0.5
code=$(curl -s -m 60 -o "$KVF_RUN/late.json" -w '%{http_code}' "$KVF_URL/v1/completions" \
       -d '{"model":"tiny","prompt":"sent while the chain is down","max_tokens":8}')
wait $cli || fail "the clients of the run without a restart"
python3 - "$KVF_RUN/lost.json" "$KVF_RUN/late.json" "$code" "$t_kill" "$TIMEOUT" <<'EOF' || fail "requests waiting for a chain that never came back"
import json, sys
lost, late, code = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
t_kill, timeout = float(sys.argv[4]), float(sys.argv[5])
for i, r in enumerate(lost):
    assert r["status"] == 200 and r["done"], (i, r["status"])
    assert len(r["errors"]) == 1, (i, r["errors"])
    m = r["errors"][0]
    assert "stage 1" in m and "replay_timeout" in m and "raise [sched] replay_timeout" in m, (i, m)
    # t_kill is read after kill(1) returned and date(1) ran (tens of ms on a
    # loaded machine), the chain may notice the death before that: 0.25 s slack
    assert timeout - 0.25 <= r["t_end"] - t_kill < timeout + 10, (i, r["t_end"] - t_kill)
assert code == "500" and late["error"]["code"] == "generation_failed", (code, late)
m = late["error"]["message"]
assert "stage 1" in m and "replay_timeout" in m, m
print("ok    without a restart the 4 streams ended %.1f s after the kill (replay_timeout %g s) with: %s"
      % (max(r["t_end"] for r in lost) - t_kill, timeout, lost[0]["errors"][0]))
print("ok    a request sent meanwhile: 500 %s" % m)
EOF
blocks_back "after the timeouts"
kvf_down

# 3. replay_max = 0: the requests fail at once
export KVFERRY_REPLAY_MAX=0
kvf_up shm 2 || fail "the shm topology (replay_max 0) did not come up"
rm -f "$KVF_RUN/norp.ready"
clients norp 4 1500 & cli=$!
wait_ready norp
kill -9 "${KVF_WPIDS[1]}"
t_kill=$(now)
wait $cli || fail "the clients of replay_max 0"
python3 - "$KVF_RUN/norp.json" "$t_kill" <<'EOF' || fail "replay_max 0 does not fail the requests at once"
import json, sys
r, t_kill = json.load(open(sys.argv[1])), float(sys.argv[2])
for i, c in enumerate(r):
    assert c["status"] == 200 and len(c["errors"]) == 1, (i, c["errors"])
    assert "stage 1" in c["errors"][0] and "replay" not in c["errors"][0], (i, c["errors"])
    assert c["t_end"] - t_kill < 3, (i, c["t_end"] - t_kill)
print("ok    replay_max 0: the 4 streams failed %.1f s after the kill: %s"
      % (max(c["t_end"] for c in r) - t_kill, r[0]["errors"][0]))
EOF
echo "PASS: a killed worker's requests run again once it is back, equal to an undisturbed run"
