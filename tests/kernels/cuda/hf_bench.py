#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Hugging Face transformers decode speed, the reference the CUDA engine's
decode benchmark is printed beside: Llama-3 1B / 8B shapes, random bf16
weights (speed does not depend on the values), eager decode with a KV cache
after a prefill to the context, a few steps per batch size.

  hf_bench.py   prints RESULT kind=hf_decode model= ctx= batch= tok_s=
"""
import sys
import time

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

SHAPES = {
    "llama3-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                      tie_word_embeddings=True),
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                      tie_word_embeddings=False),
}
RUNS = {512: [1, 8, 32, 64, 128, 256], 4096: [1, 8, 32]}

for name, kw in SHAPES.items():
    cfg = LlamaConfig(vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0, **kw)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    for ctx, batches in RUNS.items():
        for b in batches:
            try:
                with torch.no_grad():
                    ids = torch.randint(0, 1000, (b, ctx - 1), device="cuda")
                    out = model(ids, use_cache=True, logits_to_keep=1)
                    cache = out.past_key_values
                    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
                    times = []
                    for step in range(5):
                        torch.cuda.synchronize()
                        t0 = time.perf_counter()
                        out = model(nxt, past_key_values=cache, use_cache=True)
                        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
                        torch.cuda.synchronize()
                        times.append(time.perf_counter() - t0)
                    del out, cache
                dt = sorted(times[1:])[len(times[1:]) // 2]
                print(f"RESULT kind=hf_decode model={name} ctx={ctx} batch={b} tok_s={b / dt:.1f}", flush=True)
            except torch.OutOfMemoryError:
                print(f"RESULT kind=hf_decode model={name} ctx={ctx} batch={b} skipped=oom", flush=True)
            torch.cuda.empty_cache()
    del model
    torch.cuda.empty_cache()
