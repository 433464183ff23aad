#!/usr/bin/env bash
# A region too small for a worker's output buffers ends ctrld's start at
# once, naming the stage, the area and the settings to change: the worker
# answers its refused join from a small area of its own. (It used to find
# no room to answer in, so ctrld waited out worker_join_timeout with
# nothing in its log but the layer ranges.)
#   worker_region_too_small.sh KVFERRY_WORKER KVFERRY_CTRLD KVFERRY_MKMODEL
set -u
worker=$1 ctrld=$2 mk=$3
tmp=$(mktemp -d /tmp/kvf-wksmall-XXXXXX)
region=kvfwksmall$$
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -f /dev/hugepages/*"$region"* /dev/shm/*"$region"* 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$tmp"/*.log; do echo "--- $f"; cat "$f"; done; exit 1; }

"$mk" --out "$tmp/model" --preset tiny >/dev/null || fail "kvferry-mkmodel"
# 512-column micro-batches: each worker wants ~6 MB of output buffers; the region has 2 MiB
t0=$(date +%s.%N)
env -u JOURNAL_STREAM -u KVFERRY_CONFIG "$ctrld" --config /dev/null --model-dir "$tmp/model" --stages 2 --backend cpu \
  --port 0 --admin-socket "$tmp/ctrl.sock" --threads 1 --kv-memory 1M --worker-region "$region" \
  --worker-region-size 2M --worker-return ring --worker-join-timeout 60 --plans 8,512 --mb-k 512 >"$tmp/ctrld.log" 2>&1 &
cpid=$!
pids+=($cpid)
for _ in $(seq 100); do [ -e "/dev/shm/$region" ] || ls /dev/hugepages/*"$region"* >/dev/null 2>&1 && break; sleep 0.05; done
for k in 0 1; do
  out="ring:serve.s$((k + 1)).in"; [ $k = 1 ] && out="ring:serve.ret"
  env -u JOURNAL_STREAM -u KVFERRY_CONFIG "$worker" --config /dev/null --region "$region" --model "$tmp/model" \
    --in "ring:serve.s$k.in" --out "$out" --role "stage$k" --threads 1 >"$tmp/worker$k.log" 2>&1 &
  pids+=($!)
done
for _ in $(seq 300); do kill -0 "$cpid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$cpid" 2>/dev/null && fail "ctrld still waits 30 s after the workers refused the join (worker_join_timeout 60)"
wait "$cpid"
rc=$?
dt=$(python3 -c "import sys, time; print('%.1f' % (time.time() - float(sys.argv[1])))" "$t0")
[ "$rc" != 0 ] || fail "ctrld exited 0 without serving"
grep -q "refused the join: area serve.stage[01].out of [0-9]* B does not fit" "$tmp/ctrld.log" \
  || fail "ctrld's log does not name the area that did not fit"
grep -q "region_size" "$tmp/ctrld.log" || fail "ctrld's log does not name the setting to raise"
echo "ok    ctrld gave up after ${dt} s (exit $rc): $(grep -o 'stage [01] ([^)]*) refused the join.*' "$tmp/ctrld.log" | head -n1 | cut -c1-160)..."
echo "PASS: a region too small for the workers ends ctrld's start at once, naming it"
