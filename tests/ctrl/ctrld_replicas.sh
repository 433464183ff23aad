#!/usr/bin/env bash
# Integration: two pipelines of kvferry-worker processes behind one
# kvferry-ctrld ([sched] replicas = 2, every worker on this node's region,
# replica 1 on rings serve.r1.*), the tiny generated model, 8 streaming
# clients in flight (greedy and seeded, half with logprobs; 400 + 6 i tokens,
# so that every stream is still going when the kill lands):
#  1. a worker of one replica is SIGKILLed mid-stream and not started again:
#     every client completes with 200 and no error event, its text, logprobs,
#     finish reason and usage those of an undisturbed run, within seconds
#     (the lost requests move to the other replica and run again there,
#     long before replay_timeout); /health stays 200 meanwhile;
#     kvferry_requests_moved_total counts them; new requests are served by
#     the replica that is up;
#  2. the worker is started again: its replica re-forms and takes requests
#     again; every KV block is back in both pools.
#   ctrld_replicas.sh BUILD_DIR SOURCE_ROOT
# KVF_BACKEND=cuda runs the four workers on the GPU (a manual run on a GPU
# machine; CI runs cpu).
set -u
B=$(cd "$1" && pwd) S=$(cd "$2" && pwd)
BACKEND=${KVF_BACKEND:-cpu}
skip() { echo "SKIP: $*"; exit 77; }
command -v python3 >/dev/null || skip "python3 missing"
command -v curl >/dev/null || skip "curl missing"

KVF_RUN=$(mktemp -d /tmp/kvferry-replicas.XXXXXX)
REG=kvfrep$$
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -f /dev/hugepages/*"$REG"* /dev/shm/*"$REG"* 2>/dev/null
  [ -n "${KEEP:-}" ] || rm -rf "$KVF_RUN"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$KVF_RUN"/*.log; do echo "--- $f"; tail -n 25 "$f"; done
  exit 1
}
now() { date +%s.%N; }
"$B/kvferry-mkmodel" --out "$KVF_RUN/tiny" --preset tiny >/dev/null || fail "kvferry-mkmodel"

# worker R K: stage K of replica R (rings serve.sK.in for replica 0, serve.r1.sK.in for 1)
declare -A WPID WCMD
worker() {
  local r=$1 k=$2 p=serve
  [ "$r" = 1 ] && p=serve.r1
  local out="ring:$p.s$((k + 1)).in"
  [ "$k" = 1 ] && out="ring:$p.ret"
  WCMD[$r$k]="$B/kvferry-worker --config /dev/null --region $REG --model $KVF_RUN/tiny --in ring:$p.s$k.in --out $out --role r${r}stage$k --backend $BACKEND --threads 1"
  ${WCMD[$r$k]} >>"$KVF_RUN/worker$r$k.log" 2>&1 &
  WPID[$r$k]=$!
  pids+=($!)
}
for r in 0 1; do for k in 0 1; do worker $r $k; done; done
env -u KVFERRY_CONFIG KVFERRY_REPLAY_TIMEOUT=60 "$B/kvferry-ctrld" --config /dev/null --model-dir "$KVF_RUN/tiny" \
  --stages 2 --replicas 2 --backend "$BACKEND" --threads 1 --port 0 --admin-socket "$KVF_RUN/ctrl.sock" \
  --kv-memory 16M --worker-region "$REG" --worker-region-size 64M --worker-return ring --worker-join-timeout 60 \
  --served-model-name tiny >"$KVF_RUN/ctrld.log" 2>&1 &
pids+=($!)
for _ in $(seq 300); do grep -q "serving " "$KVF_RUN/ctrld.log" && break; sleep 0.1; done
grep -q "serving " "$KVF_RUN/ctrld.log" || fail "ctrld did not serve two replicas of workers"
URL=$(sed -n 's/.* on \(http:\/\/[^,]*\), admin.*/\1/p' "$KVF_RUN/ctrld.log" | head -n1)

clients() { python3 "$S/tests/ctrl/stream_clients.py" "$URL" "$KVF_RUN/$1.json" "$KVF_RUN/$1.ready" "$2" 400; }
wait_ready() {
  for _ in $(seq 600); do [ -e "$KVF_RUN/$1.ready" ] && return 0; sleep 0.05; done
  fail "the streams of $1 did not start"
}
stat() { # python expression over /stats as s
  curl -s -m 5 "$URL/stats" | python3 -c 'import json, sys; s = json.load(sys.stdin); print(eval(sys.argv[1]))' "$1"
}
blocks_back() {
  for _ in $(seq 100); do
    [ "$(stat 'sum(r["blocks_in_use"] + r["blocks_reserved"] + r["live"] for r in s["backend"]["replicas"])')" = 0 ] && return 0
    sleep 0.1
  done
  fail "$1: KV blocks or requests left: $(curl -s "$URL/stats")"
}

