#!/usr/bin/env bash
# Two kvferry-dataplane processes and two dp_client processes.
#   dp_integration.sh memif|memif-impair|restart|afpacket|outage|outage-afpacket|lanes|pcrc-mismatch|queues-refused[-inplace] DATAPLANE CLIENT
# A mode ending in -inplace (or DP_RXIP=1) runs both dataplanes with rx_in_place = yes,
# any other with rx_in_place = no (the default, auto, depends on the region).
# Needs root (hugepages, namespaces); reserves 2 MiB hugepages itself and
# exits 77 when it cannot.
set -u
mode=$1 dp=$2 cli=$3
N=${DP_IT_COUNT:-100000}
rxip=${DP_RXIP:-0} zc=${DP_ZC:-0}
case $mode in *-inplace) rxip=1 mode=${mode%-inplace} ;; esac
# a mode ending in -auto: no rx_in_place flag, the default (auto) chooses:
# in place on hugepages (these regions have room), reassembled without
rxauto=0
case $mode in *-auto) rxauto=1 mode=${mode%-auto} ;; esac
# a mode ending in -zc (or DP_ZC=1): node 2 is a zero-copy memif client
case $mode in *-zc) zc=1 mode=${mode%-zc} ;; esac
# killed-clients: its 2 MiB sender's pools beside the verified sender's
[ "$mode" = killed-clients ] && export DP_REGION_MIB=${DP_REGION_MIB:-480}
# held: the held KV pages' sender's pools beside the other streams' sender's
[ "$mode" = held ] && export DP_REGION_MIB=${DP_REGION_MIB:-480}

skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root (hugepages, network namespaces)"
# two regions, both nodes' mbuf pools (frames of DP_MEMIF_FRAME), and room
need=$(( ${DP_REGION_MIB:-320} + ${DP_MBUFS:-4095} * (${DP_MEMIF_FRAME:-9000} + 2048) / 1048576 + 300 ))
[ $need -lt 640 ] && need=640
hp() { awk "/$1/{print \$2}" /proc/meminfo; }
if [ "$(hp HugePages_Free)" -lt $need ]; then
  echo $(( $(hp HugePages_Total) + need - $(hp HugePages_Free) )) > /proc/sys/vm/nr_hugepages 2>/dev/null
fi
# DP_NOHUGE=1 (a machine without hugepages, e.g. a GPU host): the
# dataplanes run with DPDK's --no-huge and their regions fall back to shared
# memory, as kvferry-dataplane does by itself; otherwise the test skips.
# KVF_DP_EAL adds EAL flags to both (e.g. "-d DIR" for drivers not installed).
nohuge=""
if [ "$(hp HugePages_Free)" -lt $need ]; then
  [ "${DP_NOHUGE:-0}" = 1 ] || skip "cannot reserve $need hugepages of 2 MiB (DP_NOHUGE=1 runs without them)"
  nohuge="--no-huge -m 1024"
  echo "note: no $need free hugepages: the dataplanes run with --no-huge, regions in shared memory"
else
  mountpoint -q /dev/hugepages || { mkdir -p /dev/hugepages; mount -t hugetlbfs none /dev/hugepages; } \
    || skip "cannot mount hugetlbfs on /dev/hugepages"
fi
eal_more="$nohuge ${KVF_DP_EAL:-}"

