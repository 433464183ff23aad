#!/usr/bin/env bash
# ctrlctl doctor against hand-made good and bad states: a node with a
# loadable model passes (exit 0); a missing model, a bad value and a port
# another program holds are each named with the fix; --json says the same;
# the CUDA backend's module, missing or unloadable, FAILs for backend = cuda
# naming the path and NVIDIA's packages, and only WARNs for backend = cpu.
#   ctrlctl_doctor.sh CTRLCTL KVFERRY_MKMODEL
set -u
ctl=$1 mk=$2
tmp=$(mktemp -d /tmp/kvf-doctor-XXXXXX)
lpid=
trap '[ -n "$lpid" ] && kill "$lpid" 2>/dev/null; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; [ -f "$tmp/out" ] && cat "$tmp/out"; exit 1; }
"$mk" --out "$tmp/model" --preset tiny >/dev/null || fail "kvferry-mkmodel"
mkdir -p "$tmp/run"
conf() { # model_dir port
  printf '[model]\nmodel_dir = %s\n[http]\nport = %s\n[ctrl]\nadmin_socket = %s/run/ctrl.sock\n' "$1" "$2" "$tmp" >"$tmp/k.conf"
}
doctor() { env -u KVFERRY_CONFIG "$@" "$ctl" --config "$tmp/k.conf" doctor >"$tmp/out" 2>&1; }

conf "$tmp/model" 0
doctor; rc=$?
[ $rc = 0 ] || fail "a good node: exit $rc"
grep -q "^OK    model .*3 layers" "$tmp/out" || fail "the model is not reported OK"
grep -q "^OK    config" "$tmp/out" || fail "the config is not reported OK"
grep -q "^0 failed" "$tmp/out" || fail "no summary line"
echo "ok    a node with a loadable model passes"

conf "$tmp/no-model" 0
doctor; rc=$?
[ $rc = 1 ] || fail "a missing model: exit $rc, not 1"
grep -q "^FAIL  model .*no-model" "$tmp/out" || fail "the missing model is not named"
grep -A1 "^FAIL  model" "$tmp/out" | grep -q "fix: set model_dir" || fail "no fix for the model"
echo "ok    a missing model FAILs naming the directory and the fix"

conf "$tmp/model" 0
doctor KVFERRY_PORT=eighty; rc=$?
[ $rc = 1 ] || fail "a bad value: exit $rc"
grep -q "^FAIL  config .*port" "$tmp/out" || fail "the bad key is not named"
echo "ok    a bad value FAILs naming the key"

python3 -c 'import socket, time; s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(); print(s.getsockname()[1], flush=True); time.sleep(60)' >"$tmp/port" &
lpid=$!
for _ in $(seq 50); do [ -s "$tmp/port" ] && break; sleep 0.1; done
port=$(cat "$tmp/port")
conf "$tmp/model" "$port"
doctor; rc=$?
grep -q "^WARN  http port .*127.0.0.1:$port: Address already in use" "$tmp/out" || fail "the held port is not named"
echo "ok    a port another program holds is named"

conf "$tmp/no-model" 0
env -u KVFERRY_CONFIG "$ctl" --config "$tmp/k.conf" --json doctor >"$tmp/out" 2>&1
python3 - "$tmp/out" <<'PY' || fail "--json"
import json, sys
j = json.load(open(sys.argv[1]))
model = [c for c in j["checks"] if c["check"] == "model"][0]
assert model["result"] == "FAIL" and "no-model" in model["detail"] and model["fix"], model
assert j["failed"] == sum(c["result"] == "FAIL" for c in j["checks"]) >= 1, j
assert all(c["result"] in ("OK", "WARN", "FAIL") for c in j["checks"]), j
PY
echo "ok    --json carries each check, its result, detail and fix"

# the CUDA backend's module (package kvferry-cuda), loaded as a stage loads it
conf "$tmp/model" 0
doctor KVFERRY_BACKEND=cuda KVFERRY_CUDA_MODULE="$tmp/none/kvferry-cuda.so"; rc=$?
[ $rc = 1 ] || fail "backend = cuda without its module: exit $rc, not 1"
grep -q "^FAIL  cuda .*$tmp/none/kvferry-cuda.so: No such file" "$tmp/out" || fail "the missing module is not named"
grep -A1 "^FAIL  cuda" "$tmp/out" | grep -q "fix: set \[engine\] cuda_module" || fail "no fix for the module path"
echo "not a module" >"$tmp/bad.so"
doctor KVFERRY_BACKEND=cuda KVFERRY_CUDA_MODULE="$tmp/bad.so"; rc=$?
[ $rc = 1 ] || fail "backend = cuda with a bad module: exit $rc, not 1"
grep -q "^FAIL  cuda .*dlopen($tmp/bad.so) failed: .*cuda-cudart-13-0 and libcublas-13-0" "$tmp/out" \
  || fail "a module that does not load is not named with NVIDIA's packages"
doctor KVFERRY_CUDA_MODULE="$tmp/none/kvferry-cuda.so"; rc=$?
[ $rc = 0 ] || fail "backend = cpu: a missing CUDA module must not fail the node (exit $rc)"
grep -q "^WARN  cuda" "$tmp/out" || fail "backend = cpu: the missing configured module is not a WARN"
echo "ok    the CUDA module: missing or unloadable FAILs for backend = cuda naming the path and the packages, WARNs for cpu"

# the weights and the KV pools against the memory available (CPU backend)
conf "$tmp/model" 0
doctor; rc=$?
grep -q "^OK    model memory weights .* fit the .* MiB available" "$tmp/out" || fail "a small model is not reported to fit"
doctor KVFERRY_KV_MEMORY=1024G KVFERRY_STAGES=2; rc=$?
[ $rc = 0 ] || fail "too little memory is a WARN, not a FAIL (exit $rc)"
grep -q "^WARN  model memory weights .* KV pools 2 x 1048576.0 MiB exceed the .* MiB available" "$tmp/out" \
  || fail "KV pools larger than the memory available are not named"
doctor KVFERRY_KV_MEMORY=1024G "KVFERRY_STAGES=0-1,1-2,2-3"; rc=$?
grep -q "KV pools 3 x 1048576.0 MiB" "$tmp/out" || fail "stages given as layer ranges are not counted as ctrld splits them"
doctor "KVFERRY_STAGES=0-1,1-2"; rc=$?
[ $rc = 1 ] || fail "stages that do not tile the model: exit $rc, not 1"
grep -q "^FAIL  stages .*stages = 0-1,1-2" "$tmp/out" || fail "stages that do not tile the model are not named"
echo "ok    the weights and each stage's KV pool are checked against the memory available (stages as ctrld splits them)"
