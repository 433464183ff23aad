# Sourced by scripts/run, scripts/serve-bench and the serving tests: start
# and stop a kvferry serving topology on this one machine.
#
#   kvf_up TOPOLOGY STAGES     TOPOLOGY: dataplane (two nodes, two
#                              kvferry-dataplane processes joined by net_memif),
#                              netns (the same two nodes, each dataplane in its
#                              own network namespace, net_af_packet on a veth
#                              pair between them; root only) or shm (one node,
#                              worker processes over shm rings)
#   kvf_down                   SIGTERM everything started, in reverse order
#   kvf_ctrld_port LOG PID     the port a kvferry-ctrld started by the caller
#                              listens on, once its log names it
#
# Inputs (variables): KVF_BIN (build dir), KVF_MODEL, KVF_BACKEND (cpu|cuda),
# KVF_RUN (run dir for logs and sockets), KVF_THREADS (CPU threads per
# worker), KVF_PORT (ctrld's API port, default 0: any free one). Outputs:
# KVF_URL, KVF_SOCK, KVF_TOPOLOGY (what actually runs), KVF_PIDS, KVF_WPIDS
# (worker pids by stage), KVF_WCMD (worker command lines), KVF_CTRLD and
# KVF_CTRLD_CMD, KVF_DPPIDS and KVF_DPCMD (the dataplanes, by node - 1: each
# a quoted command line, for `eval "exec ${KVF_DPCMD[1]}" &`), so a caller
# can kill one process and start it again as its unit would.
#
# Node ids 1 and 2 talk over 10.9.0.0/24 addresses inside the memif link
# (the dataplane frames UDP/IPv4 itself; no kernel interface is involved).

KVF_PIDS=()
KVF_WPIDS=()
KVF_WCMD=()
KVF_DPPIDS=()
KVF_DPCMD=()

kvf_log() { echo "[run] $*"; }

# Reserve @1 free 2 MiB hugepages if we may; return 1 if they are not there.
kvf_hugepages() {
  local need=$1 free total
  free=$(awk '/HugePages_Free/{print $2}' /proc/meminfo)
  total=$(awk '/HugePages_Total/{print $2}' /proc/meminfo)
  if [ "${free:-0}" -lt "$need" ] && [ -w /proc/sys/vm/nr_hugepages ]; then
    echo $(( total + need - free )) > /proc/sys/vm/nr_hugepages 2>/dev/null || true
    free=$(awk '/HugePages_Free/{print $2}' /proc/meminfo)
  fi
  if ! mountpoint -q /dev/hugepages 2>/dev/null; then
    { mkdir -p /dev/hugepages && mount -t hugetlbfs none /dev/hugepages; } 2>/dev/null || return 1
  fi
  [ "${free:-0}" -ge "$need" ]
}

# Wait until @1 (a log file) contains @2, or @3 seconds pass.
kvf_wait_log() {
  local f=$1 pat=$2 t=${3:-60} i=0
  while [ $i -lt $((t * 10)) ]; do
    grep -q -- "$pat" "$f" 2>/dev/null && return 0
    sleep 0.1; i=$((i + 1))
  done
  return 1
}

# Wait until kvferry-ctrld (pid @2) names the port its API listens on in its
# log @1 (the first http://127.0.0.1:PORT there), 10 s at most; print the
# port. Return 1, printing why instead, when it exits first or names none.
kvf_ctrld_port() {
  local log=$1 pid=$2 port= i
  for ((i = 0; i < 100; i++)); do
    port=$(grep -o 'http://127.0.0.1:[0-9]*' "$log" | head -1 | cut -d: -f3)
    [ -n "$port" ] && { echo "$port"; return 0; }
    kill -0 "$pid" 2>/dev/null || { echo "kvferry-ctrld exited at start"; return 1; }
    sleep 0.1
  done
  echo "no listening line in the log"
  return 1
}

