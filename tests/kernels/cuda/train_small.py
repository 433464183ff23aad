#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Train a generated model directory for a few hundred steps on local text.

  train_small.py MODEL_DIR IDS_OUT [STEPS]

Random weights give nearly flat next-token distributions (mean top-1
probability ~0.03, half the top-1 - top-2 gaps under 0.2 logit std), so any
rounding at the 1e-3 level flips a few percent of the argmaxes, and top-1 or
greedy agreement measures tie-breaking rather than the engine. A model
trained on text predicts text the way a deployed one does: most positions
peaked, a few genuinely uncertain. That is the model the agreement checks
are asserted on (the random-weight figures are still printed beside them).

Corpus: the Python standard library's sources on this machine (sorted; every
tenth file held out). The model directory's own tokenizer.json tokenizes it.
Trains in f32 master weights with bf16 autocast (AdamW, warm-up then cosine),
then writes the weights back as bf16 into MODEL_DIR/model.safetensors (same
tensor names; config.json untouched) and the first 4,096 held-out token ids
to IDS_OUT (comma-separated), for the teacher-forced and greedy checks.
Prints the held-out loss and flatness before and after.
Exit 0 / 1; 77 without torch+CUDA.
"""
import glob
import math
import os
import sys
import sysconfig
import time

from gpu_python import require

require("torch", "safetensors", "tokenizers", "transformers")
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

d, ids_out = sys.argv[1], sys.argv[2]
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 600
SEQ, BATCH, TEXT_BYTES = 512, 32, 24 << 20
torch.manual_seed(0)

tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "**", "*.py"), recursive=True))
train_txt, held_txt, size = [], [], 0
for i, f in enumerate(files):
    try:
        t = open(f, encoding="utf-8").read()
    except (UnicodeDecodeError, OSError):
        continue
    (held_txt if i % 10 == 9 else train_txt).append(t)
    size += len(t)
    if size > TEXT_BYTES:
        break
if not train_txt or not held_txt:
    print(f"FAIL no Python sources found under {sysconfig.get_paths()['stdlib']}")
    sys.exit(1)


def ids_of(texts):
    out = []
    for e in tok.encode_batch(texts, add_special_tokens=False):
        out.extend(e.ids)
    return torch.tensor(out, dtype=torch.long)


train, held = ids_of(train_txt), ids_of(held_txt)
print(f"info corpus: {len(train_txt)} files, {train.numel()} training tokens, {held.numel()} held out")

model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).cuda()
vocab = model.config.vocab_size
if int(train.max()) >= vocab:
    print(f"FAIL tokenizer id {int(train.max())} >= vocab_size {vocab}")
    sys.exit(1)


def held_stats():
    model.eval()
    x = held[: 8 * SEQ].view(8, SEQ).cuda()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        lg = model(x).logits.float()
    loss = torch.nn.functional.cross_entropy(lg[:, :-1].reshape(-1, vocab), x[:, 1:].reshape(-1)).item()
    p = torch.softmax(lg, -1).amax(-1).mean().item()
    top2 = lg.topk(2, -1).values
    gap = ((top2[..., 0] - top2[..., 1]) / lg.std(-1)).median().item()
    model.train()
    return loss, p, gap


loss0, p0, g0 = held_stats()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
warm = max(1, steps // 10)
sched = torch.optim.lr_scheduler.LambdaLR(
    opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps))))
t0 = time.time()
model.train()
for s in range(steps):
    starts = torch.randint(0, train.numel() - SEQ - 1, (BATCH,))
    x = torch.stack([train[i: i + SEQ + 1] for i in starts.tolist()]).cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        lg = model(x[:, :-1]).logits.float()
    loss = torch.nn.functional.cross_entropy(lg.reshape(-1, vocab), x[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
torch.cuda.synchronize()
loss1, p1, g1 = held_stats()
name = os.path.basename(d.rstrip("/"))
print(f"info trained {name}: {steps} steps x {BATCH} x {SEQ} tokens in {time.time() - t0:.1f} s; held-out loss "
      f"{loss0:.2f} -> {loss1:.2f} nats, mean top-1 prob {p0:.3f} -> {p1:.3f}, median top-1 - top-2 gap "
      f"{g0:.3f} -> {g1:.3f} std")
print(f"RESULT kind=trained model={name} steps={steps} loss0={loss0:.3f} loss1={loss1:.3f} ptop={p1:.4f} gap_std={g1:.4f}")

state = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in model.state_dict().items()}
if model.config.tie_word_embeddings:
    state.pop("lm_head.weight", None)
for f in glob.glob(os.path.join(d, "*.safetensors")) + glob.glob(os.path.join(d, "*.safetensors.index.json")):
    os.remove(f)
save_file(state, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
with open(ids_out, "w") as f:
    f.write(",".join(map(str, held[:4096].tolist())) + "\n")
# A model that did not learn would make the checks as flat as random weights.
sys.exit(0 if loss1 < loss0 - 1.0 else 1)