tmp=$(mktemp -d /tmp/kvfdp.XXXXXX)
tag=$$
ra=kvfitA$tag rb=kvfitB$tag
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -f /dev/hugepages/*"$ra"* /dev/hugepages/*"$rb"* /dev/shm/*"$ra"* /dev/shm/*"$rb"* 2>/dev/null
  ip netns del kvfA$tag 2>/dev/null; ip netns del kvfB$tag 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 143' TERM INT

# DP_IDLE=poll DP_FIXED=BYTES DP_IMPAIR=... turn a run into a benchmark (scripts/dp-bench)
mbufs=${DP_MBUFS:-4095}
common=(--idle-mode "${DP_IDLE:-sleep}" --mbufs "$mbufs" --region-size "${DP_REGION_MIB:-320}")
inplace=(--rx-in-place=no)
[ "$rxip" = 1 ] && inplace=(--rx-in-place=yes)
[ "$rxauto" = 1 ] && inplace=()
common+=(${inplace[@]+"${inplace[@]}"})
fixed=() verify=()
[ -n "${DP_FIXED:-}" ] && fixed=(--fixed "$DP_FIXED") verify=(--no-verify)
nsA=() nsB=()
case $mode in
  memif|memif-impair|restart|outage|lanes|pcrc-mismatch|queues-refused|hangup|server-restart|killed-clients|held)
    # DP_MEMIF_FRAME: frames of that size, in memif buffers that hold one
    frame=${DP_MEMIF_FRAME:-9000}
    bs=$(( (frame + 1023) / 1024 * 1024 )); [ $bs -gt 65535 ] && bs=65535
    # DP_MEMIF_EXTRA: more net_memif devargs on both ends (e.g. ",rsize=9")
    portA="net_memif0,role=server,socket=$tmp/memif.sock,bsize=$bs${DP_MEMIF_EXTRA:-}"
    portB="net_memif0,role=client,socket=$tmp/memif.sock,bsize=$bs${DP_MEMIF_EXTRA:-}"
    if [ "$zc" = 1 ]; then
      # zero-copy client: the server's PMD copies straight into B's mbufs;
      # B's dataplane itself keeps its mbufs one file per segment list and
      # copies what it sends (region memory is not in what memif lends)
      portB="$portB,zero-copy=yes"
    elif [ "$rxauto" = 1 ]; then
      # the defaults: a memif client names no zero-copy= and is a zero-copy one
      zc=1
    else
      portB="$portB,zero-copy=no"
    fi ;;
  afpacket|outage-afpacket)
    command -v ip >/dev/null || skip "iproute2 missing"
    ip netns add kvfA$tag && ip netns add kvfB$tag || skip "cannot create network namespaces"
    ip link add vA$tag type veth peer name vB$tag || skip "cannot create a veth pair"
    ip link set vA$tag netns kvfA$tag; ip link set vB$tag netns kvfB$tag
    ip -n kvfA$tag link set vA$tag mtu 9000 up; ip -n kvfB$tag link set vB$tag mtu 9000 up
    nsA=(ip netns exec kvfA$tag) nsB=(ip netns exec kvfB$tag)
    # DP_AFP_QPAIRS: a socket (queue pair) each for that many EAL lcores
    portA="net_af_packet0,iface=vA$tag,blocksz=16384,framesz=${AFP_FRAMESZ:-8192},framecnt=1024,qpairs=${DP_AFP_QPAIRS:-1}"
    portB="net_af_packet0,iface=vB$tag,blocksz=16384,framesz=${AFP_FRAMESZ:-8192},framecnt=1024,qpairs=${DP_AFP_QPAIRS:-1}"
    # tpacket slots must be a power of two here: 9000 B frames in 9472 B
    # slots never left the kernel TX ring on this machine (DPDK 22.11)
    frame=${AFP_FRAME:-8000} ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac
imp=()
[ "$mode" = memif-impair ] && imp=(--impair loss=0.05,dup=0.05,reorder=0.05,corrupt=0.05,seed=7)
[ -n "${DP_IMPAIR:-}" ] && imp=(--impair "$DP_IMPAIR")
# --impair arms the test-only outage signals (SIGUSR1 drops all input until SIGUSR2)
[ -z "${mode##outage*}" ] && imp=(--impair loss=0,outage=5)

# DP_LCORES_A / DP_LCORES_B: the EAL's -l of each node (default 0 and 1; more
# lcores give a memif port a queue pair each, the workers' TX queues)
for c in $(echo "${DP_LCORES_A:-0},${DP_LCORES_B:-1}" | tr ',' ' '); do
  [ "$c" -lt "$(nproc)" ] || skip "lcore $c asked for, but this machine has $(nproc) CPUs"
done
ealA="-l ${DP_LCORES_A:-0} $eal_more"
ealB=${ealB:-"-l ${DP_LCORES_B:-1} $eal_more"} extraB=(${extraB[@]+"${extraB[@]}"})
startB() { # $1: extra args
  "${nsB[@]}" "$dp" --node-id 2 --port "$portB" --ip 10.9.0.2 --peer 1=10.9.0.1 --region "$rb" \
    --frame-size $frame --eal "$ealB" "${common[@]}" ${extraB[@]+"${extraB[@]}"} "${imp[@]}" "$@" >>"$tmp/B.log" 2>&1 &
  pidB=$!; pids+=($pidB)
}
extraA=()
# node 1 insists on payload CRCs over memif, node 2 keeps auto (off there)
[ "$mode" = pcrc-mismatch ] && extraA=(--payload-crc yes)
: >"$tmp/A.log"
startA() {
  "${nsA[@]}" "$dp" --node-id 1 --port "$portA" --ip 10.9.0.1 --peer 2=10.9.0.2 --region "$ra" \
    --frame-size $frame --eal "$ealA" "${common[@]}" "${imp[@]}" ${extraA[@]+"${extraA[@]}"} >>"$tmp/A.log" 2>&1 &
  pidA=$!; pids+=($pidA)
}
startA
if [ -n "${portA##net_af_packet*}" ]; then
  # memif: the client connects only once the server's socket exists
  for _ in $(seq 100); do [ -S "$tmp/memif.sock" ] && break; sleep 0.1; done
  # a file socket in this 0700 directory, not one in the abstract namespace
  # that any local user could connect to
  if [ ! -S "$tmp/memif.sock" ] || ss -xl 2>/dev/null | grep -qF "@$tmp/memif.sock"; then
    echo "FAIL: the memif control socket is not a file socket in $tmp"; ss -xl | grep memif; exit 1
  fi
  echo "ok    the memif control socket is a file socket in the test's own 0700 directory"
fi
if [ "$mode" = hangup ]; then
  # Clients that hang up during the handshake: a process that connects to
  # the server's socket and closes at once (a probe), and a client dataplane
  # stopped at random points of its start. net_memif's failed HELLO left a
  # closed fd with the EAL's interrupt thread, which aborted the server
  # (dataplane/memif_guard.c). The server must serve on and meet B below.
  python3 - "$tmp/memif.sock" <<'PY' || { echo "FAIL: could not connect to the memif socket"; exit 1; }
import socket, sys, time
for _ in range(10):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(sys.argv[1])
    s.close()
    time.sleep(0.02)
PY
  sleep 0.3
  kill -0 $pidA 2>/dev/null || { echo "FAIL: the memif server died when a client hung up at once"; cat "$tmp/A.log"; exit 1; }
  echo "ok    10 connections to the memif socket closed at once: the server serves on"
  for k in $(seq 12); do
    startB
    sleep "0.$(( (k * 37) % 50 + 1 ))"
    kill $pidB; wait $pidB 2>/dev/null
    kill -0 $pidA 2>/dev/null || { echo "FAIL: the memif server died when client $k stopped during its start"; cat "$tmp/A.log"; exit 1; }
  done
  echo "ok    12 client dataplanes stopped at points of their start: the server serves on"
fi
# the stopped clients met A too: below, only the last B's meeting counts
metB0=$(grep -c "peer 1 up" "$tmp/B.log" 2>/dev/null)
met() { grep -q "peer 2 up" "$tmp/A.log" && [ "$(grep -c "peer 1 up" "$tmp/B.log")" -gt "${metB0:-0}" ]; }
startB
if [ "$mode" = queues-refused ]; then
  # a memif client with more queue pairs (lcores) than its server: the
  # server refuses its rings, so the link never comes up; the client must
  # say so and name the fix rather than reconnect in silence
  for _ in $(seq 100); do grep -q "give both dataplanes the same number of EAL lcores" "$tmp/B.log" && break; sleep 0.1; done
  grep -q "give both dataplanes the same number of EAL lcores" "$tmp/B.log" \
    || { echo "FAIL: the client with more queue pairs than its server did not name the fix"; cat "$tmp/A.log" "$tmp/B.log"; exit 1; }
  ! grep -q "peer 2 up" "$tmp/A.log" || { echo "FAIL: a link came up with pairs the server does not have"; exit 1; }
  grep -m1 "give both dataplanes" "$tmp/B.log"
  echo "PASS: a memif client with more queue pairs than its server is refused and says to give both the same lcores"
  exit 0
fi
# Wait until A has heard B; a memif client that raced the server's listen()
# exits at once, so start it again.
for i in $(seq 100); do
  met && break
  if ! kill -0 $pidB 2>/dev/null; then
    startB
  fi
  sleep 0.1
done
met || { echo "FAIL: the dataplanes never met"; cat "$tmp/A.log" "$tmp/B.log"; exit 1; }

fail() { echo "FAIL: $*"; echo "--- A.log"; cat "$tmp/A.log"; echo "--- B.log"; cat "$tmp/B.log"; exit 1; }

if [ "$rxauto" = 1 ]; then
  if [ "$zc" = 1 ]; then
    # B, a memif client by default a zero-copy one, receives in the mbufs the
    # server's driver wrote (its EAL memory: no region area needed)
    grep -q "rx in place (the mbufs the memif server wrote" "$tmp/B.log" \
      || fail "B, a memif client with the defaults, is not a zero-copy client receiving in place"
    echo "ok    by default a memif client is a zero-copy one and receives in place where the server's driver wrote"
  fi
  for f in A B; do
    [ "$f" = B ] && [ "$zc" = 1 ] && continue
    if [ -z "$nohuge" ]; then
      grep -q "rx in place (region mbufs)" "$tmp/$f.log" \
        || fail "$f, on hugepages with room in its region, does not receive in place by default (rx_in_place = auto)"
    else
      grep -q "receiving reassembled (rx_in_place = auto): it needs the region '[^']*' on hugepages" "$tmp/$f.log" \
        || fail "$f, without hugepages, did not say why it receives reassembled (rx_in_place = auto)"
    fi
  done
  [ -z "$nohuge" ] && rxip=1
  echo "ok    by default (rx_in_place = auto) the dataplanes receive $([ "$rxip" = 1 ] && echo "in place: on hugepages" || echo "reassembled: no hugepages, and they say so")"
fi

if [ "$mode" = killed-clients ]; then
  # The client (a zero-copy one in killed-clients-zc-inplace) killed 8 times
  # while the server sends 2 MiB messages at full rate: net_memif's teardown
  # unmapped the client's memory under a TX burst still copying into it and
  # the server died of SIGSEGV (memif_guard.c: the burst gate).
  "$cli" --region "$ra" --send --peer 2 --streams 4 --until-stop --inflight 128 --fixed 2097152 --no-verify \
    --pools kill --timeout 120 >"$tmp/send-k.log" 2>&1 &
  pk=$!; pids+=($pk)
  for k in $(seq 8); do
    "$cli" --region "$rb" --recv --peer 1 --until-stop --no-verify --timeout 120 >"$tmp/recv-k.log" 2>&1 &
    pr=$!; pids+=($pr)
    sleep "1.$(( (k * 37) % 9 ))"
    met0=$(grep -c "peer 1 \(up\|restarted\)" "$tmp/B.log")
    kill -9 $pidB; wait $pidB 2>/dev/null
    kill $pr; wait $pr 2>/dev/null
    sleep 0.3
    kill -0 $pidA 2>/dev/null || fail "the memif server died when its client was killed mid-stream (kill $k)"
    startB
    for _ in $(seq 150); do
      [ "$(grep -c "peer 1 \(up\|restarted\)" "$tmp/B.log")" -gt "$met0" ] && break
      sleep 0.1
    done
  done
  "$cli" --region "$rb" --recv --peer 1 --until-stop --no-verify --timeout 120 >"$tmp/recv-k.log" 2>&1 &
  pr=$!; pids+=($pr)
  kill -TERM $pk; wait $pk
  # what the stopped sender left queued at node 1 drains to a receiver
  sleep 3
  kill $pr; wait $pr 2>/dev/null
  kill -0 $pidA 2>/dev/null || fail "the memif server died when its client was killed mid-stream"
  echo "ok    the client killed 8 times mid-stream: the server lived on ($(sed -n 's/^send: \([0-9]* ok, [0-9]* failed\).*/\1/p' "$tmp/send-k.log"))"
  # once more with no sender: the stopped sender's messages still queued at
  # node 1 fail with the old client, and the exchange below starts clean
  met0=$(grep -c "peer 1 \(up\|restarted\)" "$tmp/B.log")
  kill -9 $pidB; wait $pidB 2>/dev/null
  startB
  for _ in $(seq 150); do
    [ "$(grep -c "peer 1 \(up\|restarted\)" "$tmp/B.log")" -gt "$met0" ] && break
    sleep 0.1
  done
