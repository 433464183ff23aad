#!/usr/bin/env bash
# The two-node topology of scripts/run (two kvferry-dataplane processes over
# net_memif, a kvferry-worker per node, kvferry-ctrld on node 1), on the tiny
# model:
#  1. greedy completions through the API equal those of a ctrld running the
#     whole model in-process (the solo run), token for token;
#  2. a worker killed mid-request ends its clients' requests with an error
#     within a bound, and after the worker restarts the daemon serves again
#     with the same output.
#   test_serve_dataplane.sh BUILD_DIR SOURCE_ROOT [dataplane|netns]
# netns: the same two nodes with each dataplane in its own network namespace,
# joined by a veth pair through net_af_packet (only the dataplane hop crosses
# the namespaces; each node's processes share its region as before).
# Needs root and 2 MiB hugepages (exits 77 otherwise).
set -u
B=$(cd "$1" && pwd) S=$(cd "$2" && pwd) topo=${3:-dataplane}
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root (hugepages for two dataplanes)"
command -v python3 >/dev/null || skip "python3 missing"

# group timeout 30 s: the killed worker on node 2 must be seen by node 2's
# dataplane telling node 1's (DP_EV_PEER_PROC_DEAD), not by a timeout
KVF_BIN=$B KVF_BACKEND=cpu KVF_THREADS=1 KVF_GROUP_TIMEOUT=30
# part 2 is about what a client sees when its request dies with the worker:
# [sched] replay_max = 0 (ctrld would otherwise run those requests again
# once the worker is back; tests/ctrl/ctrld_replay.sh covers that)
export KVFERRY_REPLAY_MAX=0
KVF_RUN=$(mktemp -d /tmp/kvferry-serve-it.XXXXXX)
KVF_MODEL=$KVF_RUN/tiny
. "$S/scripts/serve-lib.sh"
kvf_hugepages 160 || skip "cannot reserve 160 hugepages of 2 MiB"
ref_pid=
cleanup() { [ -n "$ref_pid" ] && kill "$ref_pid" 2>/dev/null; kvf_down; rm -rf "$KVF_RUN"; }
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$KVF_RUN"/*.log; do echo "--- $f"; grep -v '^EAL\|TELEMETRY' "$f" | tail -n 30; done
  exit 1
}
"$B/kvferry-mkmodel" --out "$KVF_MODEL" --preset tiny >/dev/null || fail "kvferry-mkmodel"

# Greedy completions of a few prompts, one JSON line each: the token ids
# (`/tokenize` of the text would lose nothing here, but ids are the claim).
complete() { # URL MODEL OUT
  python3 - "$1" "$2" >"$3" <<'EOF'
import json, sys, urllib.request
url, model = sys.argv[1], sys.argv[2]
for p in ["the first prompt", "a second, longer prompt about stages and rings", "x", "1 2 3 4 5 6 7 8"]:
    body = json.dumps({"model": model, "prompt": p, "max_tokens": 24, "temperature": 0}).encode()
    r = urllib.request.urlopen(urllib.request.Request(url + "/v1/completions", data=body), timeout=60)
    out = json.loads(r.read())
    print(json.dumps([out["choices"][0]["text"], out["usage"]["completion_tokens"]]))
EOF
}

# 1a. the solo run: the whole model in one in-process stage
"$B/kvferry-ctrld" --model-dir "$KVF_MODEL" --stages 1 --port 0 --admin-socket "$KVF_RUN/ref.sock" \
  --threads 1 --kv-memory 16M >"$KVF_RUN/ref.log" 2>&1 &
ref_pid=$!
kvf_wait_log "$KVF_RUN/ref.log" "serving " 30 || fail "reference ctrld did not start"
ref_url=$(sed -n 's/.* on \(http:\/\/[^,]*\), admin.*/\1/p' "$KVF_RUN/ref.log")
complete "$ref_url" tiny "$KVF_RUN/ref.txt" || fail "reference completions"
kill "$ref_pid"; wait "$ref_pid" 2>/dev/null; ref_pid=

