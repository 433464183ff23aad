#!/usr/bin/env bash
# scripts/gpu-kernel-times on saved ncu tables (no GPU needed): the steps are
# found as the run's repeating tail, the setup before them is left out, each
# kernel's time a step is the mean over the steps, in any of ncu's units;
# tables without steps or without durations are refused by name.
#   gpu_kernel_times.sh SOURCE_ROOT
set -u
tool=$1/scripts/gpu-kernel-times
tmp=$(mktemp -d /tmp/kvf-ktimes-test-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

hdr='"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
id=0
row() { # NAME UNIT VALUE
  printf '"%d","1","bench_cuda","h","%s","1","7","(128, 1, 1)","(8, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","%s","%s"\n' \
    "$id" "$1" "$2" "$3"
  id=$((id + 1))
}
# two fills, then three steps of embed, two layers of (gemm, attn), sample;
# the gemm takes 1,000 / 1,100 / 1,200 ns in the three steps (mean 1,100 a
# launch, 2,200 a step), attn 2 us, the others 500 ns
{
  echo '==PROF== Connected to process 1 (bench_cuda)'
  echo "$hdr"
  row 'fill_bf16_kernel(__nv_bfloat16 *, unsigned long)' ns '9,000'
  row 'fill_bf16_kernel(__nv_bfloat16 *, unsigned long)' ns '9,000'
  for g in 1,000 1,100 1,200; do
    row 'embed_kernel(const int *)' ns 500
    for _ in 1 2; do
      row 'void gemm_wgt_kernel<256, 2, 2, 0>(CUtensorMap_st, float *)' ns "$g"
      row 'void attn_tile_kernel<128, 4, 0, 1, 0, 1>(kn_cu_attn_args, int)' usecond 2
    done
    row 'sample_kernel(const float *)' ns 500
  done
} > "$tmp/run.csv"
out=$("$tool" --csv "$tmp/run.csv") || fail "a table of three steps: exit $?: $out"
echo "$out"
echo "$out" | grep -Eq '^ +2\.2 .* 2  gemm_wgt_kernel<256, 2, 2, 0>$' || fail "gemm: 2 launches, 2.2 us a step"
echo "$out" | grep -Eq '^ +4\.0 .* 2  attn_tile_kernel<128, 4, 0, 1, 0, 1>$' || fail "attn: 2 us a launch (usecond) x 2"
echo "$out" | grep -Eq '^ +0\.5 .* 1  sample_kernel$' || fail "sample: 0.5 us"
echo "$out" | grep -Eq '^ +7\.2 +100\.0% +6  all: a period of 6 launches, the last 3 of the run averaged$' \
  || fail "the step: 6 launches, 7.2 us, three of them"
echo "$out" | grep -q '(2 launch(es) before them left out: 18.0 us)' || fail "the fills left out"
echo "ok    a saved ncu table: steps found, setup left out, units read, means a step"

{ echo "$hdr"; row 'a_kernel()' ns 1; row 'b_kernel()' ns 1; } > "$tmp/once.csv"
out=$("$tool" --csv "$tmp/once.csv" 2>&1) && fail "a table without repeats was accepted: $out"
echo "$out" | grep -q "do not repeat" || fail "a table without repeats: $out"
echo 'no table here' > "$tmp/none.csv"
out=$("$tool" --csv "$tmp/none.csv" 2>&1) && fail "a file without a table was accepted: $out"
echo "$out" | grep -q "printed no kernel table" || fail "a file without a table: $out"
out=$("$tool" --csv "$tmp/missing.csv" 2>&1); [ $? = 2 ] || fail "a missing file: not exit 2"
echo "$out" | grep -q "cannot read" || fail "a missing file: $out"
out=$("$tool" -x 2>&1); [ $? = 2 ] && echo "$out" | grep -q "unknown option -x" || fail "an unknown option: $out"
echo "ok    tables without steps or durations, missing files and unknown options are refused by name"
