#!/usr/bin/env bash
# An idle link's peer that goes away is reported: two kvferry-dataplane
# processes over net_memif, nothing sent between them; the second is frozen
# (SIGSTOP): within DP_PEER_SILENT_MS (0.6 s) + slack the first reports it
# silent (after five pauses of 0.1 s that must raise no alarm) (a DP_EV_PEER_SILENT event, which ctrld takes as its stages lost);
# thawed, it is up again; killed, silent again.
#   dp_silent.sh BUILD SOURCE
# Needs root and hugepages: exits 77 without.
set -u
B=$1 S=$2
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root (hugepages)"
# shellcheck source=scripts/serve-lib.sh
. "$S/scripts/serve-lib.sh"
kvf_hugepages 120 || skip "cannot reserve 120 hugepages of 2 MiB"
KVF_RUN=$(mktemp -d /tmp/kvfsil.XXXXXX) KVF_BIN=$B KVF_RA=kvfsilA$$ KVF_RB=kvfsilB$$
trap 'kill -CONT "${KVF_PIDS[1]:-0}" 2>/dev/null; kvf_down; rm -rf "$KVF_RUN"' EXIT
KVF_DP_REGION=48
kvf_dataplanes dataplane || { echo "FAIL: the dataplanes did not start"; exit 1; }
log=$KVF_RUN/dataplane1.log
kvf_wait_log "$log" "peer 2 up" 20 || { echo "FAIL: node 1 never heard node 2"; cat "$log"; exit 1; }
b=${KVF_PIDS[1]}
# count lines matching @2 in @1 until there are @3 of them, for up to @4 s
wait_count() {
  local i=0
  while [ $i -lt $(($4 * 10)) ]; do
    [ "$(grep -c -- "$2" "$1")" -ge "$3" ] && return 0
    sleep 0.1; i=$((i + 1))
  done
  return 1
}
fail=0
# Short pauses (a descheduled process, a GC-like stall) are no alarm: five
# freezes of 0.1 s, 1 s apart, leave at most ~0.4 s without a frame (the
# last keepalive up to 0.3 s before), under the 0.6 s bound.
for _ in 1 2 3 4 5; do kill -STOP "$b"; sleep 0.1; kill -CONT "$b"; sleep 1; done
if grep -q "peer 2 silent" "$log"; then
  echo "FAIL: a peer paused for 0.1 s was reported silent"; fail=1
else
  echo "ok    five pauses of 0.1 s raise no alarm"
fi
kill -STOP "$b"
t0=$(date +%s.%N)
if wait_count "$log" "peer 2 silent" 1 8; then
  dt=$(python3 -c "import sys; print('%.1f' % (float(sys.argv[2]) - float(sys.argv[1])))" "$t0" "$(date +%s.%N)")
  echo "ok    a frozen peer on an idle link is reported silent after $dt s (DP_PEER_SILENT_MS 600)"
  # its last keepalive may have come up to 0.3 s before it froze
  python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) >= 0.3 else 1)" "$dt" \
    || { echo "FAIL: reported after $dt s, before 0.6 s of silence"; fail=1; }
else
  echo "FAIL: a frozen peer was not reported within 8 s"; fail=1
fi
kill -CONT "$b"
if wait_count "$log" "peer 2 up" 2 5; then
  echo "ok    thawed, it is up again (same incarnation)"
else
  echo "FAIL: the thawed peer was not reported up"; fail=1
fi
kill -KILL "$b"
if wait_count "$log" "peer 2 silent" 2 8; then
  echo "ok    killed, it is reported silent again"
else
  echo "FAIL: a killed peer was not reported"; fail=1
fi
[ $fail = 0 ] || { tail -n 20 "$log"; exit 1; }
echo "PASS"
