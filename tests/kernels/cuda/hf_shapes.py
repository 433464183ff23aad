#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Shapes real models have, checked against Hugging Face transformers.

  hf_shapes.py GENERATE [N_POSITIONS]

For each shape below transformers writes a small model of its own (random
weights, bf16, safetensors and config.json as save_pretrained writes them):
head sizes between the powers of two (48, 80, 96, 160), more than 8 heads per
KV head (MQA-like: 16 and 12), GQA ratios that are no power of two (6, 7),
vocabularies that are no multiple of 64 (odd ones too), Qwen2's q/k/v biases
and Qwen3's q/k norms. Then the same ids go through transformers in f32
(model.float(): the function the weights define) and through kvferry's
engines teacher-forced (kvferry-generate --logits): the CUDA engine on a wide
plan (128 columns: cuBLAS, the prefill path) and on a narrow one (16: the
decode path's skinny kernels), and the CPU engine. The relative L2 error of
the logits at every position must stay within 2e-2, or within what
transformers' own bf16 path shows against its f32 (the wide plan rounds
linear inputs to bf16 as that path does; on these random weights both land
near 2e-2), and the CPU engine's within 1e-3.
Exit 0 / 1; 77 without torch, transformers or a CUDA device.
"""
import os
import subprocess
import sys
import tempfile

from gpu_python import require

require("numpy", "torch", "transformers")
import numpy as np
import torch
import transformers

gen = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 96

# (name, config class, hidden, heads, kv heads, head_dim (None: hidden / heads), intermediate, layers, vocab)
SHAPES = [
    ("llama-hd80-g4-v1000", "LlamaConfig", 640, 8, 2, 80, 1280, 2, 1000),
    ("llama-hd48-g1-v1003", "LlamaConfig", 384, 8, 8, 48, 1024, 2, 1003),
    ("llama-hd96-g6-v2053", "LlamaConfig", 768, 12, 2, 96, 1536, 2, 2053),
    ("llama-hd160-g2", "LlamaConfig", 640, 4, 2, 160, 1280, 2, 1536),
    ("llama-hd64-g16-mqa", "LlamaConfig", 512, 16, 1, 64, 1024, 2, 1024),
    ("llama-hd240-g12", "LlamaConfig", 960, 12, 1, 240, 1920, 2, 999),
    ("qwen2-hd64-g7-bias", "Qwen2Config", 896, 14, 2, None, 1792, 2, 1151),
    ("qwen3-hd80-g3-qknorm", "Qwen3Config", 480, 6, 2, 80, 1024, 2, 1000),
]


def write_model(d, cls, hidden, heads, kv, hd, inter, layers, vocab):
    kw = dict(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
              num_key_value_heads=kv, vocab_size=vocab, max_position_embeddings=4096, rms_norm_eps=1e-6,
              rope_theta=10000.0, tie_word_embeddings=False)
    if hd is not None:
        kw["head_dim"] = hd
    cfg = getattr(transformers, cls)(**kw)
    torch.manual_seed(11)
    try:
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    except TypeError:  # transformers before 4.56
        model = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16)
    with torch.no_grad():  # weights large enough that the logits are not flat
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.06)
    model.save_pretrained(d, safe_serialization=True)
    return model


def ours(d, vocab, ids, backend, chunk):
    with tempfile.NamedTemporaryFile(suffix=".f32") as f:
        r = subprocess.run([gen, "--model", d, "--backend", backend, "--ids", ",".join(map(str, ids)),
                            "--max-tokens", "0", "--no-bos", "--chunk", str(chunk), "--logits", f.name],
                           capture_output=True, text=True)
        if r.returncode != 0:
            return None, r.stderr.strip()
        return np.fromfile(f.name, dtype=np.float32).reshape(len(ids), vocab), ""


def rel(a, ref):
    return float((np.linalg.norm(a - ref, axis=1) / np.maximum(np.linalg.norm(ref, axis=1), 1e-30)).max())


fails = 0
for name, cls, hidden, heads, kv, hd, inter, layers, vocab in SHAPES:
    with tempfile.TemporaryDirectory() as d:
        model = write_model(d, cls, hidden, heads, kv, hd, inter, layers, vocab).cuda().eval()
        ids = np.random.default_rng(5).integers(0, vocab, size=n).tolist()
        with torch.no_grad():
            t = torch.tensor([ids], device="cuda")
            ref16 = model(t).logits[0].float().cpu().numpy()
            ref = model.float()(t).logits[0].float().cpu().numpy()
        del model
        torch.cuda.empty_cache()
        line = []
        ok = True
        bf16 = max(2e-2, rel(ref16, ref))
        for tag, backend, chunk, tol in (("cuda-wide", "cuda", 128, bf16), ("cuda-narrow", "cuda", 16, bf16),
                                         ("cpu-f32", "cpu", 128, 1e-3)):
            a, err = ours(d, vocab, ids, backend, chunk)
            if a is None:
                line.append(f"{tag}: failed ({err})")
                ok = False
                continue
            r = rel(a, ref)
            ok &= r <= tol
            line.append(f"{tag} {r:.3g} (<= {tol:.3g})")
            print(f"RESULT kind=hf_shape model={name} ours={tag} rel_max_f32={r:.4g} ok={int(r <= tol)}")
        print(f"{'ok  ' if ok else 'FAIL'} hf_shape {name}: rel L2 of the logits vs HF-f32 over {n} positions: "
              + ", ".join(line) + f"; HF-bf16 itself {rel(ref16, ref):.3g}")
        fails += not ok
print(f"{'PASSED' if fails == 0 else 'FAILED'}: {fails} of {len(SHAPES)} shapes failed")
sys.exit(1 if fails else 0)
