#!/usr/bin/env bash
# No leak under load: 2,000 short requests (streaming and not, some cancelled
# mid-stream by closing the connection) through kvferry-ctrld and its
# kvferry-worker processes on the tiny model. Then:
#  - the resident memory (VmRSS) of ctrld and of every worker is within 10%
#    of what it was after the first 200 requests;
#  - every KV block is back (blocks in use and reserved 0, no live or queued
#    sequence), every ring of ctrld's region is empty and every dataplane
#    receive buffer is back in its pool (`ctrlctl pool --json`);
#  - every worker reports its input and output queues empty, no send pending
#    and its receive buffers back (SIGUSR1 report in its log).
# Before the load, `ctrlctl status` must show each worker's load (tensors,
# bytes) as the worker logged it.
#   test_serve_leak.sh BUILD_DIR SOURCE_ROOT shm|dataplane|netns [N]
# shm needs nothing special; dataplane and netns need root and hugepages
# (exit 77 otherwise). N (default 2000) is the number of requests.
set -u
B=$(cd "$1" && pwd) S=$(cd "$2" && pwd) topo=$3 N=${4:-2000}
FIRST=$(( N / 10 ))
skip() { echo "SKIP: $*"; exit 77; }
command -v python3 >/dev/null || skip "python3 missing"
if [ "$topo" != shm ]; then
  [ "$(id -u)" = 0 ] || skip "the $topo topology needs root (hugepages for two dataplanes)"
fi

KVF_BIN=$B KVF_BACKEND=cpu KVF_THREADS=1 KVF_KV_MEMORY=16M
KVF_RUN=$(mktemp -d /tmp/kvferry-leak.XXXXXX)
KVF_MODEL=$KVF_RUN/tiny
. "$S/scripts/serve-lib.sh"
cleanup() { kvf_down; [ -n "${KEEP:-}" ] || rm -rf "$KVF_RUN"; }
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$KVF_RUN"/*.log; do echo "--- $f"; grep -v '^EAL\|TELEMETRY' "$f" | tail -n 25; done
  exit 1
}
"$B/kvferry-mkmodel" --out "$KVF_MODEL" --preset tiny >/dev/null || fail "kvferry-mkmodel"
kvf_up "$topo" 2 || fail "the $topo topology did not come up"
[ "$KVF_TOPOLOGY" = "$topo" ] || skip "the $topo topology fell back to $KVF_TOPOLOGY"
echo "topology $KVF_TOPOLOGY: ctrld $KVF_CTRLD, workers ${KVF_WPIDS[*]}"

# `ctrlctl status` shows each worker's load: the tensors and bytes ctrld
# counts for its range are what the worker itself logged loading.
"$B/ctrlctl" --socket "$KVF_SOCK" status | sed -n '/^workers:/,$p'
"$B/ctrlctl" --socket "$KVF_SOCK" --json status >"$KVF_RUN/status.json" || fail "ctrlctl status"
for k in "${!KVF_WPIDS[@]}"; do
  logged=$(sed -n 's/.*loading stage [0-9]*: .*: \([0-9]*\) tensors, \([0-9.]*\) MiB from.*/\1 \2/p' "$KVF_RUN/worker$k.log" | head -n1)
  python3 - "$KVF_RUN/status.json" "$k" $logged <<'EOF' || fail "ctrlctl status does not show stage $k's load as its worker logged it ($logged)"
import json, sys
w = [x for x in json.load(open(sys.argv[1]))["data"]["workers"] if x["stage"] == int(sys.argv[2])][0]
sys.exit(0 if w["state"] == "ready" and w["tensors"] == int(sys.argv[3])
         and abs(w["tensor_mib"] - float(sys.argv[4])) < 0.06 and w["load_ms"] >= 0 and w["resident_mib"] > 0 else 1)
EOF
done

# Send requests FROM..TO-1: 8 clients; every 5th request streams and hangs up
# after its first token, every 3rd does not stream; prompts and lengths vary.
load() {
  python3 - "$KVF_URL" "$1" "$2" <<'EOF'
import http.client, json, sys, threading, urllib.parse
url, lo, hi = urllib.parse.urlparse(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
words = "stage ring page token batch hop node pool block slot group epoch".split()
lock, nxt, counts = threading.Lock(), [lo], {"ok": 0, "cancelled": 0, "errors": 0}
def one(i):
    prompt = " ".join(words[(i * 7 + k) % len(words)] for k in range(1 + i % 23))
    cancel, stream = i % 5 == 0, i % 3 != 0 or i % 5 == 0
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 1 + i % 12, "stream": stream,
            "temperature": 0 if i % 2 else 0.8, "seed": i}
    c = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    try:
        c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            return "errors"
        if cancel:
            r.fp.readline()  # the first event, then hang up mid-stream
            return "cancelled"
        data = r.read().decode()
        return "errors" if '"error"' in data else "ok"
    except Exception as e:
        print("request %d: %s" % (i, e), file=sys.stderr)
        return "errors"
    finally:
        c.close()
def worker():
    while True:
        with lock:
            i = nxt[0]; nxt[0] += 1
        if i >= hi:
            return
        k = one(i)
        with lock:
            counts[k] += 1
th = [threading.Thread(target=worker) for _ in range(8)]
for t in th: t.start()
for t in th: t.join()
print(json.dumps(counts))
sys.exit(1 if counts["errors"] else 0)
EOF
}

