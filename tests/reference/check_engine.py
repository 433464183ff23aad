#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Integration check: kvferry-generate's logits and greedy decode agree with
the PyTorch reference (torch_ref.py) on generated models of every flavour.

  check_engine.py MKMODEL GENERATE WORKDIR

Exit 0 when every model agrees (relative error <= 1e-4 at every prompt
position, identical 64-token greedy decode), 1 otherwise, 77 when
/usr/bin/python3 has no torch.
"""
import os
import subprocess
import sys

try:
    import numpy as np
    import torch  # noqa: F401
except ImportError:
    print("SKIP: /usr/bin/python3 cannot import torch/numpy (apt install python3-torch)")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch_ref  # noqa: E402

TOL = 1e-4
GREEDY = 64

# name, mkmodel flags
MODELS = [
    ("llama-bf16", ["--arch", "llama", "--dtype", "bf16", "--no-tie"]),
    ("llama-f32-tied", ["--arch", "llama", "--dtype", "f32", "--tie"]),
    ("llama-rope-scaling", ["--arch", "llama", "--dtype", "bf16", "--rope-scaling", "--config-style", "4"]),
    ("qwen2-bf16", ["--arch", "qwen2", "--dtype", "bf16", "--tie"]),
    ("qwen2-f32-v4", ["--arch", "qwen2", "--dtype", "f32", "--no-tie", "--config-style", "4"]),
    ("qwen3-bf16", ["--arch", "qwen3", "--dtype", "bf16", "--tie"]),
    ("qwen3-f16-sharded", ["--arch", "qwen3", "--dtype", "f16", "--no-tie", "--shard-mb", "1"]),
]

PROMPTS = [
    [1, 2, 3],
    [100, 7, 42, 300, 5, 5, 5, 17, 250, 9, 64, 33, 120, 77, 8, 91, 200, 3, 4, 160],
    list(range(10, 60)),  # spans several KV blocks
]


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(cmd), r.returncode, r.stderr))
    return r.stdout


def main():
    mk, gen, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    torch.set_grad_enabled(False)
    failures = 0
    for name, flags in MODELS:
        d = os.path.join(work, name)
        run([mk, "--out", d, "--preset", "tiny", "--seed", "7"] + flags)
        cfg = torch_ref.load_config(d)
        w = torch_ref.load_weights(d)
        vocab = w["model.embed_tokens.weight"].shape[0]
        for pi, ids in enumerate(PROMPTS):
            ids_s = ",".join(map(str, ids))
            lf = os.path.join(work, "%s-%d.f32" % (name, pi))
            out = run([gen, "--model", d, "--ids", ids_s, "--max-tokens", str(GREEDY), "--ignore-eos",
                       "--logits", lf, "--chunk", "16", "--stages", str(1 + pi % 3)])
            ours = np.fromfile(lf, dtype=np.float32).reshape(len(ids), vocab)
            ref = torch_ref.forward(cfg, w, ids).numpy()
            rel = (np.abs(ours - ref).max(axis=1) / np.abs(ref).max(axis=1)).max()
            got = [int(t) for t in out.split("ids:")[1].split()[0].split(",")]
            seq, want = list(ids), []
            for _ in range(GREEDY):
                nxt = int(torch.argmax(torch_ref.forward(cfg, w, seq)[-1]))
                want.append(nxt)
                seq.append(nxt)
            ok = rel <= TOL and got == want
            print("%-20s prompt %d (%2d tokens, %d stages): max rel err %.2e, greedy %s, %d distinct of %d" %
                  (name, pi, len(ids), 1 + pi % 3, rel, "same" if got == want else "DIFFERS",
                   len(set(got)), len(got)))
            if got != want:
                print("  ours:  ", got)
                print("  torch: ", want)
            failures += not ok
    print("%d failures" % failures)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
