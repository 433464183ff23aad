#!/usr/bin/env bash
# kvferry-worker under systemd (JOURNAL_STREAM set) starts each stderr line
# with its syslog priority, <3> error, <4> warning, <6> info, so journald
# files a refused start as an error (`journalctl -p err`); in a terminal or
# a log file the lines stay plain. Served by a ctrld on a shm region, the
# worker's progress lines (model opened, stage loaded, joined) are <6> and
# no line goes without a priority.
#   worker_log_priorities.sh KVFERRY_WORKER KVFERRY_CTRLD KVFERRY_MKMODEL
set -u
worker=$1 ctrld=$2 mk=$3
tmp=$(mktemp -d /tmp/kvf-wklog-XXXXXX)
region=kvfwklog$$
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -f /dev/hugepages/*"$region"* /dev/shm/*"$region"* 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$tmp"/*.log; do echo "--- $f"; cat "$f"; done; exit 1; }
run_wk() { env -u KVFERRY_CONFIG "$@"; }

# a start that cannot work: the region does not exist (no wait)
JOURNAL_STREAM=8:12345 run_wk "$worker" --region "$region-none" --model "$tmp/none" --in ring:a --out ring:b \
  --wait 0 >"$tmp/err.log" 2>&1 && fail "started without a region"
grep -q "^<3>kvferry-worker\[stage0\]: shm_region_attach($region-none) failed" "$tmp/err.log" \
  || fail "the attach failure is not at priority 3"
env -u JOURNAL_STREAM "$worker" --region "$region-none" --model "$tmp/none" --in ring:a --out ring:b --wait 0 \
  >"$tmp/plain.log" 2>&1
grep -q "^kvferry-worker\[stage0\]: shm_region_attach($region-none) failed" "$tmp/plain.log" \
  || fail "a terminal got a priority prefix"
# a refused configuration (before the role is known)
JOURNAL_STREAM=8:12345 run_wk "$worker" --region r --model m --in ring:a --out ring:b --depth 9 \
  >"$tmp/cfg.log" 2>&1
grep -q "^<3>kvferry-worker: .*'depth' is out of range" "$tmp/cfg.log" || fail "a refused option is not at priority 3"
rm -f "$tmp"/*.log
echo "ok    a refused start is <3> in the journal, plain in a terminal"

"$mk" --out "$tmp/model" --preset tiny >/dev/null || fail "kvferry-mkmodel"
env -u JOURNAL_STREAM "$ctrld" --config /dev/null --model-dir "$tmp/model" --stages 1 --backend cpu --port 0 \
  --admin-socket "$tmp/ctrl.sock" --threads 1 --kv-memory 16M --worker-region "$region" --worker-region-size 64M \
  --worker-return ring >"$tmp/ctrld.log" 2>&1 &
pids+=($!)
# env execs the worker: $! is the worker itself (a shell function would
# leave a subshell in between, which SIGTERM would stop instead)
env -u KVFERRY_CONFIG JOURNAL_STREAM=8:12345 "$worker" --region "$region" --model "$tmp/model" \
  --in ring:serve.s0.in --out ring:serve.ret --threads 1 >"$tmp/worker.log" 2>&1 &
wpid=$!
pids+=($wpid)
for _ in $(seq 300); do grep -q "serving " "$tmp/ctrld.log" && break; sleep 0.1; done
grep -q "serving " "$tmp/ctrld.log" || fail "ctrld did not serve"
for pat in "model $tmp/model: " "ready: region $region" "loading stage 0: " "loaded stage 0 in " "joined as stage 0 of 1"; do
  grep -qF "<6>kvferry-worker[stage0]: $pat" "$tmp/worker.log" || fail "'$pat' is not <6>"
done
kill -TERM "$wpid"
wait "$wpid"
grep -q "^<6>kvferry-worker\[stage0\]: stopping: " "$tmp/worker.log" || fail "the stopping line is not <6>"
if grep -v "^<[0-7]>" "$tmp/worker.log" | grep -q .; then fail "a line without a priority"; fi
echo "ok    a served worker's progress lines are <6>, and every line has a priority"
