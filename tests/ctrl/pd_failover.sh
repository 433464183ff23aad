#!/usr/bin/env bash
# Two prefill nodes and one decode node, each a kvferry-ctrld with its own
# kvferry-dataplane in its own network namespace, the three joined by a
# bridge (af_packet on veth pairs). Requests to the decode node spread over
# both prefill nodes; then prefill node 1 is frozen and killed with rooms in
# flight: exactly its rooms fail, naming it, within the heartbeat's interval
# x failures (at once when its connections are refused or reset); the rooms
# on node 3 finish; the decode node goes on serving through node 3 alone,
# every answer equal to node 3's own co-located one.
#   pd_failover.sh BUILD SOURCE
# Needs root (hugepages, namespaces): exits 77 without.
set -u
B=$1 S=$2
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root (hugepages, network namespaces)"
command -v ip >/dev/null || skip "no ip(8)"
# shellcheck source=scripts/serve-lib.sh
. "$S/scripts/serve-lib.sh"
kvf_hugepages 320 || skip "cannot reserve 320 hugepages of 2 MiB"
KVF_RUN=$(mktemp -d /tmp/kvfpf.XXXXXX) KVF_BIN=$B
tag=$$ R1=kvfpf1$$ R2=kvfpf2$$ R3=kvfpf3$$
NS=(kvfpfA$tag kvfpfB$tag kvfpfC$tag) SW=kvfpfS$tag
cleanup() {
  kvf_down
  for n in "${NS[@]}" "$SW"; do ip netns del "$n" 2>/dev/null; done
  rm -f /dev/hugepages/*kvfpf?"$tag"* /dev/shm/*kvfpf?"$tag"* 2>/dev/null
  rm -rf "$KVF_RUN"
}
trap cleanup EXIT

# Three namespaces, a veth from each into a bridge in a fourth.
ip netns add "$SW" 2>/dev/null || skip "cannot create network namespaces"
ip -n "$SW" link add br0 type bridge && ip -n "$SW" link set br0 mtu 9000 up || skip "cannot create a bridge"
for i in 0 1 2; do
  ip netns add "${NS[$i]}" || skip "cannot create network namespaces"
  ip link add "kvfpfv$i$tag" type veth peer name "kvfpfw$i$tag" || skip "cannot create veth pairs"
  ip link set "kvfpfv$i$tag" netns "${NS[$i]}" && ip link set "kvfpfw$i$tag" netns "$SW" \
    && ip -n "${NS[$i]}" link set "kvfpfv$i$tag" mtu 9000 up \
    && ip -n "$SW" link set "kvfpfw$i$tag" mtu 9000 master br0 up || { echo "FAIL: veth set-up"; exit 1; }
done

dp() { # index node region peers...
  local i=$1 node=$2 reg=$3
  shift 3
  local peers=()
  for p in "$@"; do peers+=(--peer "$p=10.9.0.$p"); done
  ip netns exec "${NS[$i]}" "$B/kvferry-dataplane" --node-id "$node" --ip "10.9.0.$node" "${peers[@]}" \
    --region "$reg" --port "net_af_packet0,iface=kvfpfv$i$tag,blocksz=16384,framesz=8192,framecnt=1024,qpairs=1" \
    --eal "-l $((i % $(nproc)))" --idle-mode sleep --mbufs 4095 --region-size 160 --rx-small 128:65536 \
    --rx-large 16:1048576 --frame-size 8000 >"$KVF_RUN/dataplane$node.log" 2>&1 &
  KVF_PIDS+=($!)
}
dp 0 1 "$R1" 2
dp 1 2 "$R2" 1 3
dp 2 3 "$R3" 2
for n in 1 2 3; do
  kvf_wait_log "$KVF_RUN/dataplane$n.log" "memory:" 30 || { echo "FAIL: dataplane $n did not start"; cat "$KVF_RUN/dataplane$n.log"; exit 1; }
done
"$B/kvferry-mkmodel" --out "$KVF_RUN/model" --preset tiny >/dev/null || { echo "FAIL: kvferry-mkmodel"; exit 1; }

ctrld() { # name region args...
  local name=$1 reg=$2
  shift 2
  "$B/kvferry-ctrld" --model-dir "$KVF_RUN/model" --stages 2 --backend cpu --threads 1 --port 0 \
    --admin-socket "$KVF_RUN/$name.sock" --pd-dataplane-region "$reg" --served-model-name tiny "$@" \
    >"$KVF_RUN/$name.log" 2>&1 &
  KVF_PIDS+=($!)
  CTRLD_PID=$!
  kvf_wait_log "$KVF_RUN/$name.log" "serving " 60 || { echo "FAIL: ctrld $name did not start"; cat "$KVF_RUN/$name.log"; exit 1; }
}
url_of() { sed -n 's/.* on \(http:\/\/[^,]*\), admin.*/\1/p' "$KVF_RUN/$1.log" | head -n1; }
boot_of() { sed -n 's/.*bootstrap routes on http:\/\/\([^ ]*\) .*/\1/p' "$KVF_RUN/$1.log" | head -n1; }
ctrld pre1 "$R1" --pd-role prefill --bootstrap-port 0
pid1=$CTRLD_PID
ctrld pre3 "$R3" --pd-role prefill --bootstrap-port 0
boot1=$(boot_of pre1) boot3=$(boot_of pre3)
ctrld dec "$R2" --pd-role decode --pd-prefill "$boot1,$boot3" --pd-heartbeat-interval 2
# the dataplanes learn each other's MAC from hellos: wait until node 2 heard both
for _ in $(seq 100); do
  grep -q "peer 1 up" "$KVF_RUN/dataplane2.log" && grep -q "peer 3 up" "$KVF_RUN/dataplane2.log" && break
  sleep 0.1
done

timeout 300 python3 - "$(url_of dec)" "$(url_of pre3)" "$pid1" "$boot1" "$boot3" <<'PY' >"$KVF_RUN/out.log" 2>&1
import json, os, signal, sys, threading, time, urllib.error, urllib.request
dec, pre3, pid1, boot1, boot3 = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]