fi

if [ "$mode" = server-restart ]; then
  # The memif server (node 1) stops and starts again, twice, the second time
  # killed: the client (node 2, a zero-copy one in server-restart-zc) must
  # meet each new server by itself. A zero-copy client lent its memory by
  # fds its driver had closed, so it never came back (memif_guard.c).
  for how in TERM KILL; do
    met0=$(grep -c "peer 1 \(up\|restarted\)" "$tmp/B.log")
    kill -$how $pidA; wait $pidA 2>/dev/null
    # the restarted dataplane makes its region again (the sender attaches below)
    common=(--idle-mode "${DP_IDLE:-sleep}" --mbufs "$mbufs" --region-size "${DP_REGION_MIB:-320}" \
            ${inplace[@]+"${inplace[@]}"})
    startA
    for _ in $(seq 150); do
      [ "$(grep -c "peer 1 \(up\|restarted\)" "$tmp/B.log")" -gt "$met0" ] && break
      sleep 0.1
    done
    [ "$(grep -c "peer 1 \(up\|restarted\)" "$tmp/B.log")" -gt "$met0" ] \
      || fail "the memif client did not meet its server again within 15 s after SIG$how"
    kill -0 $pidB 2>/dev/null || fail "the memif client died when its server stopped (SIG$how)"
    echo "ok    the server stopped (SIG$how) and started again: the client met the new one"
  done
  grep -q "called rx_pkt_burst for not ready port" "$tmp/B.log" && fail "the client polled its port while it was stopped"
fi

if [ "$mode" = restart ]; then
  "$cli" --region "$rb" --recv --peer 1 --until-stop --no-verify --timeout 120 >"$tmp/recv.log" 2>&1 &
  pr=$!; pids+=($pr)
  "$cli" --region "$ra" --send --peer 2 --streams 2 --until-stop --inflight 64 --timeout 60 \
    >"$tmp/send.log" 2>&1 &
  ps_=$!; pids+=($ps_)
  sleep 4
  kill -9 $pidB; wait $pidB 2>/dev/null
  echo "killed dataplane B mid-stream"
  sleep 0.3
  # The restarted dataplane attaches to the region its predecessor created.
  common=(--idle-mode sleep --mbufs "$mbufs" ${inplace[@]+"${inplace[@]}"})
  startB
  sleep 5
  kill -TERM $ps_; wait $ps_; rc=$?
  cat "$tmp/send.log"
  [ $rc = 0 ] || fail "sender saw out-of-order completions or unreported failures"
  grep -q "^event type [23] peer 2" "$tmp/send.log" || fail "no restart/dead event for peer 2"
  failed=$(sed -n 's/^send: [0-9]* ok, \([0-9]*\) failed.*/\1/p' "$tmp/send.log")
  [ "${failed:-0}" -ge 1 ] || fail "no in-flight message was reported failed"
  ok_at=$(grep -m1 "^event type [23] peer 2" "$tmp/send.log" | sed 's/.*ok_so_far \([0-9]*\).*/\1/')
  ok_end=$(sed -n 's/^send: \([0-9]*\) ok.*/\1/p' "$tmp/send.log")
  [ "$ok_end" -gt "$ok_at" ] || fail "no message completed after the restart ($ok_at then $ok_end)"
  if [[ "${DP_LCORES_A:-0}" == *,* && "${DP_LCORES_B:-1}" == *,* ]]; then
    # node 1's worker lcores went back to queue 0 when the link dropped, and
    # took the streams again once the restarted peer's hello named its pairs
    [ "$(grep -c "^dataplane 1: [2-9] queue pairs in use" "$tmp/A.log")" -ge 2 ] \
      || fail "node 1 did not use the worker lcores' queue pairs again after its peer restarted"
    echo "ok    node 1's worker lcores' queue pairs: given up with the link, used again with the restarted peer"
  fi
  if [ "$rxip" = 1 ] && [ "$zc" = 1 ]; then
    # B's successor receives into new memory: its consumer maps that anew
    kill -TERM $pr; wait $pr
    maps=$(sed -n "s/^recv: the dataplane's packet memory mapped \([0-9]*\) times; \([0-9]*\) .*/\1 \2/p" "$tmp/recv.log")
    [ "${maps%% *}" -ge 2 ] 2>/dev/null \
      || fail "the receiver did not map the restarted zero-copy client's packet memory anew (${maps:-never mapped})"
    echo "ok    the receiver mapped each zero-copy client's packet memory in turn (${maps%% *} maps, ${maps#* } lists not valid across the restart)"
  fi
  echo "PASS: restart detected, $failed in-flight reported failed, $((ok_end - ok_at)) completed after"
  exit 0
fi

