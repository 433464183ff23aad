#!/bin/sh
# A slice of one libFuzzer target, as the fuzz suite and scripts/fuzz run it:
#   run_fuzz.sh TARGET WORK SEEDS [libFuzzer options...]
# WORK (emptied first) takes the inputs the run adds to the corpus
# (WORK/corpus) and the input of any crash, leak or timeout (WORK/crash-*,
# leak-*, timeout-*); SEEDS, the corpus checked in beside the target, is
# only read. Exit status: libFuzzer's (0: nothing found).
set -eu
exe=$1 work=$2 seeds=$3
shift 3
rm -rf "$work"
mkdir -p "$work/corpus"
# leaks are findings; UBSan's stack says where (the tree aborts on UB)
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"
# -error_exitcode: libFuzzer says 77 for a failed check, which meson takes as SKIP
exec "$exe" -artifact_prefix="$work/" -error_exitcode=1 "$@" "$work/corpus" "$seeds"
