#!/usr/bin/env bash
# The first requests a pipeline of CUDA worker processes serves right after
# it joined give the CPU backend's greedy tokens (1, 2 and 3 stages, each
# asked three times at once after "serving", and once more after 3 s).
# Found on the H200: the KV pool's zeroing ran on the legacy stream, which
# the step stream does not wait for, so it wiped the first steps' KV and
# the first request after start answered "!!!!!!!!!!!!" (kernels/cuda/engine.cu
# cu_dalloc). Needs an NVIDIA GPU and the CUDA module: exits 77 without.
#   cuda_workers_first_request.sh BINDIR   (kvferry-ctrld, kvferry-worker,
#                                           kvferry-mkmodel, kvferry-cuda.so)
set -u
B=$(cd "$1" && pwd)
skip() { echo "SKIP: $*"; exit 77; }
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 || skip "no NVIDIA GPU"
command -v python3 >/dev/null || skip "python3 missing"
T=$(mktemp -d /tmp/kvf-cudafirst.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$T" /dev/shm/*kvfcf$$* 2>/dev/null; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$T"/*.log; do echo "--- $f"; tail -n 8 "$f"; done; exit 1; }
"$B/kvferry-mkmodel" --out "$T/tiny" --preset tiny >/dev/null || fail "kvferry-mkmodel"

ask() { # URL -> one answer per line: three at once, then one after 3 s
  python3 - "$1" <<'PY'
import json, sys, threading, time, urllib.request
def post(out, i):
    b = {"model": "tiny", "prompt": "the ferry crosses the river 0 times", "max_tokens": 12, "temperature": 0,
         "ignore_eos": True}
    r = urllib.request.Request(sys.argv[1] + "/v1/completions", json.dumps(b).encode(),
                               {"Content-Type": "application/json"})
    out[i] = json.load(urllib.request.urlopen(r, timeout=60))["choices"][0]["text"]
out = [None] * 4
ts = [threading.Thread(target=post, args=(out, i)) for i in range(3)]
[t.start() for t in ts]
[t.join() for t in ts]
time.sleep(3)
post(out, 3)
for o in out:
    print(repr(o))
PY
}
serve() { # backend stages -> answers in $T/BACKEND-STAGES.txt
  local be=$1 st=$2 reg=kvfcf$$s$2$1 p=()
  for ((k = 0; k < st; k++)); do
    local out="ring:serve.s$((k + 1)).in"
    [ $k = $((st - 1)) ] && out="ring:serve.ret"
    "$B/kvferry-worker" --config /dev/null --region "$reg" --model "$T/tiny" --in "ring:serve.s$k.in" --out "$out" \
      --role "stage$k" --backend "$be" --threads 1 >"$T/worker-$be-$st-$k.log" 2>&1 &
    p+=($!)
  done
  "$B/kvferry-ctrld" --config /dev/null --model-dir "$T/tiny" --stages "$st" --backend "$be" --threads 1 --port 0 \
    --admin-socket "$T/c.sock" --kv-memory 16M --worker-region "$reg" --worker-region-size 64M --worker-return ring \
    --served-model-name tiny >"$T/ctrld-$be-$st.log" 2>&1 &
  p+=($!)
  pids+=("${p[@]}")
  for _ in $(seq 600); do grep -q "serving " "$T/ctrld-$be-$st.log" && break; sleep 0.1; done
  local url
  url=$(sed -n 's/.* on \(http:\/\/[^,]*\), admin.*/\1/p' "$T/ctrld-$be-$st.log" | head -n1)
  [ -n "$url" ] || fail "$be, $st stage(s): ctrld did not serve"
  ask "$url" >"$T/$be-$st.txt" || fail "$be, $st stage(s): the requests failed"
  kill "${p[@]}" 2>/dev/null
  wait "${p[@]}" 2>/dev/null
  rm -f /dev/shm/*"$reg"* /dev/hugepages/*"$reg"* 2>/dev/null
}
serve cpu 1
ref=$(head -n1 "$T/cpu-1.txt")
for st in 1 2 3; do
  serve cuda $st
  n=$(grep -cxF -- "$ref" "$T/cuda-$st.txt")
  [ "$n" = 4 ] || fail "cuda, $st stage(s): $n of 4 answers are the CPU backend's $ref: $(tr '\n' ' ' <"$T/cuda-$st.txt")"
  echo "ok    cuda, $st stage(s) in worker processes: the first 3 requests after start and one 3 s later give the CPU backend's tokens"
done
echo "PASS: CUDA workers answer their first requests right"