if [ -z "${mode##outage*}" ]; then
  "$cli" --region "$rb" --recv --peer 1 --until-stop --no-verify --timeout 120 >"$tmp/recv.log" 2>&1 &
  pr=$!; pids+=($pr)
  "$cli" --region "$ra" --send --peer 2 --streams 2 --until-stop --inflight 64 --timeout 60 \
    >"$tmp/send.log" 2>&1 &
  ps_=$!; pids+=($ps_)
  # traffic both ways, as between two pipeline stages: both ends time out
  "$cli" --region "$ra" --recv --peer 2 --until-stop --no-verify --timeout 120 >"$tmp/recv2.log" 2>&1 &
  pids+=($!)
  "$cli" --region "$rb" --send --peer 1 --streams 1 --until-stop --inflight 8 --timeout 60 \
    >"$tmp/send2.log" 2>&1 &
  ps2=$!; pids+=($ps2)
  sleep 2
  # 100% loss both ways for 5 s, far longer than the silence bound (0.6 s)
  # and the ~1.4 s in which the retransmissions used to give up. The
  # dataplanes end it themselves (impair outage=5): a script's sleep on the
  # loaded 2-core machine stretched it to 14-25 s, past the 10 s give-up.
  kill -USR1 $pidA $pidB
  echo "$(date +%T.%N) outage: both dataplanes drop every frame for 5 s"
  sleep 5
  echo "$(date +%T.%N) outage over (by the dataplanes' clocks)"
  ok_at=$(grep "^event type 4 peer 2" "$tmp/send.log" | tail -1 | sed 's/.*ok_so_far \([0-9]*\).*/\1/')
  ok2_at=$(grep "^event type 4 peer 1" "$tmp/send2.log" | tail -1 | sed 's/.*ok_so_far \([0-9]*\).*/\1/')
  sleep 5
  kill -TERM $ps_ $ps2; wait $ps_; rc=$?; wait $ps2; rc2=$?
  echo "$(date +%T.%N) senders stopped"
  cat "$tmp/send.log" "$tmp/send2.log"
  grep -v '^EAL\|^TELEMETRY' "$tmp/A.log" "$tmp/B.log"
  [ $rc = 0 ] && [ $rc2 = 0 ] || fail "a sender saw out-of-order completions or unreported failures"
  [ -n "$ok_at" ] || fail "node 1 never reported peer 2 silent during the outage"
  [ -n "$ok2_at" ] || fail "node 2 never reported peer 1 silent during the outage"
  # the session outlives the outage: no end gives up, nothing in flight fails
  ! grep -q "^event type [23] " "$tmp/send.log" "$tmp/send2.log" \
    || fail "a session was given up or restarted over an outage shorter than 10 s"
  failed=$(sed -n 's/^send: [0-9]* ok, \([0-9]*\) failed.*/\1/p' "$tmp/send.log")
  [ "${failed:-0}" = 0 ] || fail "$failed in-flight messages were failed over the outage"
  ok2_end=$(sed -n 's/^send: \([0-9]*\) ok.*/\1/p' "$tmp/send2.log")
  [ "$ok2_end" -gt "$ok2_at" ] || fail "traffic from node 2 did not resume ($ok2_at then $ok2_end)"
  ok_end=$(sed -n 's/^send: \([0-9]*\) ok.*/\1/p' "$tmp/send.log")
  [ "$ok_end" -gt $((ok_at + 100)) ] || fail "traffic did not resume after the outage ($ok_at then $ok_end)"
  echo "PASS: peer reported silent, nothing failed, $((ok_end - ok_at)) completed after in the same session ($mode)"
  exit 0
fi

if [ "$mode" = pcrc-mismatch ]; then
  # node 1 sends CRCs (node 2 checks what it is given), node 2 sends none:
  # node 1 refuses its frames and says which setting to align
  "$cli" --region "$rb" --recv --peer 1 --count 200 --seed 3 --timeout 20 >"$tmp/recv.log" 2>&1 &
  pr=$!; pids+=($pr)
  for _ in $(seq 250); do grep -q "^recv: ready" "$tmp/recv.log" 2>/dev/null && break; sleep 0.02; done
  "$cli" --region "$ra" --send --peer 2 --count 200 --seed 3 --timeout 20 >"$tmp/send.log" 2>&1 \
    || fail "node 1 (payload CRC on) could not send to node 2 (auto): $(cat "$tmp/send.log")"
  wait $pr || fail "node 2 did not receive node 1's CRC'd frames: $(cat "$tmp/recv.log")"
  "$cli" --region "$rb" --send --peer 1 --count 5 --fixed 20000 --inflight 5 --timeout 3 >"$tmp/send2.log" 2>&1 \
    && fail "node 1 accepted frames without the payload CRC it requires"
  grep -q "node 2 sends data frames without a payload CRC, which this node requires: give both nodes the same \[dp\] payload_crc" \
    "$tmp/A.log" || fail "no error naming payload_crc on node 1"
  grep "without a payload CRC" "$tmp/A.log"
  echo "PASS: a payload_crc mismatch is refused with an error naming the setting; the other direction works"
  exit 0
fi

if [ "$mode" = lanes ]; then
  # Senders killed at random points, most often inside their send loop
  # (an enqueue on their lane, a pool get or put, a completion dequeue):
  # 200 of them one after another, KV pages on their own pools, beside one
  # sender that streams micro-batches the whole time. Each sender has its
  # own send lane, so no death may stall the survivor (it gives up after
  # 10 s without a completion); the dataplane frees each dead sender's lane
  # once its sends completed, and gives back the buffers it held; afterwards
  # every lane is free or held by a live process, every buffer of the dead
  # senders' pools is free, the survivor's messages all arrived once, and a
  # new sender (on a lane a dead one had) never sees another's completion.
  kills=${DP_LANE_KILLS:-200}
  "$cli" --region "$rb" --recv --peer 1 --until-stop --no-verify --timeout 120 >"$tmp/recv.log" 2>&1 &
  pr=$!; pids+=($pr)
  "$cli" --region "$rb" --recv --peer 1 --type kv --until-stop --no-verify --timeout 120 >"$tmp/recv-kv.log" 2>&1 &
  prk=$!; pids+=($prk)
  "$cli" --region "$ra" --send --peer 2 --until-stop --drain --inflight 16 --timeout 10 >"$tmp/send.log" 2>&1 &
  ps_=$!; pids+=($ps_)
  for k in $(seq "$kills"); do
    "$cli" --region "$ra" --send --peer 2 --type kv --pools vic --until-stop --inflight 8 --no-verify \
      --fixed $(( (k % 7 + 1) * 9000 )) >>"$tmp/victims.log" 2>&1 &
    v=$!
    sleep "0.0$(( RANDOM % 5 + 1 ))$(( RANDOM % 10 ))"
    kill -9 $v; wait $v 2>/dev/null
    kill -0 $ps_ 2>/dev/null || fail "the surviving sender stopped after $k kills: $(tail -3 "$tmp/send.log")"
  done
  echo "killed $kills senders at random points"
  freed=0
  for _ in $(seq 50); do
    "$cli" --region "$ra" --check-lanes >"$tmp/lanes.log" 2>&1 && break
    sleep 0.1
  done
  cat "$tmp/lanes.log"
  grep -q "held, 0 by dead" "$tmp/lanes.log" || fail "a dead sender's lane was never freed"
  freed=$(grep -c "send lane [0-9]* of dead pid" "$tmp/A.log")
  [ "$freed" -ge $((kills / 2)) ] || fail "only $freed of $kills killed senders had their lane freed: they died before sending?"
  "$cli" --region "$ra" --send --peer 2 --type kv --pools vic --count 200 --inflight 8 --no-verify \
    --timeout 10 >"$tmp/after.log" 2>&1 || fail "a sender started after the kills did not get through: $(cat "$tmp/after.log")"
  kill -TERM $ps_; wait $ps_; rc=$?
  sleep 1
  kill -TERM $pr $prk; wait $pr; wait $prk
  cat "$tmp/send.log" "$tmp/recv.log" "$tmp/recv-kv.log"
  [ $rc = 0 ] || fail "the surviving sender saw a stall, out-of-order completions or failures"
  vict=$(sed -n 's/^recv: \([0-9]*\) messages.*/\1/p' "$tmp/recv-kv.log")
  [ "${vict:-0}" -gt $((kills * 2)) ] || fail "the killed senders got only ${vict:-0} messages through: they were not sending when killed"
  sent=$(sed -n 's/^send: \([0-9]*\) ok, 0 failed.*/\1/p' "$tmp/send.log")
  got=$(sed -n 's/^recv: \([0-9]*\) messages.*/\1/p' "$tmp/recv.log")
  [ -n "$sent" ] && [ "$sent" = "$got" ] || fail "the survivor's $sent messages arrived $got times"
  "$cli" --region "$ra" --check-pools --pools vic >"$tmp/pools.log" 2>&1; pc=$?
  cat "$tmp/pools.log"
  [ $pc = 0 ] || fail "buffers of the killed senders missing from their pools"
  back=$(sed -n 's/.*freed, \([0-9]*\) buffers\{0,1\} it held.*/\1/p' "$tmp/A.log" | awk '{s += $1} END {print s + 0}')
  [ "$back" -gt 0 ] || fail "the dataplane gave back no buffer of the killed senders (they held none in flight?)"
  echo "PASS: $kills senders killed at random points: the survivor's $sent messages arrived once each," \
    "it never stalled; $freed dead senders' lanes freed once their sends completed, $back buffers they held" \
    "given back by the dataplane; every buffer free; a new sender never saw another's completion"
  exit 0