# 1b. the same requests through two nodes
KVF_KV_MEMORY=16M kvf_up "$topo" 2 || fail "topology did not come up"
[ "$KVF_TOPOLOGY" = "$topo" ] || skip "the $topo topology fell back to $KVF_TOPOLOGY"
complete "$KVF_URL" tiny "$KVF_RUN/out.txt" || fail "completions through the pipeline"
cmp -s "$KVF_RUN/ref.txt" "$KVF_RUN/out.txt" || { diff "$KVF_RUN/ref.txt" "$KVF_RUN/out.txt"; fail "output differs from the solo run"; }
echo "PASS: $(wc -l <"$KVF_RUN/ref.txt") greedy completions over two nodes ($topo) equal the solo run"

# ctrlctl peers: node 1's dataplane sees node 2 up, with the traffic the
# completions made (the dataplane's stats area, read by ctrld)
"$B/ctrlctl" --socket "$KVF_SOCK" --json peers >"$KVF_RUN/peers.json" || fail "ctrlctl peers"
# rx_in_place = auto (the default): these regions of 96 MiB are too small for
# the receive buffers (4095 of ~9 KiB take more than a quarter; without
# hugepages no region can hold them), so the dataplanes receive reassembled
# and say why at start; but node 2's memif port is a client, by default a
# zero-copy one, whose consumers read the mbufs the server's driver wrote
# (its EAL memory, not the region): in place
for f in dataplane1 dataplane2; do
  if [ "$topo" = dataplane ] && [ $f = dataplane2 ]; then
    grep -q "rx in place (the mbufs the memif server wrote" "$KVF_RUN/$f.log" \
      || fail "$f, a memif client with the defaults, is no zero-copy client receiving in place"
    continue
  fi
  grep -q "receiving reassembled (rx_in_place = auto): " "$KVF_RUN/$f.log" \
    || fail "$f did not say why it receives reassembled (rx_in_place = auto)"
done
python3 - "$KVF_RUN/peers.json" "$topo" <<'EOF' || { cat "$KVF_RUN/peers.json"; fail "ctrlctl peers does not show node 2's link"; }
import json, sys
d = json.load(open(sys.argv[1]))
d = d.get("data", d)
# what the CPU did with each payload byte: over net_memif in copy mode the
# driver copies once each way and the dataplane reassembles what it receives
# (rx_in_place = auto here: no): 1 copy a byte sent, 2 received; over af_packet the
# driver's copies at least
c = d["copies"]
assert c["payload_sent_bytes_total"] > 0 and c["payload_received_bytes_total"] > 0, c
if sys.argv[2] == "dataplane":
    assert c["driver_copies_sending"] == 1 and c["driver_copies_receiving"] == 1, c
    assert c["copied_sending_bytes_total"] == 0, c
    assert c["copied_receiving_bytes_total"] == c["payload_received_bytes_total"], c
    assert c["sending_per_byte"] == 1.0 and c["receiving_per_byte"] == 2.0, c
else:
    assert c["sending_per_byte"] >= 1.0 and c["receiving_per_byte"] >= 1.0, c
print("PASS: ctrlctl peers: copies a payload byte, %.2f sent and %.2f received (%d and %d bytes)"
      % (c["sending_per_byte"], c["receiving_per_byte"], c["payload_sent_bytes_total"],
         c["payload_received_bytes_total"]))
assert d["node"] == 1, d
p = [x for x in d["peers"] if x["node"] == 2]
assert p, d
p = p[0]
assert p["state"] == "up" and p["up"] and p["heard_ms"] < 2000, p
assert p["rtt_us"] > 0 and p["msgs_sent_total"] > 0 and p["msgs_received_total"] > 0 and p["tx_bytes_total"] > 0, p
assert p["streams"] >= 1 and p["credit_msgs"] >= 0 and 0 <= p["loss_frac"] <= 1, p
print("PASS: ctrlctl peers: node 2 up, rtt %.0f us, %d messages sent, %d received, credit %d, loss %.4f"
      % (p["rtt_us"], p["msgs_sent_total"], p["msgs_received_total"], p["credit_msgs"], p["loss_frac"]))
EOF
# the same on /metrics, labelled by the peer's node id, promtool-clean
curl -s "$KVF_URL/metrics" >"$KVF_RUN/metrics.txt" || fail "GET /metrics"
grep -q '^kvferry_dataplane_peers_up{peer="2"} 1$' "$KVF_RUN/metrics.txt" \
  || { grep dataplane "$KVF_RUN/metrics.txt"; fail "/metrics does not show peer 2 up"; }
