#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Integration: a real kvferry-ctrld on a generated tiny model answers
# completions and chat, plain and streamed; then its /metrics must pass
# `promtool check metrics` with nothing to say, every family must have HELP
# and TYPE, the four latency histograms must count exactly the requests (and
# tokens) served, and the monitoring polls must not count as client requests.
#   ctrld_metrics.sh KVFERRY_CTRLD KVFERRY_MKMODEL SOURCE_ROOT
# Exits 77 (skip) when promtool (Debian's prometheus), curl or python3 is missing.
set -u
ctrld=$1 mkmodel=$2 root=$3
# shellcheck source=scripts/serve-lib.sh
. "$root/scripts/serve-lib.sh"

command -v promtool >/dev/null || { echo "promtool not found (apt-get install prometheus; scripts/install-deps): skipping"; exit 77; }
command -v curl >/dev/null || { echo "curl not found: skipping"; exit 77; }
command -v python3 >/dev/null || { echo "python3 not found: skipping"; exit 77; }

tmp=$(mktemp -d /tmp/kvf-metrics-XXXXXX)
pid=
cleanup() { [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- daemon log"; cat "$tmp/ctrld.log"; exit 1; }

"$mkmodel" --out "$tmp/model" >/dev/null || fail "kvferry-mkmodel"
"$ctrld" --model-dir "$tmp/model" --served-model-name tiny --port 0 --admin-socket "$tmp/ctrl.sock" \
  --stages 3 --threads 1 --kv-memory 16M --config /dev/null >"$tmp/ctrld.log" 2>&1 &
pid=$!
port=$(kvf_ctrld_port "$tmp/ctrld.log" "$pid") || fail "$port"
base=http://127.0.0.1:$port

# Served: 3 completions, 1 chat, 1 streamed completion, 1 streamed chat, each
# exactly M tokens (ignore_eos). Not served: a wrong model (a 400-class error).
M=6 N=6
post() { curl -sS --fail-with-body "$base$1" -H 'Content-Type: application/json' -d "$2"; }
for i in 1 2 3; do
  post /v1/completions '{"model":"tiny","prompt":"the metrics '$i'","max_tokens":'$M',"ignore_eos":true}' \
    >"$tmp/c$i.json" || fail "completion $i"
done
post /v1/chat/completions '{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":'$M',"ignore_eos":true}' \
  >"$tmp/chat.json" || fail "chat completion"
post /v1/completions '{"model":"tiny","prompt":"streamed","max_tokens":'$M',"ignore_eos":true,"stream":true}' \
  >"$tmp/s1.sse" || fail "streamed completion"
post /v1/chat/completions '{"model":"tiny","messages":[{"role":"user","content":"streamed"}],"max_tokens":'$M',"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}}' \
  >"$tmp/s2.sse" || fail "streamed chat completion"
for f in s1 s2; do
  tail -c 16 "$tmp/$f.sse" | grep -q 'data: \[DONE\]' || fail "stream $f did not end with [DONE]: $(tail -c 300 "$tmp/$f.sse")"
done
code=$(curl -s -o /dev/null -w '%{http_code}' "$base/v1/completions" -d '{"model":"nope","prompt":"x"}')
[ "$code" = 404 ] || fail "a request for another model got $code, not 404"

# The monitoring polls (dashboard, /stats, a scrape) leave requests_total alone.
curl -sf "$base/stats" >"$tmp/before.json" || fail "GET /stats"
for u in /stats /dashboard /metrics /stats; do curl -sf -o /dev/null "$base$u" || fail "GET $u"; done
curl -sf "$base/metrics" >"$tmp/metrics.txt" || fail "GET /metrics"
curl -sf "$base/stats" >"$tmp/after.json" || fail "GET /stats"

promtool check metrics <"$tmp/metrics.txt" >"$tmp/promtool.out" 2>&1
rc=$?
echo "promtool check metrics: exit $rc, $(wc -l <"$tmp/promtool.out") line(s)"
cat "$tmp/promtool.out"
[ $rc = 0 ] && [ ! -s "$tmp/promtool.out" ] || fail "promtool check metrics is not clean"
echo "ok    promtool check metrics has nothing to say about /metrics after $N requests"

python3 - "$tmp" "$N" "$M" <<'EOF' || fail "the /metrics or /stats checks above"
import json, re, sys
tmp, n, m = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
text = open(tmp + "/metrics.txt").read()
before, after = json.load(open(tmp + "/before.json")), json.load(open(tmp + "/after.json"))
fails = []
helps = set(re.findall(r"^# HELP (\S+) ", text, re.M))
types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
samples = re.findall(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$", text, re.M)

def family(name):
    base = re.sub(r"_(bucket|sum|count)$", "", name)
    return base if types.get(base) == "histogram" else name

for name, labels, value in samples:
    if family(name) not in types or family(name) not in helps:
        fails.append("%s has no TYPE or no HELP" % name)
for fam, t in types.items():
    if re.search(r"_(us|ms|ns|s)(_|$)", fam):
        fails.append("%s names an abbreviated unit" % fam)
    if t != "counter" and fam.endswith("_total"):
        fails.append("%s is a %s ending in _total" % (fam, t))
    if t == "counter" and not fam.endswith("_total"):
        fails.append("%s is a counter not ending in _total" % fam)
if types.get("kvferry_backend_replicas_blocks_capacity") != "gauge":
    fails.append("the KV pool's size is not the gauge kvferry_backend_replicas_blocks_capacity")
if "kvferry_build_info" not in types:
    fails.append("no kvferry_build_info")

def value(name, labels=""):
    for nm, lab, v in samples:
        if nm == name and (lab or "") == labels:
            return float(v)
    fails.append("no sample %s%s" % (name, labels))
    return float("nan")

want = {"kvferry_time_to_first_token_seconds": n, "kvferry_e2e_request_latency_seconds": n,
        "kvferry_request_queue_time_seconds": n, "kvferry_inter_token_latency_seconds": n * (m - 1)}
for fam, count in want.items():
    if types.get(fam) != "histogram":
        fails.append("%s is not a histogram" % fam)
        continue
    buckets = [(lab, float(v)) for nm, lab, v in samples if nm == fam + "_bucket"]
    les = [re.search(r'le="([^"]+)"', lab).group(1) for lab, _ in buckets]
    if les[-1] != "+Inf" or [float(x) for x in les[:-1]] != sorted(float(x) for x in les[:-1]):
        fails.append("%s: bounds not ascending up to +Inf: %s" % (fam, les))
    if any(later[1] < earlier[1] for later, earlier in zip(buckets[1:], buckets)):
        fails.append("%s: buckets are not cumulative" % fam)
    c, s = value(fam + "_count"), value(fam + "_sum")
    print("%-40s count %3d (want %3d), sum %.6f s, mean %.3f ms" % (fam, c, count, s, 1e3 * s / c if c else 0))
    if c != count or buckets[-1][1] != c:
        fails.append("%s counts %g (+Inf bucket %g); %d were served" % (fam, c, buckets[-1][1], count))
    if not s > 0:
        fails.append("%s sums to %g" % (fam, s))
    js = after["latency"][fam[len("kvferry_"):]]
    if js["count"] != c or js["buckets"][-1] > js["count"]:
        fails.append("/stats latency.%s disagrees with /metrics" % fam)
if value("kvferry_http_completion_tokens_total") != n * m:
    fails.append("completion_tokens_total is not %d" % (n * m))
# /stats keeps its old fields (ctrlctl and the tests read them)
h0, h1 = before["http"], after["http"]
for k in ("requests_total", "client_errors_total", "completions_total", "streams_total", "active"):
    if k not in h1:
        fails.append("/stats http.%s is gone" % k)
rep = after["backend"]["replicas"][0]
for k in ("blocks_total", "mean_round_trip_us", "occupancy", "tokens_total"):
    if k not in rep:
        fails.append("/stats backend.replicas[0].%s is gone" % k)
if "uptime_s" not in after:
    fails.append("/stats uptime_s is gone")
print("requests_total %d -> %d around 6 monitoring polls; monitor_requests_total %d -> %d"
      % (h0["requests_total"], h1["requests_total"], h0["monitor_requests_total"], h1["monitor_requests_total"]))
if h1["requests_total"] != h0["requests_total"] or h1["requests_total"] != n + 1:
    fails.append("requests_total counts monitoring polls (want %d client requests)" % (n + 1))
if h1["monitor_requests_total"] - h0["monitor_requests_total"] != 6:
    fails.append("monitor_requests_total did not count the 6 polls")
if value("kvferry_http_requests_total") != n + 1:
    fails.append("kvferry_http_requests_total is not %d" % (n + 1))
for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
EOF
echo "ok    every family has HELP and TYPE, base units, counters end in _total and nothing else does"
echo "ok    the latency histograms count the $N requests served (and their tokens), the polls are not client requests"
kill -TERM "$pid"
wait "$pid"
pid=