fi

if [ "$mode" = held ]; then
  # Received in place, a consumer that takes KV pages and never gives them
  # back holds frames of the receive pool. Once what it holds is the whole
  # budget of messages in place, the dataplane must reassemble the next
  # messages by copy instead, the held ring's and every other's: no stream
  # may wait on another's consumer (before, each next message was refused
  # for want of frames, and resent forever).
  [ "$rxip" = 1 ] || fail "mode held needs rx_in_place (held-inplace)"
  "$cli" --region "$rb" --recv --peer 1 --type kv --count 12 --seed 5 --fixed 2000000 --hold --timeout 60 >"$tmp/recv-kv.log" 2>&1 &
  ph=$!; pids+=($ph)
  for _ in $(seq 250); do grep -q "^recv: ready" "$tmp/recv-kv.log" 2>/dev/null && break; sleep 0.02; done
  "$cli" --region "$ra" --send --peer 2 --type kv --pools kvh --count 12 --seed 5 --fixed 2000000 --inflight 12 --timeout 60 \
    >"$tmp/send-kv.log" 2>&1 || fail "KV pages to a consumer that holds them stalled: $(tail -2 "$tmp/send-kv.log")"
  for _ in $(seq 500); do grep -q "^recv: holding" "$tmp/recv-kv.log" && break; sleep 0.02; done
  cat "$tmp/recv-kv.log"
  kv_ip=$(sed -n 's/^recv: holding 12 messages (\([0-9]*\) received in place).*/\1/p' "$tmp/recv-kv.log")
  [ -n "$kv_ip" ] || fail "the holding consumer did not get its 12 KV pages"
  [ "$kv_ip" -gt 0 ] && [ "$kv_ip" -lt 12 ] \
    || fail "$kv_ip of 12 held 2 MB pages were in place: the budget should hold some, not all (mbufs $mbufs)"
  # meanwhile every other stream goes on, exactly once, in order
  "$cli" --region "$rb" --recv --peer 1 --streams 4 --count 5000 --seed 42 --timeout 60 >"$tmp/recv.log" 2>&1 &
  pr=$!; pids+=($pr)
  for _ in $(seq 250); do grep -q "^recv: ready" "$tmp/recv.log" 2>/dev/null && break; sleep 0.02; done
  "$cli" --region "$ra" --send --peer 2 --streams 4 --count 5000 --seed 42 --inflight 128 --timeout 60 \
    >"$tmp/send.log" 2>&1 || fail "other streams stalled while a consumer held the budget: $(tail -2 "$tmp/send.log")"
  wait $pr || fail "other streams' messages were lost or out of order: $(tail -3 "$tmp/recv.log")"
  # given back, messages are in place again
  kill -TERM $ph; wait $ph || fail "the holding consumer failed: $(tail -3 "$tmp/recv-kv.log")"
  "$cli" --region "$rb" --recv --peer 1 --count 200 --seed 43 --timeout 30 >"$tmp/recv2.log" 2>&1 &
  pr=$!; pids+=($pr)
  for _ in $(seq 250); do grep -q "^recv: ready" "$tmp/recv2.log" 2>/dev/null && break; sleep 0.02; done
  "$cli" --region "$ra" --send --peer 2 --count 200 --seed 43 --inflight 64 --timeout 30 >"$tmp/send2.log" 2>&1 \
    || fail "sending after the consumer gave its pages back failed"
  wait $pr || fail "receiving after the consumer gave its pages back failed: $(tail -3 "$tmp/recv2.log")"
  grep -q "^recv: 200 of 200 messages received in place" "$tmp/recv2.log" \
    || fail "messages were not in place again once the frames came back: $(grep "in place" "$tmp/recv2.log")"
  kill -TERM $pidB; wait $pidB
  copied=$(sed -n 's/.*; \([0-9]*\) reassembled while the consumers held them all.*/\1/p' "$tmp/B.log")
  [ "${copied:-0}" -gt 0 ] || fail "the dataplane reports no message reassembled while the budget was held"
  echo "PASS: a consumer holding 12 KV pages ($kv_ip of them in place, the rest reassembled once the frames" \
    "were all held) stalls nothing: 5000 messages of 4 other streams arrived once each, in order" \
    "(${copied} messages reassembled meanwhile); given back, the next 200 were in place again"
  exit 0
fi

# DP_CLI_CPUS_S / _R: the sending / receiving client's CPUs (taskset -c; default: anywhere)
pinS=() pinR=()
[ -n "${DP_CLI_CPUS_S:-}" ] && pinS=(taskset -c "$DP_CLI_CPUS_S")
[ -n "${DP_CLI_CPUS_R:-}" ] && pinR=(taskset -c "$DP_CLI_CPUS_R")
${pinR[@]+"${pinR[@]}"} "$cli" --region "$rb" --recv --peer 1 --streams "${DP_STREAMS:-4}" --count "$N" --seed 42 --timeout 60 \
  "${fixed[@]}" "${verify[@]}" >"$tmp/recv.log" 2>&1 &
pr=$!; pids+=($pr)
# the receiver has read its dataplane's copy counters before any byte comes
for _ in $(seq 250); do grep -q "^recv: ready" "$tmp/recv.log" 2>/dev/null && break; sleep 0.02; done
# DP_CRCS=1: the sender gives each frame's payload CRC, computed where it
# writes the message (dp_ipc.h, DP_TX_CRCS); DP_CRCS=stale: at a stride that
# is not the dataplane's (one that restarted with another frame size), which
# it must refuse and compute the CRCs itself; DP_CRCS=nomagic: behind a
# trailer without its magic (a buffer some other writer left), refused too
crcs=()
[ "${DP_CRCS:-0}" = 1 ] && crcs=(--crcs)
[ "${DP_CRCS:-0}" = stale ] && crcs=(--crcs-stride 4000)
[ "${DP_CRCS:-0}" = nomagic ] && crcs=(--crcs-nomagic)
${pinS[@]+"${pinS[@]}"} "$cli" --region "$ra" --send --peer 2 --streams "${DP_STREAMS:-4}" --count "$N" --seed 42 --inflight 128 --timeout 60 \
  "${fixed[@]}" "${verify[@]}" ${crcs[@]+"${crcs[@]}"} >"$tmp/send.log" 2>&1
