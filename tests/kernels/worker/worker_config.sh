#!/usr/bin/env bash
# kvferry-worker reads its options like every daemon: kvferry.conf's [worker]
# section (ctrld's sections in the same file skipped), KVFERRY_WK_* variables,
# flags, in that order of strength; a bad value is refused at start (exit 2)
# naming the key, the value, where it came from and the allowed range.
#   worker_config.sh KVFERRY_WORKER
set -u
worker=$1
tmp=$(mktemp -d /tmp/kvf-wkcfg-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; cat "$tmp/out" 2>/dev/null; exit 1; }
run() { env -u KVFERRY_CONFIG "$@" >"$tmp/out" 2>&1; echo $?; }

cat > "$tmp/kvferry.conf" <<'CONF'
[http]
port = 8000
[pd]
role = prefill
[worker]
region = kvf_test
model = /nonexistent/model
in = ring:serve.s0.in
out = ring:serve.ret
depth = 3
CONF

# the file alone is enough (ctrld's sections skipped)
[ "$(run "$worker" --config "$tmp/kvferry.conf" --check)" = 0 ] || fail "--check on a good file"
grep -q "configuration OK" "$tmp/out" || fail "no 'configuration OK'"
echo "ok    a [worker] section in a shared kvferry.conf configures the worker; ctrld's sections are skipped"

# a value out of range: named with its origin and range, exit 2
sed -i 's/^depth = 3/depth = 9/' "$tmp/kvferry.conf"
[ "$(run "$worker" --config "$tmp/kvferry.conf" --check)" = 2 ] || fail "depth 9 accepted"
grep -q "kvferry.conf:10: value '9' for 'depth' is out of range 0..4" "$tmp/out" || fail "depth 9: message"
# a stronger layer overrides it, and is itself checked
[ "$(run "$worker" --config "$tmp/kvferry.conf" --depth 2 --check)" = 2 ] || fail "a bad file passes under a flag"
sed -i 's/^depth = 9/depth = 1/' "$tmp/kvferry.conf"
[ "$(run KVFERRY_WK_SPIN_US=abc "$worker" --config "$tmp/kvferry.conf" --check)" = 2 ] || fail "spin_us abc"
grep -q "KVFERRY_WK_SPIN_US: invalid value 'abc' for 'spin_us': expected an integer" "$tmp/out" || fail "spin_us abc: message"
[ "$(run "$worker" --config "$tmp/kvferry.conf" --threads -3 --check)" = 2 ] || fail "--threads -3"
grep -q "value '-3' for 'threads' is out of range 0..1024" "$tmp/out" || fail "--threads -3: message"
[ "$(run "$worker" --config "$tmp/kvferry.conf" --backend gpu --check)" = 2 ] || fail "--backend gpu"
grep -q "expected one of cpu or cuda" "$tmp/out" || fail "--backend gpu: message"
[ "$(run KVFERRY_WK_CUDA_GEMV=fast "$worker" --config "$tmp/kvferry.conf" --check)" = 2 ] || fail "cuda_gemv fast"
grep -q "invalid value 'fast' for 'cuda_gemv': expected one of auto, ffma or mma" "$tmp/out" || fail "cuda_gemv: message"
[ "$(run KVFERRY_WK_CUDA_BATCH_INVARIANT=sometimes "$worker" --config "$tmp/kvferry.conf" --check)" = 2 ] \
  || fail "cuda_batch_invariant sometimes"
grep -q "KVFERRY_WK_CUDA_BATCH_INVARIANT" "$tmp/out" || fail "cuda_batch_invariant: message"
[ "$(run KVFERRY_WK_CUDA_BATCH_INVARIANT=yes "$worker" --config "$tmp/kvferry.conf" --check)" = 0 ] \
  || fail "cuda_batch_invariant yes refused"
echo "ok    bad values from the file, a variable and flags are refused at start, naming key, origin and range"

