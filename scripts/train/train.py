#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Train models/ferry: a byte-level BPE tokenizer and a small Llama decoder on
the corpus of scripts/corpus, on one GPU (PyTorch, transformers, tokenizers),
and write the model directory in Hugging Face layout through transformers'
save_pretrained. scripts/train/NOTES.md has the exact commands and figures.

  train.py --corpus .ferrycorpus/corpus.jsonl.xz --out DIR [--seconds S]
           [--epochs E] [--vocab V] [--layers L] [--hidden H] [--ffn I]
           [--heads N] [--kv-heads K] [--seq T] [--batch B] [--lr LR] [--seed S]
           [--cache DIR] [--toy]

The schedule is planned from the measured step time: after a few timed steps
the number of steps becomes min(epochs worth of tokens, what fits in
--seconds), and the cosine learning-rate schedule is laid over that. The
held-out loss (documents scripts/corpus marked "heldout", never trained on)
is measured every eval interval; the weights with the lowest one are saved.
The saved checkpoint (bf16) is then reloaded with AutoModelForCausalLM and
its held-out loss measured again in f32, with greedy samples from
transformers' generate; metrics.json lands beside DIR.

--toy: a 2-layer model on 2% of the corpus, about 5 s of steps (checks the
whole path in seconds; runs on CPU too when no GPU is there).
"""
import argparse
import json
import lzma
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenizer as ferry_tok  # noqa: E402

SAMPLE_PROMPTS = [
    "In the beginning",
    "The Debian package manager",
    "A good programmer",
    "<|im_start|>user\nTell me a fortune.<|im_end|>\n<|im_start|>assistant\n",
]


def log(*a):
    print(*a, flush=True)


def load_corpus(path, frac=1.0):
    train, held = [], []
    with lzma.open(path, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f):
            if frac < 1.0 and (i * 7919) % 1000 >= frac * 1000:
                continue
            d = json.loads(line)
            (held if d["split"] == "heldout" else train).append(d["text"])
    return train, held


def encode_stream(tok, docs, eos):
    """All documents as one id stream, each followed by <|endoftext|>."""
    ids = []
    for enc in tok.encode_batch(docs, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.int32)


def build_model(a, vocab, eos_ids, pad_id):
    from transformers import LlamaConfig, LlamaForCausalLM

    kw = dict(vocab_size=vocab, hidden_size=a.hidden, intermediate_size=a.ffn,
              num_hidden_layers=a.layers, num_attention_heads=a.heads,
              num_key_value_heads=a.kv_heads, head_dim=a.hidden // a.heads,
              max_position_embeddings=a.seq, rms_norm_eps=1e-5, tie_word_embeddings=True,
              bos_token_id=None, eos_token_id=eos_ids, pad_token_id=pad_id,
              attention_bias=False, mlp_bias=False, hidden_act="silu")
    try:  # transformers 5: rope settings live in rope_parameters
        cfg = LlamaConfig(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **kw)
    except TypeError:
        cfg = LlamaConfig(rope_theta=10000.0, **kw)
    return LlamaForCausalLM(cfg)


@torch.no_grad()
def heldout_loss(model, stream, seq, batch, dev, amp):
    """Mean cross-entropy (nats/token) over the held-out stream in
    non-overlapping windows of seq tokens; also the token count."""
    model.eval()
    n = (len(stream) - 1) // seq
    tot, cnt = 0.0, 0
    for s in range(0, n, batch):
        idx = torch.arange(s, min(n, s + batch)) * seq
        x = torch.stack([stream[i:i + seq] for i in idx.tolist()]).long().to(dev)
        y = torch.stack([stream[i + 1:i + seq + 1] for i in idx.tolist()]).long().to(dev)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(input_ids=x).logits
        tot += F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1), reduction="sum").item()
        cnt += y.numel()
    model.train()
    return tot / max(cnt, 1), cnt


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=230)
    ap.add_argument("--epochs", type=float, default=20)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--ffn", type=int, default=704)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--evals", type=int, default=16, help="held-out evaluations over the run")
    ap.add_argument("--seed", type=int, default=15)
    ap.add_argument("--toy", action="store_true")
    ap.add_argument("--cache", help="keep the trained tokenizer and the id streams here and reuse them")
    a = ap.parse_args()
    if a.toy:
        a.layers, a.seconds, a.vocab, a.seq, a.batch, a.evals, a.warmup = 2, 5, 1024, 128, 8, 2, 5
    torch.manual_seed(a.seed)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    amp = dev.type == "cuda"
    if amp:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    import tokenizers
    import transformers
    log("train: torch %s, transformers %s, tokenizers %s, device %s" %
        (torch.__version__, transformers.__version__, tokenizers.__version__,
         torch.cuda.get_device_name(0) if amp else "cpu"))

    t0 = time.time()
    train_docs, held_docs = load_corpus(a.corpus, 0.02 if a.toy else 1.0)
    tb = sum(len(d.encode()) for d in train_docs)
    hb = sum(len(d.encode()) for d in held_docs)
    log("train: corpus %d train docs (%.1f MB), %d held-out docs (%.2f MB)" %
        (len(train_docs), tb / 1e6, len(held_docs), hb / 1e6))
    if a.cache and os.path.exists(os.path.join(a.cache, "ids.pt")):
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(os.path.join(a.cache, "tokenizer.json"))
        train_ids, held_ids = torch.load(os.path.join(a.cache, "ids.pt"))
        eos = tok.token_to_id("<|endoftext|>")
        log("train: tokenizer and ids from %s" % a.cache)
    else:
        tok = ferry_tok.train_tokenizer(train_docs, a.vocab)
        eos = tok.token_to_id("<|endoftext|>")
        train_ids = encode_stream(tok, train_docs, eos)
        held_ids = encode_stream(tok, held_docs, eos)
        if a.cache:
            os.makedirs(a.cache, exist_ok=True)
            tok.save(os.path.join(a.cache, "tokenizer.json"))
            torch.save((train_ids, held_ids), os.path.join(a.cache, "ids.pt"))
    im_end = tok.token_to_id("<|im_end|>")
    log("train: tokenizer %d ids in %.1f s; %d train tokens (%.2f bytes/token), %d held-out tokens" %
        (tok.get_vocab_size(), time.time() - t0, len(train_ids), tb / len(train_ids), len(held_ids)))

    model = build_model(a, tok.get_vocab_size(), [eos, im_end], eos).to(dev)
    nparam = sum(p.numel() for p in model.parameters())
    log("train: model %s, %d layers, hidden %d, ffn %d, heads %d/%d, vocab %d, tied: %.2fM parameters" %
        (type(model).__name__, a.layers, a.hidden, a.ffn, a.heads, a.kv_heads, tok.get_vocab_size(), nparam / 1e6))
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    nodecay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, **({"fused": True} if amp else {}))
    g = torch.Generator().manual_seed(a.seed)
    n_train = len(train_ids)
    tok_per_step = a.batch * a.seq

    def batch():
        idx = torch.randint(0, n_train - a.seq - 1, (a.batch,), generator=g)
        x = torch.stack([train_ids[i:i + a.seq + 1] for i in idx.tolist()]).long()
        x = x.pin_memory().to(dev, non_blocking=True) if amp else x
        return x[:, :-1], x[:, 1:]

    def step(lr):
        for grp in opt.param_groups:
            grp["lr"] = lr
        x, y = batch()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(input_ids=x).logits
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    # Plan: time a few warm-up steps, then size the run to the budget.
    model.train()
    probe = 5 if a.toy else 30
    for i in range(probe):
        loss = step(a.lr * (i + 1) / a.warmup)
    if amp:
        torch.cuda.synchronize()
    t1 = time.time()
    for i in range(probe, 2 * probe):
        loss = step(a.lr * (i + 1) / a.warmup)
    if amp:
        torch.cuda.synchronize()
    st = (time.time() - t1) / probe
    by_time = int(a.seconds / st)
    by_epochs = int(a.epochs * n_train / tok_per_step)
    total = max(2 * probe + 1, min(by_time, by_epochs))
    log("train: %.1f ms/step (%.2fM tokens/s); %d steps = %.2f epochs (by time %d, by epochs %d)" %
        (st * 1e3, tok_per_step / st / 1e6, total, total * tok_per_step / n_train, by_time, by_epochs))

    def lr_at(i):
        if i < a.warmup:
            return a.lr * (i + 1) / a.warmup
        p = (i - a.warmup) / max(1, total - a.warmup)
        return a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, p))))

    every = max(1, total // a.evals)
    best, best_state, best_step, curve = float("inf"), None, -1, []
    t2 = time.time()
    for i in range(2 * probe, total):
        loss = step(lr_at(i))
        if (i + 1) % every == 0 or i + 1 == total:
            hl, _ = heldout_loss(model, held_ids, a.seq, a.batch, dev, amp)
            ep = (i + 1) * tok_per_step / n_train
            curve.append({"step": i + 1, "epoch": round(ep, 2), "train_loss": round(loss.item(), 4),
                          "heldout_loss": round(hl, 4)})
            log("train: step %5d  epoch %5.2f  lr %.2e  train %.4f  held-out %.4f%s" %
                (i + 1, ep, lr_at(i), loss.item(), hl, "  (best)" if hl < best else ""))
            if hl < best:
                best, best_step = hl, i + 1
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    train_s = time.time() - t2
    model.load_state_dict(best_state)

    # Save through transformers in bf16 (what kvferry ships and mmaps).
    os.makedirs(a.out, exist_ok=True)
    model.to(torch.bfloat16)
    model.generation_config.eos_token_id = [eos, im_end]
    model.generation_config.bos_token_id = None
    model.generation_config.pad_token_id = eos
    model.generation_config.do_sample = False
    model.save_pretrained(a.out)
    ferry_tok.write_files(tok, a.out, a.seq)

    # Reload what was written, as a user of transformers would, and measure again.
    from transformers import AutoModelForCausalLM, AutoTokenizer
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        m2 = AutoModelForCausalLM.from_pretrained(a.out, dtype=torch.float32).to(dev)
    except Exception as e:  # report, and measure the same weights in memory
        log("train: WARNING: reloading %s failed: %s" % (a.out, e))
        m2 = model.float()
    hl32, hcnt = heldout_loss(m2, held_ids, a.seq, a.batch, dev, False)
    bpb = hl32 * len(held_ids) / math.log(2) / hb  # the windows' mean taken as every token's
    log("train: saved checkpoint (bf16 weights, f32 compute): held-out loss %.4f nats/token "
        "(%.3f bits/byte) over %d tokens; best at step %d of %d" % (hl32, bpb, hcnt, best_step, total))
    same, samples = None, []
    try:  # what a transformers user sees: the template, the ids, greedy text
        t2k = AutoTokenizer.from_pretrained(a.out)
        conv = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "Tell me a fortune."}]
        rendered = t2k.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
        log("train: chat template renders %r" % rendered)
        probe_text = "In the beginning God created the heaven and the earth. <|im_start|>user\nhi<|im_end|>"
        same = t2k(probe_text)["input_ids"] == tok.encode(probe_text).ids
        log("train: AutoTokenizer ids equal tokenizers' ids: %s" % same)
        for p in SAMPLE_PROMPTS:
            ids = torch.tensor([tok.encode(p).ids], device=dev)
            out = m2.generate(ids, max_new_tokens=48, do_sample=False)
            text = tok.decode(out[0, ids.shape[1]:].tolist(), skip_special_tokens=False)
            samples.append({"prompt": p, "text": text})
            log("train: sample %r -> %r" % (p, text))
    except Exception as e:
        log("train: WARNING: checks with transformers failed: %r" % e)
    files = {f: os.path.getsize(os.path.join(a.out, f)) for f in sorted(os.listdir(a.out))}
    metrics = {"params": nparam, "shape": {k: getattr(a, k) for k in
                                            ("layers", "hidden", "ffn", "heads", "kv_heads", "seq")},
               "vocab": tok.get_vocab_size(), "train_tokens": n_train, "heldout_tokens": len(held_ids),
               "train_bytes": tb, "heldout_bytes": hb, "batch": a.batch, "lr": a.lr,
               "ms_per_step": round(st * 1e3, 2), "steps": total, "best_step": best_step,
               "epochs": round(total * tok_per_step / n_train, 2), "train_seconds": round(train_s, 1),
               "heldout_loss_bf16": round(hl32, 4), "heldout_bits_per_byte": round(bpb, 4),
               "curve": curve, "samples": samples, "files": files, "tokenizer_roundtrip_same": same,
               "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                            "tokenizers": tokenizers.__version__}}
    with open(os.path.join(os.path.dirname(os.path.abspath(a.out)), "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1)
    log("train: wrote %s: %s" % (a.out, ", ".join("%s %d" % kv for kv in files.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