rs=$?
wait $pr; rr=$?
demux=ok
# (not in a benchmark run, DP_FIXED: dp-bench reads the main run's lines)
if [ "$mode" = memif ] && [ $rs = 0 ] && [ $rr = 0 ] && [ -z "${DP_FIXED:-}" ]; then
  # each stream to the process that owns it: KV pages and control messages
  # arrive (and complete) on their own rings, in order, byte-identical, while
  # a micro-batch receiver sees none of them
  for ty in kv ctl; do
    # received in place, the control ring's consumer does not read segment
    # lists: it must still get whole messages
    whole=()
    [ "$rxip" = 1 ] && [ $ty = ctl ] && whole=(--whole)
    "$cli" --region "$rb" --recv --peer 1 --streams 2 --count 300 --seed 7 --timeout 30 --type $ty \
      ${whole[@]+"${whole[@]}"} >"$tmp/recv-$ty.log" 2>&1 &
    prt=$!
    # it has declared what it reads before the first message comes
    for _ in $(seq 250); do grep -q "^recv: ready" "$tmp/recv-$ty.log" 2>/dev/null && break; sleep 0.02; done
    "$cli" --region "$ra" --send --peer 2 --streams 2 --count 300 --seed 7 --inflight 64 --timeout 30 \
      --type $ty >"$tmp/send-$ty.log" 2>&1 || demux="send --type $ty failed"
    wait $prt || demux="recv --type $ty failed"
    cat "$tmp/send-$ty.log" "$tmp/recv-$ty.log"
  done
  "$cli" --region "$rb" --recv --peer 1 --count 1 --timeout 1 >"$tmp/recv-none.log" 2>&1 \
    && demux="a micro-batch receiver got a KV page or control message"
  # A consumer killed after it dequeued messages and before it took them:
  # the dataplane passed each buffer to it before the enqueue, so the
  # reclaim of its pid gives them back (they were on no ring any more, and
  # held by the dataplane, until this was so). die_dequeued TAG WHO [ARGS]
  die_dequeued() {
    local tag=$1 who=$2; shift 2
    "$cli" --region "$rb" --recv --peer 1 --type kv "$@" --count 4 --die-dequeued 4 --timeout 30 \
      --fixed 200000 --no-verify >"$tmp/recv-$tag-die.log" 2>&1 &
    prd=$!
    for _ in $(seq 250); do grep -q "^recv: ready" "$tmp/recv-$tag-die.log" 2>/dev/null && break; sleep 0.02; done
    "$cli" --region "$ra" --send --peer 2 --type kv --count 4 --inflight 4 --timeout 30 --fixed 200000 \
      --no-verify >"$tmp/send-$tag-die.log" 2>&1 || demux="send to $who that dies failed"
    wait $prd
    cat "$tmp/recv-$tag-die.log"
    grep -q "killing myself before taking" "$tmp/recv-$tag-die.log" || demux="$who never dequeued its messages"
    for _ in $(seq 50); do
      "$cli" --region "$rb" --check-pools --pools dp.rxs,dp.rxl >"$tmp/pools-$tag.log" 2>&1 && break
      sleep 0.1
    done
    cat "$tmp/pools-$tag.log"
    "$cli" --region "$rb" --check-pools --pools dp.rxs,dp.rxl >/dev/null 2>&1 \
      || demux="buffers $who dequeued and died before taking were not given back"
  }
  # a stream routed to a consumer of its own (as a decode worker routes its
  # stage's pages), then the usual KV ring, whose consumer names itself its owner
  die_dequeued route "a routed consumer" --route
  die_dequeued own "a ring's owner"
  # and one replaced as the owner before the dataplane saw it dead (as a
  # ctrld killed and started again at once): given back by the holders' scan
  die_dequeued replaced "a ring's owner replaced by a live successor" --replaced
  # and the stream goes on to the usual ring once its consumer is gone
  "$cli" --region "$rb" --recv --peer 1 --count 20 --seed 9 --timeout 30 --type kv --whole \
    >"$tmp/recv-after-route.log" 2>&1 &
  prt=$!
  for _ in $(seq 250); do grep -q "^recv: ready" "$tmp/recv-after-route.log" 2>/dev/null && break; sleep 0.02; done
  "$cli" --region "$ra" --send --peer 2 --count 20 --seed 9 --inflight 8 --timeout 30 --type kv \
    >"$tmp/send-after-route.log" 2>&1 || demux="send after the routed consumer died failed"
  wait $prt || demux="KV pages after the routed consumer died did not arrive: $(tail -2 "$tmp/recv-after-route.log")"
  if [ "$rxip" = 1 ]; then
    grep -q "^recv: 300 of 300 messages received in place" "$tmp/recv-kv.log" || demux="KV pages not received in place"
    grep -q "^recv: 0 of 300 messages received in place" "$tmp/recv-ctl.log" \
      || demux="a consumer that reads no segment lists got one"
    # a consumer killed while it holds messages received in place: the
    # dataplane takes its buffers back, and with them their frames' mbufs
    "$cli" --region "$rb" --recv --peer 1 --count 4 --die-holding 4 --timeout 30 --fixed 200000 --no-verify \
      >"$tmp/recv-die.log" 2>&1 &
    prd=$!
    for _ in $(seq 250); do grep -q "^recv: ready" "$tmp/recv-die.log" 2>/dev/null && break; sleep 0.02; done
    "$cli" --region "$ra" --send --peer 2 --count 4 --inflight 4 --timeout 30 --fixed 200000 --no-verify \
      >"$tmp/send-die.log" 2>&1 || demux="send to a consumer that dies failed"
    wait $prd
    cat "$tmp/recv-die.log"
    grep -q "killing myself" "$tmp/recv-die.log" || demux="the dying consumer never held its messages"
    # by whichever reclaim sees it dead first: the holders' scan ("... it
    # held back") or the ring consumers' ("... it was handed back")
    dpid=$(sed -n 's/^recv: holding .*killing myself (pid \([0-9]*\)).*/\1/p' "$tmp/recv-die.log")
    back="pid ${dpid:-none} (dp_client) on this node died.* [1-9][0-9]* receive buffers\? it held back\|consumer of a receive ring, pid ${dpid:-none}, died: [1-9][0-9]* receive buffers\? it was handed back"
    for _ in $(seq 50); do grep -q "$back" "$tmp/B.log" && break; sleep 0.1; done
    grep -q "$back" "$tmp/B.log" || demux="the dead consumer's buffers were not taken back"
  fi