kvf_start_worker() { # stage region in out node
  local k=$1 r tp=()
  local cmd=("$KVF_BIN/kvferry-worker" --region "$2" --model "$KVF_MODEL" --in "$3" --out "$4"
             --role "stage$k" --node "$5" --backend "$KVF_BACKEND" --threads "$KVF_THREADS")
  # KVF_TP_STAGE=K KVF_TP=T: stage K runs as T ranks (tensor parallelism):
  # this worker is rank 0, ranks 1.. are started beside it (KVF_TPCMD[r],
  # KVF_TPPIDS[r], worker$k.tp$r.log); KVF_TP_GPUS=1 puts rank r on CUDA
  # device r (a machine with a GPU per rank: NCCL sums them)
  [ "${KVF_TP_STAGE:-}" = "$k" ] && [ "${KVF_TP:-1}" -gt 1 ] && tp=(--tp-size "$KVF_TP" --tp-rank 0)
  KVF_WCMD[$k]="${cmd[*]} ${tp[*]}"
  "${cmd[@]}" ${tp[@]+"${tp[@]}"} >>"$KVF_RUN/worker$k.log" 2>&1 &
  KVF_WPIDS[$k]=$!
  KVF_PIDS+=($!)
  for ((r = 1; ${#tp[@]} > 0 && r < KVF_TP; r++)); do
    local fc=("${cmd[@]}")
    fc[10]="stage$k.tp$r"
    [ "${KVF_TP_GPUS:-0}" = 1 ] && fc+=(--device "$r")
    KVF_TPCMD[$r]="${fc[*]} --tp-size $KVF_TP --tp-rank $r"
    "${fc[@]}" --tp-size "$KVF_TP" --tp-rank "$r" >>"$KVF_RUN/worker$k.tp$r.log" 2>&1 &
    KVF_TPPIDS[$r]=$!
    KVF_PIDS+=($!)
  done
}

kvf_up() {
  local topo=$1 stages=$2 tag=$$ m k
  KVF_TOPOLOGY=$topo
  KVF_SOCK=$KVF_RUN/ctrl.sock
  KVF_RA=kvfA$tag KVF_RB=kvfB$tag
  local ctrld_args=(--model-dir "$KVF_MODEL" --stages "$stages" --backend "$KVF_BACKEND" --port "${KVF_PORT:-0}"
                    --admin-socket "$KVF_SOCK" --threads "$KVF_THREADS" --kv-memory "${KVF_KV_MEMORY:-64M}" --worker-region "$KVF_RA"
                    --worker-join-timeout ${KVF_JOIN_TIMEOUT:-120} --worker-group-timeout "${KVF_GROUP_TIMEOUT:-30}")
  if [ "$topo" = dataplane ] || [ "$topo" = netns ]; then
    if [ "$(id -u)" != 0 ] || ! kvf_hugepages 160; then
      kvf_log "WARNING: no root or no 160 free 2 MiB hugepages for two dataplanes: falling back to" \
              "worker processes over shm rings on one node (reserve hugepages: echo 512 >" \
              "/proc/sys/vm/nr_hugepages)"
      topo=shm KVF_TOPOLOGY=shm
    fi
  fi
  if [ "$topo" = netns ] && ! kvf_netns "$tag"; then
    kvf_log "WARNING: cannot create two network namespaces joined by a veth pair: using net_memif"
    topo=dataplane KVF_TOPOLOGY=dataplane
  fi
  if [ "$topo" != shm ] && [ "$stages" -lt 2 ]; then
    kvf_log "1 stage: nothing crosses nodes, so it runs on one node over shm rings"
    topo=shm KVF_TOPOLOGY=shm
  fi
  if [ "$topo" != shm ]; then
    kvf_dataplanes "$topo" || return 1
    # Stages 0..m-1 on node 1, m..n-1 on node 2; ctrld on node 1.
    m=$(( (stages + 1) / 2 ))
    for ((k = 0; k < stages; k++)); do
      local in out
      if [ $k -lt $m ]; then
        in="ring:serve.s$k.in"
        if [ $k -eq $((m - 1)) ]; then out="peer:2"; else out="ring:serve.s$((k + 1)).in"; fi
        kvf_start_worker $k "$KVF_RA" "$in" "$out" 1
      else
        if [ $k -eq $m ]; then in=dp; else in="ring:serve.s$k.in"; fi
        if [ $k -eq $((stages - 1)) ]; then out="peer:1"; else out="ring:serve.s$((k + 1)).in"; fi
        kvf_start_worker $k "$KVF_RB" "$in" "$out" 2
      fi
    done
    ctrld_args+=(--worker-return dataplane)
  else
    rm -f /dev/hugepages/*"$KVF_RA"* /dev/shm/*"$KVF_RA"* 2>/dev/null
    for ((k = 0; k < stages; k++)); do
      local out="ring:serve.s$((k + 1)).in"
      [ $k -eq $((stages - 1)) ] && out="ring:serve.ret"
      kvf_start_worker $k "$KVF_RA" "ring:serve.s$k.in" "$out" -1
    done
    ctrld_args+=(--worker-return ring --worker-region-size "${KVF_WREGION_SIZE:-64M}")
  fi
  # KVF_CTRLD_EXTRA: more ctrld flags (word-split), e.g. "--kv-mem-fraction 0.05"
  # shellcheck disable=SC2206
  [ -n "${KVF_CTRLD_EXTRA:-}" ] && ctrld_args+=($KVF_CTRLD_EXTRA)
  KVF_CTRLD_CMD=("$KVF_BIN/kvferry-ctrld" "${ctrld_args[@]}")
  "${KVF_CTRLD_CMD[@]}" >"$KVF_RUN/ctrld.log" 2>&1 &
  KVF_CTRLD=$!
  KVF_PIDS+=($!)
  if ! kvf_wait_log "$KVF_RUN/ctrld.log" "serving " 150; then
    kvf_log "kvferry-ctrld did not start serving:"; cat "$KVF_RUN/ctrld.log"
    for ((k = 0; k < stages; k++)); do echo "--- worker$k.log"; cat "$KVF_RUN/worker$k.log"; done
    return 1
  fi
  # the line may still be being written when "serving " shows
  for _ in $(seq 100); do
    KVF_URL=$(sed -n 's/.* on \(http:\/\/[^,]*\), admin.*/\1/p' "$KVF_RUN/ctrld.log" | head -n1)
    [ -n "$KVF_URL" ] && break
    sleep 0.02
  done
  KVF_MODEL_NAME=$(sed -n 's/.*serving \([^ ]*\) (.*/\1/p' "$KVF_RUN/ctrld.log" | head -n1)
  return 0
}

# Two kvferry-dataplane processes, node 1 on region KVF_RA and node 2 on
# KVF_RB, joined by net_memif (@1 = dataplane) or by net_af_packet on the
# veth pair kvf_netns made (@1 = netns). KVF_DP_REGION (MiB, default 96) and
# KVF_DP_EXTRA (more flags for both, e.g. --impair ...) adjust them;
# KVF_AFP_EXTRA (e.g. ",qdisc_bypass=0", so tc qdiscs on the veth see the
# frames) is appended to the af_packet port spec. KVF_DP_EAL adds DPDK EAL
# flags after each one's core (e.g. "--no-huge -m 1024 -d DIR" on a machine
# with no hugepages whose DPDK drivers are not installed: the regions then
# fall back to shared memory files).
kvf_dataplanes() {
  local topo=$1 f
  # shellcheck disable=SC2206 # KVF_DP_EXTRA is a list of flags
  local dpc=(--idle-mode sleep --mbufs 4095 --region-size "${KVF_DP_REGION:-96}" --rx-small 128:65536
             --rx-large 16:1048576 ${KVF_DP_EXTRA:-})
  local portA portB nsA=() nsB=()
  if [ "$topo" = netns ]; then
    # Only the dataplanes live in the namespaces: the regions are files under
    # /dev/hugepages, which namespaces of the network do not separate, so the
    # workers and ctrld of each node share its region as on one host.
    nsA=(ip netns exec "$KVF_NSA") nsB=(ip netns exec "$KVF_NSB")
    portA="net_af_packet0,iface=$KVF_VA,blocksz=16384,framesz=8192,framecnt=1024,qpairs=1${KVF_AFP_EXTRA:-}"
    portB="net_af_packet0,iface=$KVF_VB,blocksz=16384,framesz=8192,framecnt=1024,qpairs=1${KVF_AFP_EXTRA:-}"
    # af_packet: frames fit the 8192 B tpacket slots (tests/dataplane's setting)
    dpc+=(--frame-size 8000)
  else
    portA="net_memif0,role=server,socket=$KVF_RUN/memif.sock,bsize=9216"
    portB="net_memif0,role=client,socket=$KVF_RUN/memif.sock,bsize=9216${KVF_MEMIF_B_EXTRA:-}"
    dpc+=(--frame-size 9000)
  fi
  local dp0=("${nsA[@]}" "$KVF_BIN/kvferry-dataplane" --node-id 1 --ip 10.9.0.1 --peer 2=10.9.0.2 --region "$KVF_RA"
       --port "$portA" --eal "-l 0 ${KVF_DP_EAL:-}" "${dpc[@]}")
  KVF_DPCMD[0]=$(printf '%q ' "${dp0[@]}")
  "${dp0[@]}" >"$KVF_RUN/dataplane1.log" 2>&1 &
  KVF_PIDS+=($!) KVF_DPPIDS[0]=$!
  # The memif client connects to the server's socket: start it once that exists.
  kvf_wait_log "$KVF_RUN/dataplane1.log" "memory:" 30 || { kvf_log "kvferry-dataplane (node 1) did not start:"; cat "$KVF_RUN/dataplane1.log"; return 1; }
  local dp1=("${nsB[@]}" "$KVF_BIN/kvferry-dataplane" --node-id 2 --ip 10.9.0.2 --peer 1=10.9.0.1 --region "$KVF_RB"
       --port "$portB" --eal "-l 1 ${KVF_DP_EAL:-}" "${dpc[@]}")
  KVF_DPCMD[1]=$(printf '%q ' "${dp1[@]}")
  "${dp1[@]}" >"$KVF_RUN/dataplane2.log" 2>&1 &
  KVF_PIDS+=($!) KVF_DPPIDS[1]=$!
  for f in dataplane1 dataplane2; do
    kvf_wait_log "$KVF_RUN/$f.log" "memory:" 30 || { kvf_log "kvferry-dataplane ($f) did not start:"; cat "$KVF_RUN/$f.log"; return 1; }
  done
}

# Two network namespaces joined by a veth pair (9000 B MTU) for the netns
# topology; sets KVF_NSA/KVF_NSB and KVF_VA/KVF_VB. Return 1 if we may not.
# With KVF_RELAY (a command), the pair is two: node 1's end and node 2's each
# face a third namespace KVF_NSR, where the command runs with the two
# interfaces there as its last arguments and carries the frames between
# them (scripts/fault-drill's stand-in for tc netem on a kernel without it).
kvf_netns() {
  local tag=$1 peerA
  KVF_NSA=kvfnsA$tag KVF_NSB=kvfnsB$tag KVF_VA=kvfvA$tag KVF_VB=kvfvB$tag
  command -v ip >/dev/null || return 1
  ip netns add "$KVF_NSA" 2>/dev/null || return 1
  ip netns add "$KVF_NSB" 2>/dev/null || { ip netns del "$KVF_NSA"; return 1; }
  peerA=$KVF_VB
  if [ -n "${KVF_RELAY:-}" ]; then
    KVF_NSR=kvfnsR$tag peerA=kvfrA$tag
    ip netns add "$KVF_NSR" 2>/dev/null && ip link add "$KVF_VB" type veth peer name "kvfrB$tag" 2>/dev/null \
      || { ip netns del "$KVF_NSA"; ip netns del "$KVF_NSB"; ip netns del "$KVF_NSR" 2>/dev/null; return 1; }
  fi
  if ! ip link add "$KVF_VA" type veth peer name "$peerA" 2>/dev/null; then
    ip netns del "$KVF_NSA"; ip netns del "$KVF_NSB"; [ -n "${KVF_NSR:-}" ] && ip netns del "$KVF_NSR"
    return 1
  fi
  ip link set "$KVF_VA" netns "$KVF_NSA" && ip link set "$KVF_VB" netns "$KVF_NSB" \
    && ip -n "$KVF_NSA" link set "$KVF_VA" mtu 9000 up && ip -n "$KVF_NSB" link set "$KVF_VB" mtu 9000 up \
    || return 1
  [ -n "${KVF_RELAY:-}" ] || return 0
  local r
  for r in "kvfrA$tag" "kvfrB$tag"; do
    ip link set "$r" netns "$KVF_NSR" && ip -n "$KVF_NSR" link set "$r" mtu 9000 up || return 1
  done
  # shellcheck disable=SC2086 # KVF_RELAY is a command line
  ip netns exec "$KVF_NSR" $KVF_RELAY "kvfrA$tag" "kvfrB$tag" >>"$KVF_RUN/relay.log" 2>&1 &
  KVF_PIDS+=($!)
}

kvf_down() {
  # Callers may run under `set -e`: a process that already exited must not
  # stop the others from being signalled.
  local i
  for ((i = ${#KVF_PIDS[@]} - 1; i >= 0; i--)); do
    kill -TERM "${KVF_PIDS[$i]}" 2>/dev/null || true
    # ctrld first, so it drains before its workers go
    if [ "${KVF_PIDS[$i]}" = "${KVF_CTRLD:-}" ]; then wait "${KVF_PIDS[$i]}" 2>/dev/null || true; fi
  done
  # only ours: a caller's own background jobs (a log follower) keep running
  for ((i = 0; i < ${#KVF_PIDS[@]}; i++)); do wait "${KVF_PIDS[$i]}" 2>/dev/null || true; done
  rm -f /dev/hugepages/*"${KVF_RA:-none}"* /dev/hugepages/*"${KVF_RB:-none}"* \
        /dev/shm/*"${KVF_RA:-none}"* /dev/shm/*"${KVF_RB:-none}"* 2>/dev/null
  # deleting a namespace deletes the veth end inside it, and with it the pair
  [ -n "${KVF_NSA:-}" ] && { ip netns del "$KVF_NSA" 2>/dev/null; ip netns del "$KVF_NSB" 2>/dev/null; }
  [ -n "${KVF_NSR:-}" ] && ip netns del "$KVF_NSR" 2>/dev/null
  KVF_NSA= KVF_NSB= KVF_NSR=
  KVF_PIDS=() KVF_DPPIDS=()
}

# kvf_reap PID: wait until a SIGKILLed child is gone (polled: once in ~25
# quick PD drills on the 2-vCPU VM, "kill -9; wait PID" came back ~10 s after
# the kill although the process was gone from /proc within 2 s, turning
# "back in 1 s" into an outage past the rooms' 10 s give-up). A process
# that takes over 2 s to go has its state and kernel stacks sampled into
# dying.PID.txt in the run directory; KVF_REAP_S says how long it took.
kvf_reap() {
  local p=$1 t0 k t
  t0=$(date +%s.%N)
  for ((k = 0; k < 300; k++)); do
    kill -0 "$p" 2>/dev/null || break
    if [ "$k" -ge 20 ] && [ $((k % 5)) = 0 ]; then
      { echo "t+$((k / 10)).$((k % 10)) s"; grep -E "^(State|Threads)" "/proc/$p/status"
        for t in /proc/"$p"/task/*; do echo "$t wchan $(cat "$t/wchan")"; cat "$t/stack"; done; } \
        >>"$KVF_RUN/dying.$p.txt" 2>&1 || true
    fi
    sleep 0.1
  done
  KVF_REAP_S=$(python3 -c "print('%.2f' % ($(date +%s.%N) - $t0))")
}
