#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Integration checks of the shipped model, models/ferry (a model written by
transformers' save_pretrained, not by kvferry-mkmodel), on the CPU engine:

  check_ferry.py torch    MODEL GENERATE TOK WORKDIR
      kvferry-generate loads it; at every prompt position its logits are
      within TOL (max relative error) of torch_ref.py's, and its 48-token
      greedy continuation equals PyTorch's, on 1 and 2 stages.
  check_ferry.py tokenizer MODEL TOK CASES REF
      kvferry-tok's ids for every case (tests/kernels/data/ferry_tok_cases.jsonl:
      2,400 strings of many scripts, whitespace runs, emoji and special-token
      text, and 195 held-out English paragraphs) equal Hugging Face
      tokenizers' ids recorded on the GPU machine (ferry_tok_ids.jsonl, by
      tests/reference/ferry_tok_ref.py), and its decode equals tokenizers'.
  check_ferry.py english  MODEL GENERATE PROMPTS READABLE MIN WORKDIR
      the greedy continuations (80 tokens, stopping at eos as served) of the
      prompts scripts/run sends are mostly English words: scripts/readable
      over their text is at least MIN.

Exit 0 on success, 1 on a failure, 77 when /usr/bin/python3 lacks torch
(torch mode) or the word list is missing (english mode).
"""
import json
import os
import subprocess
import sys

TOL = 1e-4
GREEDY = 48
ENGLISH_TOKENS = 80

PROMPTS = [
    "In the beginning God created the heaven and the earth.",
    "The Debian package manager",
    "<|im_start|>user\nTell me a fortune.<|im_end|>\n<|im_start|>assistant\n",
]


def run(cmd, stdin=None):
    r = subprocess.run(cmd, input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(cmd), r.returncode, r.stderr.strip()))
    return r.stdout


def encode(tok, model, text):
    return json.loads(run([tok, "encode", "--model", model], json.dumps({"text": text})))["ids"]


def generated(out):
    """ids and text from kvferry-generate's stdout ("ids: 1,2,3" / "text: ...")."""
    ids = [int(t) for t in out.split("ids:")[1].split("\n")[0].split(",") if t.strip()]
    text = out.split("text:", 1)[1].strip("\n") if "text:" in out else ""
    return ids, text


def check_torch(model, gen, tok, work):
    try:
        import numpy as np
        import torch
    except ImportError:
        print("SKIP: /usr/bin/python3 cannot import torch/numpy (apt install python3-torch)")
        return 77
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch_ref
    torch.set_grad_enabled(False)
    os.makedirs(work, exist_ok=True)
    cfg = torch_ref.load_config(model)
    w = torch_ref.load_weights(model)
    vocab = w["model.embed_tokens.weight"].shape[0]
    print("model %s: %d layers, hidden %d, heads %d/%d, head_dim %d, vocab %d, tied %s" %
          (model, cfg["L"], cfg["H"], cfg["nh"], cfg["nkv"], cfg["hd"], vocab, cfg["tie"]))
    failures = 0
    for pi, text in enumerate(PROMPTS):
        ids = encode(tok, model, text)
        stages = 1 + pi % 2
        lf = os.path.join(work, "ferry-%d.f32" % pi)
        out = run([gen, "--model", model, "--ids", ",".join(map(str, ids)), "--max-tokens", str(GREEDY),
                   "--ignore-eos", "--logits", lf, "--chunk", "16", "--stages", str(stages), "--threads", "1"])
        ours = np.fromfile(lf, dtype=np.float32).reshape(len(ids), vocab)
        ref = torch_ref.forward(cfg, w, ids).numpy()
        rel = (np.abs(ours - ref).max(axis=1) / np.abs(ref).max(axis=1)).max()
        got, _ = generated(out)
        seq, want, margin = list(ids), [], float("inf")
        for _ in range(GREEDY):
            lg = torch_ref.forward(cfg, w, seq)[-1]
            top = torch.topk(lg, 2).values
            margin = min(margin, float(top[0] - top[1]))
            nxt = int(torch.argmax(lg))
            want.append(nxt)
            seq.append(nxt)
        ok = rel <= TOL and got == want
        print("prompt %d (%d tokens, %d stages): max rel err %.2e (tolerance %.0e), %d-token greedy %s, "
              "smallest top-2 logit gap %.3g" % (pi, len(ids), stages, rel, TOL, GREEDY,
                                                 "same" if got == want else "DIFFERS", margin))
        if got != want:
            print("  ours:  ", got)
            print("  torch: ", want)
        failures += not ok
    print("%d failures" % failures)
    return 1 if failures else 0


def check_tokenizer(model, tok, cases, ref):
    import hashlib
    with open(cases, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f if line.strip()]
    with open(ref, encoding="utf-8") as f:
        head = json.loads(f.readline())
        want = [json.loads(line) for line in f if line.strip()]
    with open(os.path.join(model, "tokenizer.json"), "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    if sha != head["tokenizer_sha256"]:
        print("FAIL: %s/tokenizer.json has sha256 %s; %s was recorded for %s: rerun "
              "tests/reference/ferry_tok_ref.py where tokenizers is installed" %
              (model, sha, ref, head["tokenizer_sha256"]))
        return 1
    got = [json.loads(line)["ids"] for line in
           run([tok, "encode", "--model", model], "".join(json.dumps({"text": t}) + "\n" for t in texts)).split("\n") if line]
    dec = [json.loads(line)["text"] for line in
           run([tok, "decode", "--model", model], "".join(json.dumps({"ids": w["ids"]}) + "\n" for w in want)).split("\n") if line]
    bad_ids = [i for i in range(len(texts)) if got[i] != want[i]["ids"]]
    bad_dec = [i for i in range(len(texts)) if dec[i] != want[i]["decoded"]]
    for i in bad_ids[:5]:
        print("ids differ for %r:\n  ours:       %s\n  tokenizers: %s" % (texts[i], got[i], want[i]["ids"]))
    for i in bad_dec[:5]:
        print("decode differs for %s: ours %r, tokenizers %r" % (want[i]["ids"], dec[i], want[i]["decoded"]))
    print("%d cases (tokenizers %s): ids identical %d, decodes identical %d" %
          (len(texts), head["tokenizers"], len(texts) - len(bad_ids), len(texts) - len(bad_dec)))
    return 1 if bad_ids or bad_dec or len(got) != len(texts) else 0


def check_english(model, gen, prompts, readable, minimum, work):
    os.makedirs(work, exist_ok=True)
    with open(prompts, encoding="utf-8") as f:
        ps = [p.rstrip("\n") for p in f if p.strip() and not p.startswith("#")]
    texts = []
    for p in ps:
        out = run([gen, "--model", model, "--prompt", p, "--max-tokens", str(ENGLISH_TOKENS), "--threads", "1"])
        _, text = generated(out)
        print(">>> %s\n%s\n" % (p, text))
        texts.append(text)
    path = os.path.join(work, "ferry-english.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(texts))
    r = subprocess.run([readable, "--min", str(minimum), path])
    return r.returncode


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "torch" and len(sys.argv) == 6:
        return check_torch(*sys.argv[2:6])
    if mode == "tokenizer" and len(sys.argv) == 6:
        return check_tokenizer(*sys.argv[2:6])
    if mode == "english" and len(sys.argv) == 8:
        return check_english(*sys.argv[2:8])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
