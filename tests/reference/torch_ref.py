#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""PyTorch (CPU, f32) reference for kvferry's engines.

Reads a Hugging Face model directory with its own code -- safetensors parsed by
hand (8-byte header length, JSON header, raw data), config.json in every
spelling transformers has used -- and computes the Llama / Qwen2 / Qwen3
forward pass with plain torch ops, independent of kernels/.

  torch_ref.py --model DIR --ids 1,2,3 --logits OUT.f32   logits of every position
  torch_ref.py --model DIR --ids 1,2,3 --greedy 64        greedy ids, one line

Logits files are raw float32, row-major [positions][vocab].
"""
import argparse
import json
import math
import os
import struct
import sys

import torch

DT = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def load_safetensors(path, out):
    with open(path, "rb") as f:
        data = f.read()
    (hlen,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + hlen])
    base = 8 + hlen
    for name, ent in header.items():
        if name == "__metadata__":
            continue
        b, e = ent["data_offsets"]
        buf = bytearray(data[base + b:base + e])
        t = torch.frombuffer(buf, dtype=DT[ent["dtype"]]) if buf else torch.empty(0, dtype=DT[ent["dtype"]])
        out[name] = t.reshape(ent["shape"]).to(torch.float32)


def load_weights(d):
    w = {}
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        files = sorted(set(json.load(open(idx))["weight_map"].values()))
    else:
        files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    for f in files:
        load_safetensors(os.path.join(d, f), w)
    return w


def load_config(d):
    c = json.load(open(os.path.join(d, "config.json")))
    arch = c["architectures"][0]
    rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
    cfg = {
        "arch": {"LlamaForCausalLM": "llama", "MistralForCausalLM": "llama",
                 "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}[arch],
        "H": c["hidden_size"], "L": c["num_hidden_layers"], "nh": c["num_attention_heads"],
        "nkv": c.get("num_key_value_heads") or c["num_attention_heads"],
        "eps": c.get("rms_norm_eps", 1e-6),
        "theta": rope.get("rope_theta", c.get("rope_theta", 10000.0)),
        "tie": c.get("tie_word_embeddings", False),
        "rope_type": rope.get("rope_type", rope.get("type", "default")),
        "rope": rope,
    }
    cfg["hd"] = c.get("head_dim") or cfg["H"] // cfg["nh"]
    return cfg


def inv_freq(cfg):
    hd = cfg["hd"]
    f = 1.0 / (cfg["theta"] ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    if cfg["rope_type"] == "llama3":
        r = cfg["rope"]
        factor, lo, hi = r["factor"], r["low_freq_factor"], r["high_freq_factor"]
        old = r["original_max_position_embeddings"]
        lo_wl, hi_wl = old / lo, old / hi
        wl = 2 * math.pi / f
        scaled = torch.where(wl > lo_wl, f / factor, f)
        smooth = (old / wl - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wl < hi_wl) * ~(wl > lo_wl)
        f = torch.where(medium, smoothed, scaled)
    return f


def rmsnorm(x, w, eps):
    var = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(var + eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def forward(cfg, w, ids):
    """Logits [T, vocab] for a whole sequence (causal)."""
    T = len(ids)
    H, nh, nkv, hd, eps = cfg["H"], cfg["nh"], cfg["nkv"], cfg["hd"], cfg["eps"]
    x = w["model.embed_tokens.weight"][torch.tensor(ids)]
    pos = torch.arange(T, dtype=torch.float32)
    freqs = torch.outer(pos, inv_freq(cfg))
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    mask = torch.full((T, T), float("-inf")).triu(1)
    for l in range(cfg["L"]):
        p = "model.layers.%d." % l
        h = rmsnorm(x, w[p + "input_layernorm.weight"], eps)
        q = h @ w[p + "self_attn.q_proj.weight"].T
        k = h @ w[p + "self_attn.k_proj.weight"].T
        v = h @ w[p + "self_attn.v_proj.weight"].T
        if cfg["arch"] == "qwen2":
            q = q + w[p + "self_attn.q_proj.bias"]
            k = k + w[p + "self_attn.k_proj.bias"]
            v = v + w[p + "self_attn.v_proj.bias"]
        q = q.view(T, nh, hd).transpose(0, 1)
        k = k.view(T, nkv, hd).transpose(0, 1)
        v = v.view(T, nkv, hd).transpose(0, 1)
        if cfg["arch"] == "qwen3":
            q = rmsnorm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rmsnorm(k, w[p + "self_attn.k_norm.weight"], eps)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = nh // nkv
        k = k.repeat_interleave(rep, dim=0)
        v = v.repeat_interleave(rep, dim=0)
        att = (q @ k.transpose(1, 2)) * (hd ** -0.5) + mask
        att = torch.softmax(att, dim=-1)
        o = (att @ v).transpose(0, 1).reshape(T, nh * hd)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        h = rmsnorm(x, w[p + "post_attention_layernorm.weight"], eps)
        g = h @ w[p + "mlp.gate_proj.weight"].T
        u = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(g) * u) @ w[p + "mlp.down_proj.weight"].T
    x = rmsnorm(x, w["model.norm.weight"], eps)
    head = w.get("lm_head.weight")
    if head is None:
        head = w["model.embed_tokens.weight"]
    return x @ head.T


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--ids", required=True)
    ap.add_argument("--logits")
    ap.add_argument("--greedy", type=int, default=0)
    a = ap.parse_args()
    torch.set_grad_enabled(False)
    cfg = load_config(a.model)
    w = load_weights(a.model)
    ids = [int(x) for x in a.ids.split(",")]
    if a.logits:
        forward(cfg, w, ids).contiguous().numpy().astype("float32").tofile(a.logits)
    if a.greedy:
        seq = list(ids)
        out = []
        for _ in range(a.greedy):
            nxt = int(torch.argmax(forward(cfg, w, seq)[-1]))
            out.append(nxt)
            seq.append(nxt)
        print(",".join(str(t) for t in out))


if __name__ == "__main__":
    sys.exit(main())