clients ref 8 || fail "the undisturbed clients"
python3 - "$KVF_RUN/ref.json" <<'EOF' || fail "the undisturbed run itself is not clean"
import json, sys
for i, r in enumerate(json.load(open(sys.argv[1]))):
    assert r["status"] == 200 and r["done"] and not r["errors"] and r["finish"] == "length", (i, r)
EOF
served=$(stat '" / ".join(str(r["finished_total"]) for r in s["backend"]["replicas"])')
echo "ok    8 streaming clients undisturbed, served by both replicas (requests finished: $served)"
case $served in 0\ *|*\ 0) fail "one replica served no request of 8: $served" ;; esac

# 1. a stage-1 worker of replica 0 dies and stays dead
rm -f "$KVF_RUN/run.ready"
clients run 8 & cli=$!
wait_ready run
kill -9 "${WPID[01]}"
t_kill=$(now)
sleep 0.5
h=$(curl -s -m 5 -o /dev/null -w '%{http_code}' "$URL/health")
[ "$h" = 200 ] || fail "/health answered $h with one replica of two down"
echo "ok    /health 200 while replica 1 serves and replica 0 is down"
wait $cli || fail "the clients of the run with the kill"
python3 - "$KVF_RUN/ref.json" "$KVF_RUN/run.json" "$t_kill" <<'EOF' || fail "a client saw the worker's death"
import json, sys
ref, run, t_kill = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), float(sys.argv[3])
for i, (a, b) in enumerate(zip(ref, run)):
    assert b["status"] == 200 and not b["errors"] and b["done"], (i, b["status"], b["errors"])
    for k in ("text", "tokens", "token_logprobs", "top_logprobs", "finish", "usage"):
        assert a[k] == b[k], "client %d: %s differs from the undisturbed run:\n%r\n%r" % (i, k, a[k], b[k])
last = max(r["t_end"] for r in run)
assert last - t_kill < 30, "the last client ended %.1f s after the kill: it waited for the dead replica" % (last - t_kill)
print("ok    every client completed with 200, no error, the undisturbed run's text, tokens and logprobs, "
      "%.1f s after the kill, the worker not started again (replay_timeout 60 s)" % (last - t_kill))
EOF
moved=$(curl -s "$URL/metrics" | sed -n 's/^kvferry_requests_moved_total \([0-9.e+]*\)$/\1/p')
python3 -c "import sys; sys.exit(0 if float(sys.argv[1] or 0) > 0 else 1)" "${moved:-0}" \
  || fail "kvferry_requests_moved_total is '${moved}' after the kill"
echo "ok    kvferry_requests_moved_total $moved"
code=$(curl -s -m 30 -o "$KVF_RUN/late.json" -w '%{http_code}' "$URL/v1/completions" \
       -d '{"model":"tiny","prompt":"sent while replica 0 is down","max_tokens":8}')
[ "$code" = 200 ] || fail "a request sent while replica 0 is down: $code $(cat "$KVF_RUN/late.json")"
echo "ok    a request sent while replica 0 is down: 200"

# 2. the worker comes back: replica 0 re-forms and serves again
${WCMD[01]} >>"$KVF_RUN/worker01.log" 2>&1 &
pids+=($!)
rm -f "$KVF_RUN/again.ready"
f0=$(stat 's["backend"]["replicas"][0]["finished_total"]')
for _ in $(seq 100); do
  curl -s -m 30 -o /dev/null "$URL/v1/completions" -d '{"model":"tiny","prompt":"after the return","max_tokens":4}'
  [ "$(stat 's["backend"]["replicas"][0]["finished_total"]')" -gt "$f0" ] && break
  sleep 0.1
done
[ "$(stat 's["backend"]["replicas"][0]["finished_total"]')" -gt "$f0" ] \
  || fail "replica 0 served nothing after its worker came back: $(curl -s "$URL/stats")"
echo "ok    replica 0 re-formed and serves again once its worker is back"
blocks_back "at the end"
echo "ok    every KV block back in both pools, nothing live"
echo "PASS: a replica's worker death moves its requests to the other replica, token for token"