# unknown section, key, option, variable of the worker's prefix; a missing requirement
printf '[wroker]\nregion = x\n' > "$tmp/typo.conf"
[ "$(run "$worker" --config "$tmp/typo.conf" --check)" = 2 ] || fail "[wroker]"
grep -q "unknown section \[wroker\] (kvferry-worker reads worker)" "$tmp/out" || fail "[wroker]: message"
[ "$(run "$worker" --config "$tmp/kvferry.conf" --dept 2 --check)" = 2 ] || fail "--dept"
grep -q "unknown option '--dept'" "$tmp/out" || fail "--dept: message"
[ "$(run KVFERRY_WK_DEPHT=1 "$worker" --config "$tmp/kvferry.conf" --check)" = 2 ] || fail "KVFERRY_WK_DEPHT"
grep -q "unknown variable KVFERRY_WK_DEPHT" "$tmp/out" || fail "KVFERRY_WK_DEPHT: message"
# ctrld's variables in the same environment are not the worker's business
[ "$(run KVFERRY_PORT=9 "$worker" --config "$tmp/kvferry.conf" --check)" = 0 ] || fail "KVFERRY_PORT broke the worker"
printf '[worker]\nregion = x\n' > "$tmp/short.conf"
[ "$(run "$worker" --config "$tmp/short.conf" --check)" = 2 ] || fail "no model accepted"
grep -q "model is not set: give --model, KVFERRY_WK_MODEL or \[worker\] model" "$tmp/out" || fail "no model: message"
echo "ok    unknown sections, options and variables are refused by name; a missing requirement says where to set it"

# tensor parallelism: a rank needs a tp_size of 1, 2, 4 or 8 above it and a
# ring input (either backend); each refusal names the fix
tpc=(--region r --model m --in ring:a --out ring:b)
[ "$(run "$worker" "${tpc[@]}" --tp-size 2 --tp-rank 1 --check)" = 0 ] || fail "rank 1 of 2 refused"
[ "$(run "$worker" "${tpc[@]}" --tp-size 2 --tp-rank 1 --backend cuda --check)" = 0 ] || fail "a cuda rank refused"
for bad in "--tp-size 3" "--tp-size 2 --tp-rank 2" "--tp-size 2 --in dp"; do
  # shellcheck disable=SC2086 # each case is a list of flags
  [ "$(run "$worker" "${tpc[@]}" $bad --check)" = 2 ] || fail "tensor parallelism with $bad accepted"
  grep -q "run this stage with tp_size 1" "$tmp/out" || fail "$bad: the message names no fix"
done
echo "ok    tensor-parallel ranks that cannot work are refused at start, naming the fix"

# a stage's ranks from one section: instance K-R reads [worker.K] (then its
# own [worker.K-R]) as rank R, role stageK.tpR, on the R-th of tp_devices
cat > "$tmp/tp.conf" <<'CONF'
[worker]
region = kvf_test
model = /nonexistent/model
backend = cuda
[worker.0]
in = ring:serve.s0.in
out = ring:serve.s1.in
tp_size = 2
tp_devices = 2,3
[worker.0-1]
spin_us = 10
CONF
for want in "0|stage worker stage0: .* on device 2, tensor-parallel rank 0 of 2" \
            "0-1|stage worker stage0.tp1: in ring:serve.s0.in, out ring:serve.s1.in, cuda backend on device 3, tensor-parallel rank 1 of 2"; do
  [ "$(run "$worker" --config "$tmp/tp.conf" --instance "${want%%|*}" --check)" = 0 ] || fail "instance ${want%%|*} refused"
  grep -q "${want#*|}" "$tmp/out" || fail "instance ${want%%|*} is not what [worker.0] says"
done
[ "$(run "$worker" --config "$tmp/tp.conf" --instance 0-1 --device 1 --check)" = 2 ] || fail "a device off tp_devices accepted"
grep -q "device 1 (from --device) is not rank 1's of tp_devices '2,3'" "$tmp/out" || fail "device vs tp_devices: message"
[ "$(run "$worker" --config "$tmp/tp.conf" --instance 0-1 --tp-devices 1,2,3 --check)" = 2 ] || fail "3 devices for 2 ranks"
grep -q "names 3 devices for the stage's 2 ranks" "$tmp/out" || fail "tp_devices count: message"
echo "ok    instance K-R is rank R of [worker.K]'s stage (role stageK.tpR, the R-th of tp_devices); mismatches are named"

# --print-config writes a [worker] section every key of which parses back
"$worker" --print-config > "$tmp/print.conf" || fail "--print-config"
grep -q "^\[worker\]" "$tmp/print.conf" || fail "--print-config has no [worker]"
sed -e 's/^#\([a-z_]* = \)/\1/' "$tmp/print.conf" > "$tmp/uncommented.conf"
[ "$(run "$worker" --config "$tmp/uncommented.conf" --region r --model m --in ring:a --out ring:b --check)" = 0 ] \
  || fail "the printed defaults do not parse back"
echo "ok    --print-config writes every key's default, and that file parses back"