rss() { awk '/^VmRSS/{print $2}' "/proc/$1/status"; }
pool_json() { "$B/ctrlctl" --socket "$KVF_SOCK" --json pool; }
# Wait until ctrld has finished every sequence (cancels land asynchronously).
settle() {
  for _ in $(seq 100); do
    pool_json | python3 -c 'import json,sys; r=json.load(sys.stdin)["data"][0]; sys.exit(0 if r["live"]==0 and r["queued"]==0 and r["groups_busy"]==0 else 1)' && return 0
    sleep 0.1
  done
  return 1
}
snapshot() { # LABEL: "pid rss" lines for ctrld and the workers
  for p in "$KVF_CTRLD" "${KVF_WPIDS[@]}"; do echo "$p $(rss "$p")"; done >"$KVF_RUN/rss.$1"
}

t0=$(date +%s.%N)
load 0 "$FIRST" || fail "the first $FIRST requests"
settle || fail "sequences still live after the first $FIRST requests"
snapshot first
load "$FIRST" "$N" || fail "requests $FIRST..$N"
settle || { pool_json; fail "sequences still live after $N requests"; }
t1=$(date +%s.%N)
snapshot last
python3 -c "import sys; print('%d requests in %.1f s' % (int(sys.argv[3]), float(sys.argv[2]) - float(sys.argv[1])))" "$t0" "$t1" "$N"

# 0. the cancels really ended sequences mid-stream (not after they finished)
python3 - "$KVF_URL" <<'EOF' || fail "no request was cancelled mid-stream, or one is still active (/stats)"
import json, sys, urllib.request
s = json.load(urllib.request.urlopen(sys.argv[1] + "/stats", timeout=10))
b, h = s["backend"]["replicas"][0], s["http"]
print("/stats: %d finished, %d cancelled by the scheduler, %d client hang-ups seen, %d active" % (
    b["finished_total"], b["cancelled_total"], h["client_cancels_total"], h["active"]))
sys.exit(0 if b["cancelled_total"] >= 1 and h["active"] == 0 else 1)
EOF

# 1. resident memory
paste "$KVF_RUN/rss.first" "$KVF_RUN/rss.last" | python3 -c '
import sys
bad = 0
for line in sys.stdin:
    p, a, _, b = line.split()
    grow = (int(b) - int(a)) / int(a)
    print("pid %s: VmRSS %s kB after the first requests, %s kB after all (%+.1f%%)" % (p, a, b, 100 * grow))
    bad |= grow > 0.10
sys.exit(bad)' || fail "resident memory grew by more than 10%"

# 2. ctrld's view: blocks, sequences, rings and pools of its region
pool_json | tee "$KVF_RUN/pool.json" | python3 -c '
import json, sys
r = json.load(sys.stdin)["data"][0]
print("KV blocks %d total, %d in use, %d reserved; live %d, queued %d; rings: %s; pools: %s" % (
    r["blocks_total"], r["blocks_in_use"], r["blocks_reserved"], r["live"], r["queued"],
    ", ".join("%s %d/%d" % (q["name"], q["queued"], q["capacity"]) for q in r["rings"]),
    ", ".join("%s %d/%d free" % (p["name"], p["available"], p["count"]) for p in r["pools"]) or "none"))
ok = (r["blocks_in_use"] == 0 and r["blocks_reserved"] == 0 and r["live"] == 0 and r["queued"] == 0
      and r["ring_entries"] == 0 and r["shm_bufs_free"] == r["shm_bufs"] and r["groups_busy"] == 0
      and len(r["rings"]) >= 2)
sys.exit(0 if ok else 1)' || fail "a block, ring slot or buffer did not come back (ctrlctl pool --json)"

# 3. each worker's view of its own node's region
for k in "${!KVF_WPIDS[@]}"; do
  kill -USR1 "${KVF_WPIDS[$k]}"
  kvf_wait_log "$KVF_RUN/worker$k.log" "report (SIGUSR1)" 5 || fail "worker $k did not report"
  line=$(grep "report (SIGUSR1)" "$KVF_RUN/worker$k.log" | tail -n1)
  echo "worker $k: ${line#*: }"
  python3 -c '
import re, sys
kv = dict(re.findall(r"(\w+)=(-?\d+)", sys.argv[1]))
ok = kv["in_queued"] == "0" and kv["out_queued"] == "0" and kv["pending_sends"] == "0" and kv["rx_free"] == kv["rx_bufs"]
sys.exit(0 if ok else 1)' "$line" || fail "worker $k holds a queued message, a pending send or a receive buffer"
done
echo "PASS: $N requests ($KVF_TOPOLOGY): memory flat, every block, ring slot and buffer back"
