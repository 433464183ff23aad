#!/usr/bin/env bash
# The GPU part of training models/ferry, in one command from the repository
# root on a machine with one GPU, PyTorch, transformers and tokenizers:
#
#   scripts/train/device.sh CORPUS OUTDIR
#
# 1. a toy run of train.py (the whole path in seconds: a failure costs no
#    real run); 2. the candidate runs, the same model trained for each epoch
#    count in FERRY_EPOCHS (default "20", what models/ferry shipped with;
#    "4 10" was the first comparison, NOTES.md; one tokenizer, trained once
#    and reused), each capped at FERRY_SECONDS of training (default 230);
#    3. the candidate with the lowest held-out loss is copied to OUTDIR/ferry
#    with OUTDIR/metrics.json; every run's log is OUTDIR/eN.log. At most 8
#    files come back from the GPU machine: OUTDIR holds no more.
set -euo pipefail
corpus=$1 out=$2
export PYTHONUNBUFFERED=1
here=$(dirname "$0")
work=$(mktemp -d /tmp/ferry-train.XXXXXX)
mkdir -p "$out"

if ! python3 "$here/train.py" --toy --corpus "$corpus" --out "$work/toy/ferry" >"$work/toy.log" 2>&1; then
  cat "$work/toy.log"
  exit 1
fi
echo "toy run: $(grep -c '' "$work/toy.log") lines, $(grep 'held-out loss' "$work/toy.log")"

best="" best_loss=""
for e in ${FERRY_EPOCHS:-20}; do
  python3 "$here/train.py" --corpus "$corpus" --out "$work/e$e/ferry" --epochs "$e" \
    --seconds "${FERRY_SECONDS:-230}" --cache "$work/cache" >"$out/e$e.log" 2>&1 || { cat "$out/e$e.log"; exit 1; }
  grep -v '^train: step' "$out/e$e.log" | grep -v '^train: sample' || true
  grep '^train: step' "$out/e$e.log" | tail -4
  loss=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["heldout_loss_bf16"])' "$work/e$e/metrics.json")
  echo "epochs $e: held-out loss $loss"
  if [ -z "$best" ] || python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) < float(sys.argv[2]) else 1)' "$loss" "$best_loss"; then
    best=$e best_loss=$loss
  fi
done
echo "best: epochs $best, held-out loss $best_loss"
cp -r "$work/e$best/ferry" "$out/ferry"
cp "$work/e$best/metrics.json" "$out/metrics.json"
grep '^train: sample' "$out/e$best.log"
sha256sum "$out/ferry/"*
