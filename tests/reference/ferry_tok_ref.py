#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Reference ids of models/ferry's tokenizer from Hugging Face `tokenizers`
(installed on the GPU machine, not on CI), for the ferry_tokenizer_matches_hf
test to pin:

  ferry_tok_ref.py MODEL_DIR CASES.jsonl OUT.jsonl

CASES: {"text": ...} lines (tests/kernels/data/ferry_tok_cases.jsonl). OUT:
one {"ids": [...], "decoded": ...} line per case, encoded as transformers'
encode(text, add_special_tokens=False) does (special-token text becomes the
special token) and decoded without skipping special tokens; the first line is
{"tokenizer_sha256": ..., "tokenizers": VERSION}.
"""
import hashlib
import json
import sys

from tokenizers import Tokenizer, __version__


def main():
    model, cases, out = sys.argv[1:4]
    path = model + "/tokenizer.json"
    tok = Tokenizer.from_file(path)
    with open(path, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    with open(cases, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f if line.strip()]
    with open(out, "w", encoding="utf-8") as f:
        f.write(json.dumps({"tokenizer_sha256": sha, "tokenizers": __version__}) + "\n")
        for t, enc in zip(texts, tok.encode_batch(texts, add_special_tokens=False)):
            f.write(json.dumps({"ids": enc.ids, "decoded": tok.decode(enc.ids, skip_special_tokens=False)},
                               ensure_ascii=False) + "\n")
    print("ferry_tok_ref: %d cases, tokenizer.json sha256 %s" % (len(texts), sha))
    return 0


if __name__ == "__main__":
    sys.exit(main())
