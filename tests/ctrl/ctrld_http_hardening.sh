#!/usr/bin/env bash
# Integration: a real kvferry-ctrld (tiny model, stages in-process, a KV pool
# of 8 blocks, short connection limits from its flags) against what a hostile
# or careless client sends, over raw sockets (python3) and curl:
#  - max_tokens the pool can never hold: 400 with the scheduler's words, for a
#    stream too (no 200 first); a request that does not say gets what fits;
#  - two Content-Lengths that disagree, Content-Length with Transfer-Encoding:
#    one 400 JSON answer, the connection closed, the smuggled request unserved;
#  - a Content-Length larger than the body, an idle connection: closed after
#    connection_timeout; a client trickling a byte at a time: closed after
#    request_timeout; connections beyond max_connections: a 503 JSON;
#  - a malformed Content-Length, a 1 MiB header or URL: refused and closed;
#  - GET /v1/models/{id}, the probes, unique response ids for one seed.
#   ctrld_http_hardening.sh KVFERRY_CTRLD KVFERRY_MKMODEL SOURCE_ROOT
set -u
ctrld=$1 mkmodel=$2 root=$3
# shellcheck source=scripts/serve-lib.sh
. "$root/scripts/serve-lib.sh"
command -v python3 >/dev/null || { echo "python3 not found: skipping"; exit 77; }
command -v curl >/dev/null || { echo "curl not found: skipping"; exit 77; }

