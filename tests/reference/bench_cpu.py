#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""CPU engine vs PyTorch on the same weights and thread count, same run.

  bench_cpu.py MKMODEL BENCH WORKDIR [THREADS]

Generates the `small` preset (bf16), runs bench_kn_cpu (prefill tokens/s,
decode tokens/s at batch 1/8/32, resident memory), then the same work in
PyTorch (f32 weights widened from the bf16 file, KV cache, torch.matmul on
OpenBLAS), and prints a table with the ratio ours/torch. Exit 77 without
torch.
"""
import json
import os
import subprocess
import sys
import time

# OpenBLAS picks kernels by CPU; on virtual CPUs it may fall back to a slow
# generic core unless told (Zen 2/3 -> ZEN, AVX-512 Intel -> SKYLAKEX).
if "OPENBLAS_CORETYPE" not in os.environ:
    flags = open("/proc/cpuinfo").read()
    os.environ["OPENBLAS_CORETYPE"] = "SKYLAKEX" if "avx512f" in flags else "ZEN" if "AuthenticAMD" in flags else "HASWELL"

try:
    import torch
except ImportError:
    print("SKIP: /usr/bin/python3 cannot import torch")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_ref  # noqa: E402


class TorchModel:
    def __init__(self, d):
        self.cfg = torch_ref.load_config(d)
        self.w = torch_ref.load_weights(d)
        c = self.cfg
        self.inv = torch_ref.inv_freq(c)
        self.head = self.w.get("lm_head.weight", self.w["model.embed_tokens.weight"])
        # Pre-transposed contiguous weights: what a tuned torch user would do.
        self.t = {k: v.t().contiguous() for k, v in self.w.items() if v.dim() == 2}
        self.headT = self.head.t().contiguous()

    def step(self, ids, pos, cache):
        """ids [B], pos int (same for all), cache list of (k, v) [B, nkv, T, hd]."""
        c, w, t = self.cfg, self.w, self.t
        B, nh, nkv, hd, eps = cache[0][0].shape[0], c["nh"], c["nkv"], c["hd"], c["eps"]
        x = w["model.embed_tokens.weight"][ids]
        f = pos.float()[:, None] * self.inv[None, :]
        emb = torch.cat((f, f), dim=-1)
        cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
        for l in range(c["L"]):
            p = "model.layers.%d." % l
            h = torch_ref.rmsnorm(x, w[p + "input_layernorm.weight"], eps)
            q = (h @ t[p + "self_attn.q_proj.weight"]).view(-1, nh, hd)
            k = (h @ t[p + "self_attn.k_proj.weight"]).view(-1, nkv, hd)
            v = (h @ t[p + "self_attn.v_proj.weight"]).view(-1, nkv, hd)
            q = q * cos + torch_ref.rotate_half(q) * sin
            k = k * cos + torch_ref.rotate_half(k) * sin
            kc, vc = cache[l]
            kc = torch.cat((kc, k.view(B, -1, nkv, hd).transpose(1, 2)), dim=2)
            vc = torch.cat((vc, v.view(B, -1, nkv, hd).transpose(1, 2)), dim=2)
            cache[l] = (kc, vc)
            rep = nh // nkv
            qq = q.view(B, -1, nh, hd).transpose(1, 2)
            kk = kc.repeat_interleave(rep, dim=1)
            vv = vc.repeat_interleave(rep, dim=1)
            Tq, Tk = qq.shape[2], kk.shape[2]
            att = (qq @ kk.transpose(2, 3)) * (hd ** -0.5)
            if Tq > 1:
                att = att + torch.full((Tq, Tk), float("-inf")).triu(Tk - Tq + 1)
            o = (torch.softmax(att, dim=-1) @ vv).transpose(1, 2).reshape(-1, nh * hd)
            x = x + o @ t[p + "self_attn.o_proj.weight"]
            h = torch_ref.rmsnorm(x, w[p + "post_attention_layernorm.weight"], eps)
            g = h @ t[p + "mlp.gate_proj.weight"]
            u = h @ t[p + "mlp.up_proj.weight"]
            x = x + (torch.nn.functional.silu(g) * u) @ t[p + "mlp.down_proj.weight"]
        x = torch_ref.rmsnorm(x.view(B, -1, c["H"])[:, -1], w["model.norm.weight"], eps)
        return torch.argmax(x @ self.headT, dim=-1)

    def empty_cache(self, B):
        c = self.cfg
        z = torch.zeros(B, c["nkv"], 0, c["hd"])
        return [(z, z) for _ in range(c["L"])]


def torch_bench(d, threads, P, D):
    torch.set_num_threads(threads)
    torch.set_grad_enabled(False)
    m = TorchModel(d)
    V = m.w["model.embed_tokens.weight"].shape[0]
    res = {}
    cache = m.empty_cache(1)
    ids = torch.tensor([(p * 7 + 1) % V for p in range(P)])
    t0 = time.perf_counter()
    m.step(ids, torch.arange(P), cache)
    res["prefill_tok_s"] = P / (time.perf_counter() - t0)
    for B in (1, 8, 32):
        cache = m.empty_cache(B)
        ids = torch.tensor([[(q * 31 + p * 7 + 1) % V for p in range(P)] for q in range(B)]).view(-1)
        last = m.step(ids, torch.arange(P).repeat(B), cache)
        t0 = time.perf_counter()
        for s in range(D):
            last = m.step(last, torch.full((B,), P + s), cache)
        res["decode_b%d_tok_s" % B] = B * D / (time.perf_counter() - t0)
    return res


def main():
    mk, bench, work = sys.argv[1:4]
    threads = int(sys.argv[4]) if len(sys.argv) > 4 else os.cpu_count()
    P, D = 128, 16
    d = os.path.join(work, "small")
    os.makedirs(work, exist_ok=True)
    if not os.path.exists(os.path.join(d, "model.safetensors")):
        subprocess.run([mk, "--out", d, "--preset", "small", "--dtype", "bf16"], check=True,
                       stdout=subprocess.DEVNULL)
    ours = json.loads(subprocess.run([bench, d, str(threads), str(P), str(D)], check=True,
                                     stdout=subprocess.PIPE, text=True).stdout)
    ref = torch_bench(d, threads, P, D)
    print("small preset (%s), %d threads, prompt %d, %d decode steps; torch %s, OPENBLAS_CORETYPE=%s" %
          (d, threads, P, D, torch.__version__, os.environ["OPENBLAS_CORETYPE"]))
    print("| metric | kvferry CPU tok/s | PyTorch tok/s | ratio |")
    print("| --- | --- | --- | --- |")
    for k in ("prefill_tok_s", "decode_b1_tok_s", "decode_b8_tok_s", "decode_b32_tok_s"):
        print("| %s | %.1f | %.1f | %.2fx |" % (k[:-6], ours[k], ref[k], ours[k] / ref[k]))
    mib = 1 << 20
    print("resident %.1f MiB vs budget %.1f MiB (weights as stored %.1f + KV %.1f + 64; workspace %.1f)" %
          (ours["rss_bytes"] / mib, ours["budget_bytes"] / mib, ours["weight_bytes"] / mib,
           ours["kv_bytes"] / mib, ours["workspace_bytes"] / mib))
    return 0


if __name__ == "__main__":
    sys.exit(main())
