#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Integration: prompt logprobs served by a real kvferry-ctrld equal PyTorch's.

  ctrld_prompt_logprobs.py KVFERRY_CTRLD MODEL_DIR SOURCE_ROOT
  ctrld_prompt_logprobs.py --url URL MODEL_DIR SOURCE_ROOT
      (a kvferry-ctrld the caller started on MODEL_DIR with the prefix
      cache: ctrld_prompt_logprobs_workers.sh, stages in worker processes)

kvferry-ctrld serves MODEL_DIR (the shipped models/ferry, written by
transformers) on two CPU stages with the prefix cache on. It is asked what
lm-eval's likelihood tasks ask (/v1/completions with a list of token-id
prompts, echo, logprobs 1, max_tokens 1, temperature 0) and what SGLang's
clients ask (/generate with return_logprob and logprob_start_len). Prompts
of up to 230 tokens span several 64-column prefill launches, share 16-token
blocks with each other and come twice, so the second time the cache holds
their blocks and the scored positions must still be computed. Every prompt position's logprob must be
within TOL of log_softmax(torch_ref.forward(prompt))[p - 1][prompt[p]], the
alternative named best must be PyTorch's best, and lm-eval's greedy test
(the token's logprob equals the best's) must agree with PyTorch's argmax
wherever PyTorch's two best are apart by more than MARGIN. Last, SGLang's
/flush_cache must empty the prefix cache.

Exit 0 on success, 1 on a failure, 77 when /usr/bin/python3 lacks torch.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

try:
    import torch
except ImportError:
    print("SKIP: /usr/bin/python3 cannot import torch (apt install python3-torch)")
    sys.exit(77)

TOL = 2e-4
MARGIN = 1e-3