grep -q '^kvferry_dataplane_peers_msgs_received_total{peer="2"} [1-9]' "$KVF_RUN/metrics.txt" \
  || fail "/metrics does not count the messages from peer 2"
grep -q '^kvferry_dataplane_copies_receiving_per_byte [1-9]' "$KVF_RUN/metrics.txt" \
  || { grep copies "$KVF_RUN/metrics.txt"; fail "/metrics does not show the copies a received byte took"; }
if command -v promtool >/dev/null; then
  promtool check metrics <"$KVF_RUN/metrics.txt" || fail "promtool check metrics with the dataplane's families"
fi
echo "PASS: /metrics shows the dataplane's peers (kvferry_dataplane_peers_*{peer=\"2\"})"

# 2. kill the node-2 worker mid-request
# Enough requests that some are mid-stream whenever the kill lands (the tiny
# model often ends a completion in under a second at EOS): kill once ctrld
# reports requests in flight.
python3 "$S/scripts/serve-client" "$KVF_URL" tiny --max-tokens 1500 --concurrency 4 --requests 64 --json \
  >"$KVF_RUN/killed.json" 2>&1 &
cli=$!
for _ in $(seq 100); do
  act=$("$B/ctrlctl" --socket "$KVF_SOCK" --json status 2>/dev/null \
        | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"]["active_requests"])' 2>/dev/null)
  [ "${act:-0}" -ge 2 ] && break
  sleep 0.05
done
sleep 0.3
kill -9 "${KVF_WPIDS[1]}"
t0=$(date +%s.%N)
wait $cli
t1=$(date +%s.%N)
cat "$KVF_RUN/killed.json"
errs=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).read().splitlines()[-1])["errors"])' "$KVF_RUN/killed.json")
[ "${errs:-0}" -ge 1 ] || fail "no request ended with an error after the worker was killed"
python3 -c "import sys; d=float(sys.argv[2])-float(sys.argv[1]); print('clients ended %.1f s after the kill' % d); sys.exit(0 if d < 15 else 1)" "$t0" "$t1" \
  || fail "clients waited too long after the worker died"
grep -q "stage 1 (.*pid ${KVF_WPIDS[1]} on node 2.*) died, as the dataplane of its node reports" "$KVF_RUN/ctrld.log" \
  || fail "ctrld did not learn of the worker's death from node 2's dataplane"
python3 -c "import sys; sys.exit(0 if float(sys.argv[2]) - float(sys.argv[1]) < 5 else 1)" "$t0" "$t1" \
  || fail "clients ended more than 5 s after the kill: the death was not reported by node 2's dataplane"
echo "PASS: node 2's dataplane reported the worker's death to ctrld on node 1 (group timeout 30 s not needed)"
# `ctrlctl status` shows the stage not ready while the chain waits for it
# ("down" when ctrld saw which stage died, "rejoining" after a group timeout
# that names none)
stage_state() {
  "$B/ctrlctl" --socket "$KVF_SOCK" --json status \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"]["workers"][int(sys.argv[1])]["state"])' "$1"
}
st=$(stage_state 1)
case $st in down|rejoining) echo "ctrlctl status: stage 1 $st while the chain re-forms" ;;
  *) fail "ctrlctl status shows the killed stage as '$st', not down or rejoining" ;; esac
# restart it with the same command: the chain re-forms by itself
${KVF_WCMD[1]} >>"$KVF_RUN/worker1.log" 2>&1 &
KVF_PIDS+=($!)
for i in $(seq 1 60); do
  grep -q "chain: re-formed" "$KVF_RUN/ctrld.log" && break
  sleep 0.5
done
grep -q "chain: re-formed" "$KVF_RUN/ctrld.log" || fail "the chain did not re-form after the restart"
st=$(stage_state 1)
[ "$st" = ready ] || fail "ctrlctl status shows the restarted stage as '$st', not ready"
complete "$KVF_URL" tiny "$KVF_RUN/after.txt" || fail "completions after the restart"
cmp -s "$KVF_RUN/ref.txt" "$KVF_RUN/after.txt" || fail "output after the restart differs from the solo run"
"$B/ctrlctl" --socket "$KVF_SOCK" stages
echo "PASS: a killed worker failed $errs request(s); after its restart the output equals the solo run"
