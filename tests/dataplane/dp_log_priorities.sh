#!/usr/bin/env bash
# kvferry-dataplane under systemd (JOURNAL_STREAM set) starts each stderr
# line with its syslog priority, <3> error, <4> warning, <6> info, DPDK's
# own EAL lines included (at their rte_log level less one), so `journalctl
# -p err` shows a failed start; in a terminal or a log file the lines stay
# plain. A refused option needs nothing; running the daemon needs root and
# hugepages (DPDK's EAL), and exits 77 without them.
#   dp_log_priorities.sh KVFERRY_DATAPLANE
set -u
dp=$1
tmp=$(mktemp -d /tmp/kvf-dplog-XXXXXX)
region=kvfdplog$$
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null
  wait 2>/dev/null
  rm -f /dev/hugepages/*"$region"* /dev/shm/*"$region"* 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$tmp"/*.log; do echo "--- $f"; cat "$f"; done; exit 1; }
skip() { echo "SKIP: $*"; exit 77; }

JOURNAL_STREAM=8:12345 env -u KVFERRY_CONFIG "$dp" --node-id 64 --port net_null0 --region r >"$tmp/cfg.log" 2>&1
[ $? = 2 ] || fail "--node-id 64 was not refused"
grep -q "^<3>kvferry-dataplane: .*'node_id' is out of range" "$tmp/cfg.log" || fail "a refused option is not <3>"
env -u JOURNAL_STREAM -u KVFERRY_CONFIG "$dp" --node-id 64 --port net_null0 --region r >"$tmp/plain.log" 2>&1
grep -q "^kvferry-dataplane: .*'node_id' is out of range" "$tmp/plain.log" || fail "a terminal got a priority prefix"
rm -f "$tmp"/*.log
echo "ok    a refused option is <3> in the journal, plain in a terminal"

[ "$(id -u)" = 0 ] || skip "running the dataplane needs root (hugepages)"
need=96
hp() { awk "/$1/{print \$2}" /proc/meminfo; }
if [ "$(hp HugePages_Free)" -lt $need ]; then
  echo $(( $(hp HugePages_Total) + need - $(hp HugePages_Free) )) > /proc/sys/vm/nr_hugepages 2>/dev/null
fi
[ "$(hp HugePages_Free)" -ge $need ] || skip "cannot reserve $need hugepages of 2 MiB"
mountpoint -q /dev/hugepages || { mkdir -p /dev/hugepages && mount -t hugetlbfs none /dev/hugepages; } \
  || skip "cannot mount hugetlbfs on /dev/hugepages"
small=(--region-size 32 --rx-small 16:65536 --rx-large 4:1048576 --mbufs 1023 --idle-mode sleep --eal "-l 0")

# a port that does not exist: DPDK's EAL says why (its level, err), then we do
JOURNAL_STREAM=8:12345 env -u KVFERRY_CONFIG "$dp" --node-id 1 --port net_bogus0 --region "$region" "${small[@]}" \
  >"$tmp/eal.log" 2>&1 && fail "started on a bogus port"
grep -q "^<3>EAL: .*net_bogus0" "$tmp/eal.log" || fail "DPDK's own error is not <3>"
grep -q "^<3>rte_eal_init(net_bogus0) failed" "$tmp/eal.log" || fail "the EAL failure is not <3>"
if grep -v "^<[0-7]>" "$tmp/eal.log" | grep -q .; then fail "a line without a priority"; fi
rm -f /dev/hugepages/*"$region"* /dev/shm/*"$region"* 2>/dev/null
echo "ok    a failed start is <3>, DPDK's own lines included"

# a running node on a null port: start-up and stop lines are <6>
JOURNAL_STREAM=8:12345 env -u KVFERRY_CONFIG "$dp" --node-id 1 --port net_null0 --region "$region" "${small[@]}" \
  >"$tmp/run.log" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q "memory:" "$tmp/run.log" && break; sleep 0.1; done
grep -q "^<6>dataplane 1: port 0 (net_null0)" "$tmp/run.log" || fail "the start-up line is not <6>"
grep -q "^<6>  memory: " "$tmp/run.log" || fail "the start-up line's second line is not <6>"
kill -TERM "$pid"
wait "$pid"
pid=
grep -q "^<6>dataplane 1: stopping" "$tmp/run.log" || fail "the stopping line is not <6>"
grep -q "^<6>  unattributed drops:" "$tmp/run.log" || fail "the stop's counters are not <6>"
if grep -v "^<[0-7]>" "$tmp/run.log" | grep -q .; then fail "a line without a priority"; fi
rm -f /dev/hugepages/*"$region"* /dev/shm/*"$region"* 2>/dev/null

# the same run without JOURNAL_STREAM: not one prefix
env -u JOURNAL_STREAM -u KVFERRY_CONFIG "$dp" --node-id 1 --port net_null0 --region "$region" "${small[@]}" \
  >"$tmp/plain.log" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q "memory:" "$tmp/plain.log" && break; sleep 0.1; done
kill -TERM "$pid"
wait "$pid"
pid=
grep -q "^dataplane 1: port 0 (net_null0)" "$tmp/plain.log" || fail "no plain start-up line"
grep -q "^dataplane 1: stopping" "$tmp/plain.log" || fail "no plain stopping line"
if grep -q "^<[0-7]>" "$tmp/plain.log"; then fail "a terminal got a priority prefix"; fi
echo "ok    a running dataplane's lines are <6> in the journal, plain in a terminal"