def post(base, path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def prompts(vocab):
    """Token-id prompts: a shared 48-token head (3 blocks) on half of them."""
    x, out, head = 12345, [], []
    for _ in range(48):
        x = (x * 1103515245 + 12345) % 2**31
        head.append(x % vocab)
    for i, n in enumerate([5, 17, 64, 65, 130, 230]):
        p = list(head) if i % 2 else []
        while len(p) < n:
            x = (x * 1103515245 + 12345) % 2**31
            p.append(x % vocab)
        out.append(p[:n])
    return out


def main():
    ctrld, model, root = sys.argv[1], sys.argv[-2], sys.argv[-1]
    sys.path.insert(0, os.path.join(root, "tests", "reference"))
    import torch_ref

    torch.set_grad_enabled(False)
    cfg = torch_ref.load_config(model)
    w = torch_ref.load_weights(model)
    vocab = w["model.embed_tokens.weight"].shape[0]
    ps = prompts(vocab)
    ref = []
    for p in ps:
        lg = torch_ref.forward(cfg, w, p).double()
        ref.append(torch.log_softmax(lg, dim=-1))

    tmp = tempfile.mkdtemp(prefix="kvf-plp-")
    log = open(os.path.join(tmp, "ctrld.log"), "w+")
    env = dict(os.environ, KVFERRY_PREFIX_CACHE="yes", KVFERRY_MAX_SLOTS="8")
    d = None
    if ctrld != "--url":
        d = subprocess.Popen([ctrld, "--model-dir", model, "--served-model-name", "ferry", "--port", "0",
                              "--admin-socket", os.path.join(tmp, "s.sock"), "--stages", "2", "--threads", "1",
                              "--kv-memory", "32M", "--config", "/dev/null"], stdout=log, stderr=subprocess.STDOUT,
                             env=env)
    failures = 0
    try:
        base = sys.argv[2] if d is None else None
        for _ in range(300 if d is not None else 0):
            log.seek(0)
            m = re.search(r"http://127\.0\.0\.1:(\d+)", log.read())
            if m:
                base = "http://127.0.0.1:" + m.group(1)
                break
            if d.poll() is not None:
                break
            time.sleep(0.1)
        if base is None:
            log.seek(0)
            print("FAIL: kvferry-ctrld did not start:\n" + log.read())
            return 1
        name = json.load(urllib.request.urlopen(base + "/v1/models", timeout=30))["data"][0]["id"]
        worst, checked, greedy_checked = 0.0, 0, 0
        for rnd in range(2):
            r = post(base, "/v1/completions", {"model": name, "prompt": ps, "max_tokens": 1, "temperature": 0,
                                               "echo": True, "logprobs": 1})
            for c in r["choices"]:
                i, lp = c["index"], c["logprobs"]
                p = ps[i]
                if len(lp["token_logprobs"]) != len(p) + 1 or lp["token_logprobs"][0] is not None:
                    print("FAIL: round %d prompt %d: %d entries (want %d), first %r" %
                          (rnd, i, len(lp["token_logprobs"]), len(p) + 1, lp["token_logprobs"][0]))
                    failures += 1
                    continue
                for q in range(1, len(p)):
                    want = float(ref[i][q - 1][p[q]])
                    got = lp["token_logprobs"][q]
                    err = abs(got - want)
                    worst = max(worst, err)
                    checked += 1
                    top2 = torch.topk(ref[i][q - 1], 2)
                    best_lp = max(lp["top_logprobs"][q].values())
                    if err > TOL or abs(best_lp - float(top2.values[0])) > TOL:
                        print("FAIL: round %d prompt %d position %d: logprob %.6f, PyTorch %.6f; best %.6f, "
                              "PyTorch %.6f" % (rnd, i, q, got, want, best_lp, float(top2.values[0])))
                        failures += 1
                    if float(top2.values[0] - top2.values[1]) > MARGIN:
                        greedy_checked += 1
                        if (got == best_lp) != (int(top2.indices[0]) == p[q]):
                            print("FAIL: round %d prompt %d position %d: lm-eval's greedy test says %s, PyTorch's "
                                  "argmax %d, token %d" % (rnd, i, q, got == best_lp, int(top2.indices[0]), p[q]))
                            failures += 1
        # SGLang's /generate: from logprob_start_len, the first entry null
        for i, p in enumerate(ps):
            start = len(p) // 3
            g = post(base, "/generate", {"input_ids": p, "return_logprob": True, "logprob_start_len": start,
                                         "top_logprobs_num": 2, "sampling_params": {"max_new_tokens": 0}})
            inp = g["meta_info"]["input_token_logprobs"]
            bad = len(inp) != len(p) - start or inp[0][0] is not None or inp[0][1] != p[start]
            for k, (val, tid, _) in enumerate(inp[1:], start + 1):
                bad |= tid != p[k] or abs(val - float(ref[i][k - 1][p[k]])) > TOL
            if bad:
                print("FAIL: /generate prompt %d from %d: %s" % (i, start, json.dumps(inp)[:300]))
                failures += 1
        st = post(base, "/v1/completions", {"model": name, "prompt": ps[5], "max_tokens": 1, "temperature": 0})
        stats = json.load(urllib.request.urlopen(base + "/stats", timeout=30))
        hits = sum(r.get("prefix_hit_tokens_total", 0) for r in stats["backend"]["replicas"])
        print("%d prompt positions (6 prompts of 5-230 tokens, twice, two stages, 64-column chunks) against "
              "PyTorch: worst |logprob difference| %.2e (tolerance %.0e); lm-eval's greedy test agreed with "
              "PyTorch's argmax at %d positions; the prefix cache served %d positions to the plain requests"
              % (checked, worst, TOL, greedy_checked, hits))
        if checked != 2 * sum(len(p) - 1 for p in ps) or not st["choices"]:
            print("FAIL: %d positions checked" % checked)
            failures += 1
        # SGLang's /flush_cache empties the prefix cache
        def cached():
            s = json.load(urllib.request.urlopen(base + "/stats", timeout=30))
            return sum(r.get("blocks_cached", 0) for r in s["backend"]["replicas"])
        before = cached()
        f = post(base, "/flush_cache", {})
        for _ in range(100):
            if cached() == 0:
                break
            time.sleep(0.05)
        after = cached()
        print("/flush_cache: %d cached blocks before, %d after (%s)" % (before, after, f.get("message")))
        if before == 0 or after != 0 or f.get("flushed") is not True:
            print("FAIL: /flush_cache did not empty the prefix cache")
            failures += 1
    finally:
        if d is not None:
            d.terminate()
            try:
                d.wait(timeout=30)
            except subprocess.TimeoutExpired:
                d.kill()
        if failures and d is not None:
            log.seek(0)
            print("--- daemon log (tail)\n" + "".join(log.readlines()[-30:]))
        log.close()
        subprocess.run(["rm", "-rf", tmp])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
