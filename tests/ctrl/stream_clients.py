#!/usr/bin/env python3
# N streaming completions at once against a kvferry-ctrld, for the tests that
# disturb a serving node (ctrld_replay.sh, ctrld_replicas.sh):
#   stream_clients.py URL OUT READY N [BASE]
# Client i sends "the ferry crosses the river i times" for BASE + 6 i tokens
# (BASE 90 unless given: a run that must still be in flight some time after
# READY asks for more, as the tiny model streams 90 tokens in a few tens of ms)
# (greedy for even i, seeded sampling for odd; logprobs 3 for i % 4 < 2).
# KVF_PROMPT_PREFIX in the environment, if set, starts every prompt (prompts
# that share whole KV blocks, for the prefix cache). Each result's "usage"
# holds the counts; usage.prompt_tokens_details.cached_tokens is apart, in
# "cached_tokens".
# READY is created once every stream has shown 3 tokens; OUT gets, per
# client, the status, the text, logprobs, finish reason, usage, error events
# and when the stream ended.
import http.client, json, os, sys, threading, time, urllib.parse
url, out, ready, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
base = int(sys.argv[5]) if len(sys.argv) > 5 else 90
u = urllib.parse.urlparse(url)

def body(i):
    b = {"model": "tiny", "prompt": os.environ.get("KVF_PROMPT_PREFIX", "") + "the ferry crosses the river %d times" % i,
         "max_tokens": base + 6 * i,
         "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    b.update({"temperature": 0.8, "seed": 100 + i} if i % 2 else {"temperature": 0})
    if i % 4 < 2:
        b["logprobs"] = 3
    return b

res = [None] * n
seen = [0] * n
lock = threading.Lock()

def note(i, k):
    with lock:
        seen[i] = max(seen[i], k)
        if all(s >= 3 for s in seen):
            open(ready, "a").close()

def client(i):
    r = {"status": 0, "text": "", "tokens": [], "token_logprobs": [], "top_logprobs": [], "finish": None,
         "usage": None, "cached_tokens": 0, "errors": [], "done": False}
    try:
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
        c.request("POST", "/v1/completions", json.dumps(body(i)), {"Content-Type": "application/json"})
        resp = c.getresponse()
        r["status"] = resp.status
        if resp.status != 200:
            r["errors"].append(resp.read().decode(errors="replace"))
        else:
            for line in resp:
                line = line.decode().strip()
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    r["done"] = True
                    break
                j = json.loads(line[6:])
                if "error" in j:
                    r["errors"].append(j["error"].get("message", ""))
                    continue
                if j.get("usage"):
                    # what the prefix cache gave depends on what ran before, not on the
                    # answer: kept apart, so runs compare by their counts
                    use = dict(j["usage"])
                    r["cached_tokens"] = (use.pop("prompt_tokens_details", None) or {}).get("cached_tokens", 0)
                    r["usage"] = use
                for ch in j.get("choices", []):
                    r["text"] += ch.get("text", "")
                    lp = ch.get("logprobs") or {}
                    r["tokens"] += lp.get("tokens", [])
                    r["token_logprobs"] += lp.get("token_logprobs", [])
                    r["top_logprobs"] += lp.get("top_logprobs", [])
                    if ch.get("finish_reason"):
                        r["finish"] = ch["finish_reason"]
                    if ch.get("text"):
                        note(i, seen[i] + 1)
    except Exception as e:
        r["errors"].append("client: %r" % e)
    r["t_end"] = time.time()
    note(i, 3)
    res[i] = r

ts = [threading.Thread(target=client, args=(i,)) for i in range(n)]
for t in ts:
    t.start()
for t in ts:
    t.join()
json.dump(res, open(out, "w"))