tmp=$(mktemp -d /tmp/kvf-hard-XXXXXX)
pid=
cleanup() { [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- daemon log"; tail -n 30 "$tmp/ctrld.log"; exit 1; }

"$mkmodel" --out "$tmp/model" >/dev/null || fail "kvferry-mkmodel"
"$ctrld" --model-dir "$tmp/model" --served-model-name tiny --port 0 --admin-socket "$tmp/ctrl.sock" \
  --stages 2 --threads 1 --kv-blocks 8 --max-slots 4 --config /dev/null \
  --connection-timeout 1 --request-timeout 3 --max-connections 4 >"$tmp/ctrld.log" 2>&1 &
pid=$!
port=$(kvf_ctrld_port "$tmp/ctrld.log" "$pid") || fail "$port"

python3 - "$port" <<'EOF' || fail "see above"
import json, socket, sys, threading, time, urllib.request, urllib.error
port = int(sys.argv[1])
base = "http://127.0.0.1:%d" % port
fails = []

def http(method, path, body=None):
    req = urllib.request.Request(base + path, method=method, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()

def wire(data, wait=6.0, trickle=0.0):
    """Send data (a byte every `trickle` s if set), read until the server closes: (reply, closed, seconds)."""
    s = socket.create_connection(("127.0.0.1", port))
    t0, out, closed = time.time(), b"", False
    try:
        if trickle:
            for i in range(len(data)):
                s.sendall(data[i:i + 1])
                s.settimeout(trickle)
                try:
                    b = s.recv(65536)
                    if not b:
                        closed = True
                        break
                    out += b
                except socket.timeout:
                    pass
                if time.time() - t0 > wait:
                    break
        else:
            s.sendall(data)
        s.settimeout(max(0.1, wait - (time.time() - t0)))
        while not closed:
            b = s.recv(65536)
            if not b:
                closed = True
                break
            out += b
    except (socket.timeout, TimeoutError):
        pass
    except (ConnectionResetError, BrokenPipeError):
        closed = True
    s.close()
    return out.decode("latin1"), closed, time.time() - t0

def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what)
    if not cond:
        fails.append(what)

def one_json_error(reply, status, code):
    head, _, body = reply.partition("\r\n\r\n")
    try:
        got = json.loads(body)["error"]["code"]
    except Exception:
        got = None
    return reply.startswith("HTTP/1.1 %d " % status) and reply.count("HTTP/1.1 ") == 1 and got == code

# -- the KV pool (8 blocks = 128 positions) refuses at once what it could never hold
st, body = http("POST", "/v1/completions", {"model": "tiny", "prompt": "hello", "max_tokens": 500})
e = json.loads(body).get("error", {})
check(st == 400 and e.get("code") == "context_length_exceeded" and e.get("param") == "max_tokens"
      and "pool holds 8 blocks" in e.get("message", ""), "max_tokens beyond the KV pool: 400 with the scheduler's words (%d %s)" % (st, e.get("message")))
reply, closed, _ = wire(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                        % (len(b'{"model":"tiny","prompt":"hello","max_tokens":500,"stream":true}'),
                           b'{"model":"tiny","prompt":"hello","max_tokens":500,"stream":true}'), wait=5)
check(one_json_error(reply, 400, "context_length_exceeded") and "data:" not in reply,
      "the same, streamed: one 400 JSON, no 200 and no event first")
st, body = http("POST", "/v1/completions", {"model": "tiny", "prompt": "hello", "temperature": 0, "ignore_eos": True})
u = json.loads(body).get("usage", {}) if st == 200 else {}
check(st == 200 and 0 < u.get("completion_tokens", 0) and u["prompt_tokens"] + u["completion_tokens"] <= 129,
      "no max_tokens: the default is cut to what the pool holds (%d %s)" % (st, u))

# -- framing two readers could read differently
smuggled = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
reply, closed, _ = wire(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: %d\r\n\r\n%s"
                        % (len(smuggled), smuggled))
check(one_json_error(reply, 400, "invalid_content_length") and closed and '"object":"list"' not in reply,
      "two Content-Lengths that disagree: one 400 JSON, closed, the smuggled request unserved")
reply, closed, _ = wire(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
check(one_json_error(reply, 400, "invalid_content_length") and closed, "Content-Length with Transfer-Encoding: 400 JSON, closed")
for cl, status in (("-5", 400), ("abc", 400), ("99999999999999999999999", 413)):
    reply, closed, _ = wire(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %s\r\n\r\n{}" % cl.encode())
    check(reply.startswith("HTTP/1.1 %d " % status) and closed, "Content-Length %s: %d and closed (libmicrohttpd's answer)" % (cl, status))
reply, closed, _ = wire(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n")
check(reply.startswith("HTTP/1.1 431 ") and closed, "a 1 MiB header: 431 and closed")
reply, closed, _ = wire(b"GET /" + b"a" * (1 << 20) + b" HTTP/1.1\r\nHost: x\r\n\r\n")
check(reply.startswith("HTTP/1.1 414 ") and closed, "a 1 MiB URL: 414 and closed")

# -- slow and idle connections (connection_timeout 1 s, request_timeout 3 s)
reply, closed, secs = wire(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"model\":", wait=10)
check(closed and reply == "" and 0.8 < secs < 3, "a Content-Length larger than its body: closed after %.1f s" % secs)
reply, closed, secs = wire(b"", wait=10)
check(closed and 0.8 < secs < 3, "an idle connection: closed after %.1f s" % secs)
reply, closed, secs = wire(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 60 + b"\r\n\r\n", wait=12, trickle=0.3)
check(closed and 2.8 < secs < 5, "a byte every 0.3 s: closed at request_timeout, after %.1f s" % secs)

# -- max_connections 4: the fifth connection's request gets a 503 JSON
idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
time.sleep(0.2)
reply, closed, _ = wire(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n", wait=3)
check(one_json_error(reply, 503, "too_many_connections") and closed, "beyond max_connections: a 503 JSON, closed")
reply, closed, _ = wire(b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", wait=3)
check(reply.startswith("HTTP/1.1 200 "), "GET /livez still answers 200 there")
for s in idle:
    s.close()
time.sleep(0.2)

# -- the model by id, the probes, ids
st, body = http("GET", "/v1/models/tiny")
check(st == 200 and json.loads(body)["id"] == "tiny", "GET /v1/models/tiny: the model object")
st, body = http("GET", "/v1/models/other")
check(st == 404 and json.loads(body)["error"]["code"] == "model_not_found", "GET /v1/models/other: 404 model_not_found")
for p, want in (("/health", "ok"), ("/readyz", "ok"), ("/livez", "alive")):
    st, body = http("GET", p)
    check(st == 200 and json.loads(body)["status"] == want, "GET %s: 200 %s" % (p, want))
ids = set()
for i in range(8):
    st, body = http("POST", "/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 1, "seed": 3})
    ids.add(json.loads(body)["id"])
check(len(ids) == 8, "8 requests of one seed in a second: 8 ids")
st, body = http("GET", "/stats")
h = json.loads(body)["http"]
check(h["connections_refused_total"] >= 1 and h["slow_requests_closed_total"] >= 1,
      "/stats counts the refused and the slow connections (%d, %d)" % (h["connections_refused_total"], h["slow_requests_closed_total"]))
sys.exit(1 if fails else 0)
EOF
kill -TERM "$pid"; wait "$pid"; rc=$?; pid=
[ $rc = 0 ] || fail "kvferry-ctrld exited $rc after SIGTERM"