fi
big=ok
if [ "$rxip" = 1 ] && [ $rs = 0 ] && [ $rr = 0 ] && [ -z "${DP_FIXED:-}" ] && { [ "$mode" = memif ] || [ "$mode" = afpacket ]; }; then
  # Largest messages (4 MiB, the large pool's size) on five streams: the
  # frames kept for the streams' next messages leave less than one such
  # message outside the keep, yet each stream's next one must be offered
  # credit (it may take the whole budget). It was not, and the stream that
  # last received a large message never sent again.
  "$cli" --region "$rb" --recv --peer 1 --streams 5 --count 100 --fixed 4194304 --timeout 20 \
    >"$tmp/recv-big.log" 2>&1 &
  prb=$!
  for _ in $(seq 250); do grep -q "^recv: ready" "$tmp/recv-big.log" 2>/dev/null && break; sleep 0.02; done
  "$cli" --region "$ra" --send --peer 2 --streams 5 --count 100 --fixed 4194304 --inflight 40 --timeout 20 \
    >"$tmp/send-big.log" 2>&1 || big="send failed"
  wait $prb || big="recv failed"
  cat "$tmp/send-big.log" "$tmp/recv-big.log"
fi
kill -TERM $pidA $pidB
# a dataplane that ignores SIGTERM is a failure with its logs, not a hung test
for _ in $(seq 150); do kill -0 $pidA 2>/dev/null || kill -0 $pidB 2>/dev/null || break; sleep 0.1; done
hung=""
for p in $pidA $pidB; do kill -0 $p 2>/dev/null && { hung="$hung $p"; kill -9 $p; }; done
wait $pidA $pidB 2>/dev/null
cat "$tmp/send.log" "$tmp/recv.log" "$tmp/A.log" "$tmp/B.log" | grep -v '^EAL\|^TELEMETRY'
[ -z "$hung" ] || fail "dataplane(s)$hung still ran 15 s after SIGTERM"
[ $rs = 0 ] && [ $rr = 0 ] || fail "send rc $rs, recv rc $rr"
[ "$demux" = ok ] || fail "stream demux: $demux"
[ "$big" = ok ] || fail "largest messages on five streams, received in place: $big"
[ "$rxip" = 1 ] && [ -z "${DP_FIXED:-}" ] && { [ "$mode" = memif ] || [ "$mode" = afpacket ]; } \
  && echo "ok    received in place, every stream's next message is offered credit: 100 messages of 4 MiB on five streams"
[ "$mode" = memif ] && [ -z "${DP_FIXED:-}" ] && echo "ok    KV pages and control messages arrive and complete on their own rings"
if [ "$rxip" = 1 ]; then
  # every message went back (the dead consumer's through the reclaim), and
  # with it every frame it held
  grep -q "received in place: 0 messages still with their consumers, 0 of [0-9]* mbufs reserved" "$tmp/B.log" \
    || fail "receive buffers or mbufs held after every message was given back"
  echo "ok    received in place: nothing held once every consumer gave its messages back or died"
  [ "$mode" = memif ] && [ -z "${DP_FIXED:-}" ] && echo "ok    a consumer that reads no segment lists gets whole messages; one killed holding messages leaks nothing"
  if [ "$mode" = memif ] || [ "$mode" = memif-impair ]; then
    # Every message in place, but for those the liveness valve reassembled
    # when the consumers held every frame of the budget (a zero-copy
    # client's budget is smaller: its TX ring's mbufs are its own).
    ip=$(sed -n "s/^recv: \([0-9]*\) of $N messages received in place.*/\1/p" "$tmp/recv.log")
    valve=$(sed -n 's/.*; \([0-9]*\) reassembled while the consumers held them all.*/\1/p' "$tmp/B.log" | tail -n 1)
    [ -n "$ip" ] || fail "the receiver did not say how many messages were received in place"
    if [ $((N - ip)) -gt "${valve:-0}" ]; then
      fail "not every message was received in place: $ip of $N, and the valve reassembled only ${valve:-0}"
    fi
    if [ "$ip" -lt "$N" ]; then
      echo "note  $ip of $N messages in place; $((N - ip)) reassembled by the valve while the consumers held every frame"
    fi
  fi
fi
if [ "$mode" = memif ]; then
  # Copies per payload byte, counted by the dataplanes (dp_client prints
  # them): the sender's code copies nothing (header mbuf + the region's
  # bytes as an external buffer) and, over memif, reads none for a payload
  # CRC ([dp] payload_crc = auto: shared memory cannot damage a frame); the
  # receiver copies each accepted byte once, or none received in place;
  # net_memif copies once each way (resends and duplicates may add a little
  # there).
  python3 - "$tmp/send.log" "$tmp/recv.log" "$rxip" "$zc" <<'PY' || fail "copies per payload byte are not what the dataplane's design says"
import re, sys
def copies(path):
    for line in open(path):
        m = re.match(r"copies \w+: per payload byte: dataplane copy tx ([0-9.]+) rx ([0-9.]+), CRC pass ([0-9.]+), driver tx ([0-9.]+) rx ([0-9.]+)", line)
        if m:
            return [float(x) for x in m.groups()]
    sys.exit(f"no copies line in {path}")
s, r = copies(sys.argv[1]), copies(sys.argv[2])
in_place, zc = sys.argv[3] == "1", sys.argv[4] == "1"
# received in place the receiver's code copies nothing; reassembled, it
# copies each byte once; no payload CRC is read on either side over memif;
# to a zero-copy client the server's driver copies straight into the
# client's mbufs, and the client's driver copies nothing
rx_copy, rx_crc = (0, 0) if in_place else (1, 0)
# the driver copies a resent frame again: 0.01-0.03 a byte on a quiet
# machine, 0.06 seen under CI load; a second copy by design would be 2.0
DRV_MAX = 1.25
rx_drv = (0, 0.0001) if zc else (1, DRV_MAX)
ok = (s[0] == 0 and s[2] == 0 and 1 <= s[3] < DRV_MAX
      and abs(r[1] - rx_copy) < 0.002 and abs(r[2] - rx_crc) < 0.002 and rx_drv[0] <= r[4] < rx_drv[1])
total = s[0] + s[3] + r[1] + r[4]
# by design (one driver copy each way, or one to a zero-copy client; resends
# and duplicates aside): 2 received in place or to a zero-copy client, else 3
drivers = 1 if zc else 2
ok = ok and abs(s[0] + r[1] + drivers - ((2 if in_place else 3) - zc)) < 0.004
print(f"{'ok   ' if ok else 'FAIL '} copies per payload byte over memif{' received in place' if in_place else ''}{' to a zero-copy client' if zc else ''}: "
      f"sender code {s[0]:.3f} + CRC read {s[2]:.3f}, driver {s[3]:.3f}; "
      f"receiver code {r[1]:.3f} + CRC read {r[2]:.3f}, driver {r[4]:.3f}: {total:.2f} copies end to end "
      f"({'one by design: the server driver writes into the mbufs the consumer reads' if in_place and zc else 'goal <= 1.0 needs a zero-copy client received in place'})")
sys.exit(0 if ok else 1)
PY
fi
if [ "${DP_CRCS:-0}" != 0 ]; then
  # Where the payload CRC is on (af_packet; memif with damaged frames), a
  # sender that gives its CRCs spares its dataplane the pass over every byte
  # (its CRC read per payload byte ~0, against 1.0 without them); the
  # receiver checks them as any others (a wrong one is a damaged frame: the
  # message would never complete). A stale stride is refused and the
  # dataplane reads the bytes itself.
  python3 - "$tmp/send.log" "$N" "$DP_CRCS" <<'PY' || fail "the sender's payload CRCs were not used as the dataplane's design says"
