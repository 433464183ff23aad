#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Teacher-forced comparison of the CUDA engine with Hugging Face transformers
on the same model directory (AutoModelForCausalLM, bf16, on the GPU).

  hf_check.py MODEL_DIR GENERATE N_POSITIONS

Runs `GENERATE --model DIR --backend cuda --ids ... --max-tokens 0 --logits F`
on N random ids, runs transformers on the same ids, and compares per
position: top-1 agreement (>= 99% of positions) and relative L2 error of the
logits (<= 2e-2 at every position). Exit 0 / 1; 77 without torch+CUDA.
"""
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM
except ImportError as e:
    print(f"SKIP: {e}")
    sys.exit(77)
if not torch.cuda.is_available():
    print("SKIP: no CUDA device for torch")
    sys.exit(77)

d, gen, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16).cuda().eval()
vocab = model.config.vocab_size
rng = np.random.default_rng(7)
ids = rng.integers(0, vocab, size=n).tolist()
with tempfile.NamedTemporaryFile(suffix=".f32") as f:
    r = subprocess.run([gen, "--model", d, "--backend", "cuda", "--ids", ",".join(map(str, ids)),
                        "--max-tokens", "0", "--no-bos", "--chunk", str(n), "--logits", f.name],
                       capture_output=True, text=True)
    if r.returncode != 0:
        print(f"FAIL {gen}: {r.stderr.strip()}")
        sys.exit(1)
    ours = np.fromfile(f.name, dtype=np.float32).reshape(n, vocab)
with torch.no_grad():
    ref = model(torch.tensor([ids], device="cuda")).logits[0].float().cpu().numpy()
rel = np.linalg.norm(ours - ref, axis=1) / np.maximum(np.linalg.norm(ref, axis=1), 1e-30)
top1 = float(np.mean(ours.argmax(1) == ref.argmax(1)))
ok = top1 >= 0.99 and float(rel.max()) <= 2e-2
print(f"{'ok  ' if ok else 'FAIL'} hf_teacher_forced {os.path.basename(d)} ({model.config.model_type}): "
      f"top-1 agreement {top1 * 100:.1f}% of {n} positions (>= 99%), "
      f"rel err max {rel.max():.3g} mean {rel.mean():.3g} (<= 2e-2)")
print(f"RESULT kind=hf_check model={os.path.basename(d)} top1={top1:.4f} rel_max={rel.max():.4g} ok={int(ok)}")
sys.exit(0 if ok else 1)
