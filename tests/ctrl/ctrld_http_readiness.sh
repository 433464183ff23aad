#!/usr/bin/env bash
# Integration: what a load balancer reads from kvferry-ctrld when a stage's
# worker process dies. Two kvferry-worker processes over shm rings (one node,
# scripts/serve-lib.sh's shm topology): GET /health and /readyz answer 200;
# the stage-1 worker is SIGKILLed: they answer 503 naming the stage, its
# layers and its pid, while GET /livez stays 200 (restarting ctrld would not
# help); the worker restarted, the chain re-forms and they answer 200 again.
#   ctrld_http_readiness.sh BUILD_DIR SOURCE_ROOT
set -u
B=$(cd "$1" && pwd) S=$(cd "$2" && pwd)
skip() { echo "SKIP: $*"; exit 77; }
command -v python3 >/dev/null || skip "python3 missing"
command -v curl >/dev/null || skip "curl missing"

KVF_BIN=$B KVF_BACKEND=cpu KVF_THREADS=1 KVF_KV_MEMORY=16M KVF_GROUP_TIMEOUT=3
KVF_RUN=$(mktemp -d /tmp/kvferry-ready.XXXXXX)
KVF_MODEL=$KVF_RUN/tiny
. "$S/scripts/serve-lib.sh"
cleanup() { kvf_down; [ -n "${KEEP:-}" ] || rm -rf "$KVF_RUN"; }
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$KVF_RUN"/*.log; do echo "--- $f"; tail -n 20 "$f"; done
  exit 1
}
"$B/kvferry-mkmodel" --out "$KVF_MODEL" --preset tiny >/dev/null || fail "kvferry-mkmodel"
kvf_up shm 2 || fail "the shm topology did not come up"

# probe PATH: "STATUS BODY"
probe() { curl -s -m 5 -o "$KVF_RUN/probe.json" -w '%{http_code}' "$KVF_URL$1"; echo " $(cat "$KVF_RUN/probe.json")"; }

for p in /health /readyz /livez; do
  r=$(probe $p)
  [ "${r%% *}" = 200 ] || fail "GET $p before the kill: $r"
done
echo "ok    /health, /readyz and /livez answer 200 while every stage is up"

kill -9 "${KVF_WPIDS[1]}"
t0=$(date +%s.%N)
r= cpids=()
for _ in $(seq 100); do
  # a request in flight makes the chain notice a death its liveness word missed
  curl -s -m 4 -o /dev/null "$KVF_URL/v1/completions" -d '{"model":"tiny","prompt":"x","max_tokens":2}' &
  cpids+=($!)
  r=$(probe /health)
  [ "${r%% *}" = 503 ] && break
  sleep 0.2
done
t1=$(date +%s.%N)
echo "$r"
[ "${r%% *}" = 503 ] || fail "GET /health after the stage-1 worker died: $r"
python3 - "$KVF_RUN/probe.json" "${KVF_WPIDS[1]}" <<'EOF' || fail "the 503 does not name the stage that is down"
import json, sys
j = json.load(open(sys.argv[1]))
reason = j.get("reason", "")
sys.exit(0 if j.get("status") == "unavailable" and "stage 1" in reason and ("pid %s" % sys.argv[2]) in reason else 1)
EOF
python3 -c "import sys; print('ok    GET /health: 503 naming stage 1 and its pid, %.1f s after the kill' % (float(sys.argv[2]) - float(sys.argv[1])))" "$t0" "$t1"
r=$(probe /readyz)
[ "${r%% *}" = 503 ] || fail "GET /readyz with a stage down: $r"
r=$(probe /livez)
[ "${r%% *}" = 200 ] || fail "GET /livez with a stage down: $r"
echo "ok    /readyz is 503 too; /livez stays 200 (the process is alive)"
wait "${cpids[@]}" 2>/dev/null

${KVF_WCMD[1]} >>"$KVF_RUN/worker1.log" 2>&1 &
KVF_PIDS+=($!)
for _ in $(seq 120); do
  r=$(probe /health)
  [ "${r%% *}" = 200 ] && break
  sleep 0.5
done
[ "${r%% *}" = 200 ] || fail "GET /health after the worker's restart: $r"
code=$(curl -s -m 30 -o /dev/null -w '%{http_code}' "$KVF_URL/v1/completions" -d '{"model":"tiny","prompt":"x","max_tokens":4}')
[ "$code" = 200 ] || fail "a completion once /health says ok again: $code"
echo "ok    the worker restarted: the chain re-forms, /health is 200 and requests are served"
