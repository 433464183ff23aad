#!/usr/bin/env bash
# The CUDA engine's measuring knobs (KVFERRY_CUDA_*) that name a choice
# refuse a value that names none, listing the choices, before anything
# touches a GPU (so this runs anywhere the CUDA module is built); a value
# they know is never refused as a knob.
#   cuda_knobs.sh KVFERRY_GENERATE MODEL_DIR
set -u
gen=$1 model=$2
fail() { echo "FAIL: $*"; exit 1; }
run() { env "$@" "$gen" --model "$model" --backend cuda --prompt hi --max-tokens 1 2>&1; }
out=$(run KVFERRY_CUDA_LINEAR=family)
echo "$out" | grep -q "cuda module\|kvferry-cuda.so" && ! echo "$out" | grep -q "names no choice" \
  && { echo "SKIP: no CUDA module to load: $out"; exit 77; }
for kv in KVFERRY_CUDA_LINEAR=family:default,wg KVFERRY_CUDA_ATTN_RUNS=256:0,64,128 KVFERRY_CUDA_WIDE_X=f32:bf16,split \
          KVFERRY_CUDA_ATTN=columns:auto,column,tile KVFERRY_CUDA_GEMV=FFMA:auto,ffma,mma KVFERRY_CUDA_ATTN_EXACT=yes:0,1,auto \
          KVFERRY_CUDA_WIDE=wg:cublas,mma KVFERRY_CUDA_DEFER=some:none,qkv_gate_up,all,auto KVFERRY_CUDA_ATTN_STEPS=32:16,64; do
  set=${kv%%:*} words=${kv#*:}
  out=$(run "$set")
  echo "$out" | grep -qF "$set names no choice; give one of ${words//,/, }, or unset it" \
    || fail "$set was not refused naming the choices: $out"
done
echo "ok    9 knobs set to a word they do not know refuse the stage, naming their choices"
for set in KVFERRY_CUDA_LINEAR=wg KVFERRY_CUDA_ATTN_RUNS=128 KVFERRY_CUDA_WIDE_X=split KVFERRY_CUDA_ATTN=tile \
           KVFERRY_CUDA_GEMV=mma KVFERRY_CUDA_ATTN_EXACT=auto KVFERRY_CUDA_WIDE=cublas KVFERRY_CUDA_DEFER=qkv_gate_up KVFERRY_CUDA_ATTN_STEPS=64; do
  out=$(run "$set")
  ! echo "$out" | grep -q "names no choice" || fail "$set was refused: $out"
done
echo "PASS: the CUDA knobs refuse words they do not know and take the ones they do"
