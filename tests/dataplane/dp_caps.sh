#!/usr/bin/env bash
# A dataplane started as the packaged unit starts it (its own user, with
# CAP_NET_RAW and CAP_NET_ADMIN lent through the ambient set) drops them
# once its port is open, so that the consumers of its user may open
# /proc/PID/fd of it: a zero-copy memif client's packet memory is mapped
# that way, and a process whose permitted set is larger than the reader's
# refuses that (before: "Permission denied", and nothing received in place
# could be read under systemd).
#   dp_caps.sh DATAPLANE
set -u
dp=$1
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root (to start the dataplane as another user with capabilities)"
command -v setpriv >/dev/null || skip "setpriv (util-linux) missing"
user=65534
tmp=$(mktemp -d /tmp/kvfcaps.XXXXXX)
chmod 0777 "$tmp"
reg=kvfcaps$$ pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"; rm -f "/dev/shm/kvferry-$reg"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; grep -v '^EAL' "$tmp/dp.log"; exit 1; }
as_user() { setpriv --reuid=$user --regid=$user --clear-groups "$@"; }
# no hugepages for that user: the region falls back to shared memory, the EAL to --no-huge
setpriv --reuid=$user --regid=$user --clear-groups --inh-caps=-all,+net_raw,+net_admin --ambient-caps=-all,+net_raw,+net_admin \
  --bounding-set=-all,+net_raw,+net_admin env HOME="$tmp" XDG_RUNTIME_DIR="$tmp" \
  "$dp" --node-id 1 --port "net_memif0,role=server,socket=$tmp/memif.sock,bsize=9216" --ip 10.9.0.1 \
  --peer 2=10.9.0.2 --region "$reg" --region-size 64 --mbufs 1023 --rx-small 16:65536 --rx-large 4:1048576 \
  --idle-mode sleep --eal "-l 0 --no-huge -m 256" >"$tmp/dp.log" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q "capabilities dropped\|dropping its capabilities" "$tmp/dp.log" && break
  kill -0 $pid 2>/dev/null || fail "the dataplane did not start as user $user"; sleep 0.1; done
grep -q "dataplane: capabilities dropped, the port being open" "$tmp/dp.log" || fail "no word of its capabilities dropped"
prm=$(awk '/^CapPrm/ {print $2}' /proc/$pid/status)
[ "$prm" = 0000000000000000 ] || fail "its permitted capabilities are $prm after start"
as_user ls "/proc/$pid/fd" >"$tmp/fds" 2>&1 || fail "its own user cannot list /proc/$pid/fd: $(cat "$tmp/fds")"
fd=$(as_user ls "/proc/$pid/fd" | head -n1)
as_user cat "/proc/$pid/fdinfo/$fd" >/dev/null || fail "its own user cannot read /proc/$pid/fdinfo/$fd"
kill -0 $pid 2>/dev/null || fail "the dataplane stopped"
echo "PASS: started with CAP_NET_RAW and CAP_NET_ADMIN as user $user, the dataplane dropped them once its port" \
  "was open, and processes of its user may open its /proc/PID/fd (what a zero-copy client's consumers map)"