import re, sys
t = open(sys.argv[1]).read()
n, how = int(sys.argv[2]), sys.argv[3]
m = re.search(r"copies send: per payload byte: dataplane copy tx [0-9.]+ rx [0-9.]+, CRC pass ([0-9.]+)", t)
g = re.search(r"send: (\d+) of (\d+) messages with their payload CRCs \(stride (\d+)\)", t)
if not m or not g:
    sys.exit("no copies or CRC line in the sender's log")
crc, given, sent, stride = float(m.group(1)), int(g.group(1)), int(g.group(2)), int(g.group(3))
if how == "1":
    ok = given == sent == n and stride > 0 and crc < 0.01
    print(f"{'ok   ' if ok else 'FAIL '} {given} of {n} messages sent with their producer's payload CRCs (stride {stride} B): "
          f"the sending dataplane read {crc:.3f} of each payload byte for CRCs (1.0 without them)")
else:
    ok = given == sent == n and (stride == 4000 if how == "stale" else stride > 0) and crc >= 0.99
    what = f"at a stale stride ({stride} B)" if how == "stale" else "behind a trailer without its magic"
    print(f"{'ok   ' if ok else 'FAIL '} {given} of {n} messages with CRCs {what}: refused, "
          f"the sending dataplane read {crc:.3f} of each payload byte for CRCs itself")
sys.exit(0 if ok else 1)
PY
  # the sending dataplane says why it refused them
  why=
  [ "$DP_CRCS" = stale ] && why="they are of another frame size"
  [ "$DP_CRCS" = nomagic ] && why="its trailer has no magic"
  [ -z "$why" ] || grep -q "a sender's payload CRCs (DP_TX_CRCS) refused, $why: computing them here instead" "$tmp/A.log" \
    || fail "the sending dataplane did not say why it refused the CRCs ($DP_CRCS): \"$why\" missing from its log"
fi
if [ "$mode" = memif-impair ] && [ -z "${DP_IMPAIR:-}" ]; then
  # the impairment must really have happened, on both directions
  grep -q "impair=[1-9]" "$tmp/B.log" && grep -q "impair=[1-9]" "$tmp/A.log" || fail "no impairment drops counted"
  grep -q "retransmits [1-9]" "$tmp/A.log" || fail "no retransmissions: the lossy path was not exercised"
fi
# More EAL lcores than one (DP_LCORES_A/_B): a queue pair per lcore, the
# worker lcores sending the streams' frames, on the pairs both ends have
# With a payload CRC ([dp] payload_crc: on over af_packet, or memif with
# corrupted frames) each worker fills in the CRCs of the frames it sends,
# reading each payload byte it hands its driver (and those of frames it
# dropped): at least the payload it sent. Without one, or given the
# sender's own (DP_CRCS=1), it reads none.
worker_crcs() {
  python3 - "$1" "$2" <<'PY' || fail "node 1's worker lcores did not compute the payload CRCs they should"
import re, sys
HLEN = 122  # Ethernet + IPv4 + UDP + kvferry headers (dp_wire.h DP_FRAME_HLEN)
m = re.search(r"TX queues sent (\d+) frames \((\d+) B\), dropped (\d+), read (\d+) payload bytes for CRCs", open(sys.argv[1]).read())
if not m:
    sys.exit("no worker totals in the log")
frames, sent, dropped, crc = (int(x) for x in m.groups())
payload = sent - frames * HLEN
ok = crc >= payload > 0 if sys.argv[2] == "on" else crc == 0 and payload > 0
print(f"{'ok   ' if ok else 'FAIL '} payload CRC {sys.argv[2]}: node 1's worker lcores read {crc} B for CRCs, sent {payload} B of payload")
sys.exit(0 if ok else 1)
PY
}
nqA=$(echo "${DP_LCORES_A:-0}" | tr ',' '\n' | wc -l) nqB=$(echo "${DP_LCORES_B:-1}" | tr ',' '\n' | wc -l)
if [[ $mode == memif || $mode == memif-impair ]] && [ -z "${DP_FIXED:-}" ] && [ $((nqA + nqB)) -gt 2 ]; then
  both=$((nqA < nqB ? nqA : nqB))
  if [ "$both" -gt 1 ]; then
    grep -q "^dataplane 1: $both queue pairs in use" "$tmp/A.log" && grep -q "^dataplane 2: $both queue pairs in use" "$tmp/B.log" \
      || fail "the dataplanes did not agree on $both queue pairs"
  else
    ! grep -q "queue pairs in use" "$tmp/A.log" "$tmp/B.log" || fail "a queue pair past the $both both ends have was used"
  fi
  kill -TERM $pidA; wait $pidA 2>/dev/null
  grep -q "queue pairs: $both in use of $nqA; the worker lcores' TX queues sent [$([ "$both" -gt 1 ] && echo 1-9 || echo 0)]" "$tmp/A.log" \
    || fail "node 1's worker lcores did not send what they should (queue pairs: $both of $nqA)"
  echo "ok    $nqA and $nqB lcores: $both queue pair(s) in use, $(sed -n "s/.*the worker lcores' TX queues \(sent [0-9]* frames\).*/\1/p" "$tmp/A.log") by node 1's worker lcores"
  [ "$both" -gt 1 ] && worker_crcs "$tmp/A.log" "$([ "$mode" = memif-impair ] && [ "${DP_CRCS:-0}" != 1 ] && echo on || echo off)"
elif [ "$mode" = afpacket ] && [ -z "${DP_FIXED:-}" ] && [ "$nqA" -gt 1 ] && [ "${DP_AFP_QPAIRS:-1}" -ge "$nqA" ]; then
  # net_af_packet's sockets are each end's own: every pair in use, whatever the peer has
  kill -TERM $pidA; wait $pidA 2>/dev/null
  grep -q "queue pairs: $nqA in use of $nqA; the worker lcores' TX queues sent [1-9]" "$tmp/A.log" \
    || fail "node 1's worker lcores did not send over their af_packet sockets"
  echo "ok    $nqA lcores, qpairs=${DP_AFP_QPAIRS}: $(sed -n "s/.*the worker lcores' TX queues \(sent [0-9]* frames\).*/\1/p" "$tmp/A.log") by node 1's worker lcores"
  worker_crcs "$tmp/A.log" "$([ "${DP_CRCS:-0}" != 1 ] && echo on || echo "given by the sender")"
elif [ "$mode" = afpacket ] && [ -z "${DP_FIXED:-}" ] && [ "$nqA" -gt "${DP_AFP_QPAIRS:-1}" ]; then
  # more lcores than the port has sockets: said, and named the fix; the
  # lcores past them send nothing, and the link works on what there is
  grep -q "dataplane: $nqA EAL lcores but net_af_packet has qpairs=${DP_AFP_QPAIRS:-1}: the lcores past it send nothing; give the port qpairs=$nqA" "$tmp/A.log" \
    || fail "node 1 did not warn that its net_af_packet port has fewer queue pairs than lcores"
  kill -TERM $pidA; wait $pidA 2>/dev/null
  if [ "${DP_AFP_QPAIRS:-1}" -le 1 ]; then
    ! grep -q "queue pairs: .* in use" "$tmp/A.log" || fail "node 1 used worker lcores its port has no socket for"
  fi
  echo "ok    $nqA lcores on qpairs=${DP_AFP_QPAIRS:-1}: warned, naming qpairs=$nqA"
fi
echo "PASS: $N messages exactly once, in order per stream, byte-identical ($mode$([ "$rxip" = 1 ] && echo ', received in place'))"