def post(url, i):
    body = {"model": "tiny", "prompt": [5 + (i * 11 + k) % 300 for k in range(12 + i % 40)], "max_tokens": 10,
            "temperature": 0.0, "ignore_eos": True}
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.load(r)["choices"][0]["text"]
    except urllib.error.HTTPError as e:
        return ("error", e.code, json.load(e)["error"]["message"])

def burst(first, n):
    out = [None] * n
    th = [threading.Thread(target=lambda k=k: out.__setitem__(k, post(dec, first + k))) for k in range(n)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    return out

def pd():
    return json.load(urllib.request.urlopen(dec + "/stats"))["backend"]["pd"]

fails = []
# both prefill nodes serve: 16 concurrent requests equal node 3's co-located answers
warm = burst(0, 16)
bad = [i for i in range(16) if warm[i] != post(pre3, i)]
if bad:
    fails.append("before the kill, requests %s differ from the co-located answers" % bad)
st = pd()
print("before the kill:", [(n["address"], n["healthy"]) for n in st["prefill_nodes"]], "rooms ok", st["rooms_ok_total"])
# freeze node 1 (its rooms stay in flight), send 8, then kill it
os.kill(pid1, signal.SIGSTOP)
t0 = time.time()
res = [None] * 8
th = [threading.Thread(target=lambda k=k: res.__setitem__(k, post(dec, 100 + k))) for k in range(8)]
for t in th:
    t.start()
time.sleep(0.5)
os.kill(pid1, signal.SIGKILL)
for t in th:
    t.join()
dt = time.time() - t0
failed = [r for r in res if isinstance(r, tuple)]
ok = [(k, r) for k, r in enumerate(res) if not isinstance(r, tuple)]
print("killed node 1 (%s) with 8 requests in flight: %d failed, %d served in %.1f s" % (boot1, len(failed), len(ok), dt))
for r in failed[:3]:
    print("  ", r)
if not failed or not ok:
    fails.append("expected rooms on both prefill nodes when node 1 was killed (failed %d, served %d)"
                 % (len(failed), len(ok)))
if any(r[1] < 500 or boot1 not in r[2] for r in failed):
    fails.append("a failed request's error does not name the lost node %s" % boot1)
for k, r in ok:
    if r != post(pre3, 100 + k):
        fails.append("request %d served through node 3 differs from its co-located answer" % (100 + k))
if dt > 2 * 2 + 2 * 1 + 6:
    fails.append("the lost node's rooms took %.1f s to fail" % dt)
st = pd()
lost = [n for n in st["prefill_nodes"] if n["address"] == boot1]
if st["prefill_nodes_lost_total"] != 1 or not lost or lost[0]["healthy"]:
    fails.append("node 1 was not counted lost once: %s" % st["prefill_nodes"])
if st["rooms_failed_total"] != len(failed):
    fails.append("rooms_failed_total %d != %d failed requests" % (st["rooms_failed_total"], len(failed)))
# node 3 alone serves everything after
after = burst(200, 16)
bad = [200 + i for i in range(16) if after[i] != post(pre3, 200 + i)]
if bad:
    fails.append("after the kill, requests %s failed or differ: %s" % (bad, [after[i - 200] for i in bad[:2]]))
st = pd()
print("after: rooms ok %d, failed %d; prefill nodes %s" % (st["rooms_ok_total"], st["rooms_failed_total"],
      [(n["address"], n["healthy"], n["rooms_in_flight"]) for n in st["prefill_nodes"]]))
print("%s: a killed prefill node failed exactly its %d rooms in %.1f s; the decode node served on through the "
      "other; %s" % ("FAIL" if fails else "PASS", len(failed), dt, "; ".join(fails)))
sys.exit(1 if fails else 0)
PY
rc=$?
cat "$KVF_RUN/out.log"
if [ $rc != 0 ]; then
  for f in dec pre1 pre3 dataplane1 dataplane2 dataplane3; do echo "--- $f.log"; tail -n 15 "$KVF_RUN/$f.log"; done
  exit 1
fi
echo "PASS"
