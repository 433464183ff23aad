#!/usr/bin/env bash
# Integration: kvferry-ctrld with [pd] role = prefill answers the bootstrap
# routes the way SGLang's decode side and router read them (python3's
# urllib standing in for their requests calls): the parallel info, each
# rank's address and layer range, 404 / 400 / 503, /health; another rank
# registers by PUT; ctrlctl bootstrap shows it; role = decode is refused
# with a message that says what to run instead.
#   ctrld_pd_bootstrap.sh KVFERRY_CTRLD KVFERRY_MKMODEL CTRLCTL
set -u
ctrld=$1 mkmodel=$2 ctrlctl=$3
command -v python3 >/dev/null || { echo "python3 not found: skipping"; exit 77; }

tmp=$(mktemp -d /tmp/kvf-pd-XXXXXX)
pid=
cleanup() { [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- daemon log"; cat "$tmp/ctrld.log"; exit 1; }

"$mkmodel" --out "$tmp/model" >/dev/null || fail "kvferry-mkmodel"

# role = decode without a dataplane region and prefill nodes: refused at start, exit 2, naming what to set
"$ctrld" --model-dir "$tmp/model" --config /dev/null --pd-role decode --check >"$tmp/decode.log" 2>&1
rc=$?
[ $rc = 2 ] || fail "role = decode exited $rc, not 2"
grep -q "needs \[pd\] dataplane_region" "$tmp/decode.log" && grep -q "\[pd\] prefill" "$tmp/decode.log" \
  || { cat "$tmp/decode.log"; fail "role = decode: no advice"; }
echo "ok    role = decode without dataplane_region and prefill is refused with exit 2 naming both"

sock=$tmp/ctrl.sock
"$ctrld" --model-dir "$tmp/model" --served-model-name tiny --port 0 --admin-socket "$sock" --stages 0-2,2-3 \
  --threads 1 --kv-memory 16M --config /dev/null --pd-role prefill --bootstrap-port 0 \
  --rank-address 10.9.8.7:7400 >"$tmp/ctrld.log" 2>&1 &
pid=$!
bport=
for _ in $(seq 100); do
  bport=$(sed -n 's/.*bootstrap routes on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$tmp/ctrld.log" | head -n1)
  [ -n "$bport" ] && break
  kill -0 "$pid" 2>/dev/null || fail "kvferry-ctrld exited at start"
  sleep 0.1
done
[ -n "$bport" ] || fail "no bootstrap line in the log"

python3 - "127.0.0.1:$bport" <<'PY' || fail "bootstrap routes"
import json, sys, urllib.error, urllib.request
addr = sys.argv[1]

def get(path):
    try:
        with urllib.request.urlopen("http://%s%s" % (addr, path), timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()

def put(body):
    req = urllib.request.Request("http://%s/route" % addr, data=json.dumps(body).encode(), method="PUT",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()

def check(cond, what):
    if not cond:
        print("FAIL:", what)
        sys.exit(1)

st, body = get("/health")
check(st == 200 and body == "OK", "/health: %d %r" % (st, body))
# the decode side's first read (both spellings SGLang has used)
st, body = get("/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1")
check(st == 200, "parallel info: %d %s" % (st, body))
info = json.loads(body)
check(info["attn_tp_size"] == 1 and info["dp_size"] == 1 and info["pp_size"] == 2, "sizes: %s" % body)
check(info["prefill_attn_tp_size"] == 1 and info["prefill_dp_size"] == 1 and info["prefill_pp_size"] == 2,
      "older spellings: %s" % body)
check(info["page_size"] == 16 and info["kv_cache_dtype"] == "float32" and info["num_layers"] == 3,
      "page layout: %s" % body)
st, body = get("/route?engine_rank=-1&target_dp_group=-1&target_pp_rank=-1")
check(st == 200 and json.loads(body)["prefill_pp_size"] == 2, "older selectors: %d %s" % (st, body))
# each pipeline rank: the rank address and its layers
for pp, (a, b) in enumerate([(0, 2), (2, 3)]):
    st, body = get("/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=%d" % pp)
    r = json.loads(body) if st == 200 else {}
    check(r.get("rank_ip") == "10.9.8.7" and r.get("rank_port") == 7400 and r.get("layer_start") == a
          and r.get("layer_end") == b, "rank pp %d: %d %s" % (pp, st, body))
st, body = get("/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=1&target_pp_rank=0")
check(st == 404, "unknown rank: %d" % st)
st, body = get("/route?target_tp_rank=0")
check(st == 400 and "prefill_dp_rank" in body, "missing selector: %d %s" % (st, body))
# a registration that disagrees with this node's ranks is refused by name
st, body = put({"attn_tp_size": 1, "attn_tp_rank": 0, "attn_dp_size": 1, "attn_dp_rank": 0, "pp_size": 4,
                "pp_rank": 3, "rank_ip": "10.0.0.3", "rank_port": 1, "page_size": 16,
                "kv_cache_dtype": "float32"})
check(st == 400 and "pp_size 4 differs from the 2" in body, "conflicting PUT: %d %s" % (st, body))
st, body = put({"attn_tp_size": 1})
check(st == 400 and "attn_tp_rank" in body, "short PUT: %d %s" % (st, body))
print("ok    the bootstrap routes answer the parallel info, each rank's address and layers, 404 / 400, /health")
PY

"$ctrlctl" --socket "$sock" bootstrap | grep -q "ranks_registered  *2" || { "$ctrlctl" --socket "$sock" bootstrap; fail "ctrlctl bootstrap"; }
"$ctrlctl" --socket "$sock" --json bootstrap | grep -q '"puts_refused": 2' || fail "ctrlctl bootstrap counts the refused PUTs"
echo "ok    ctrlctl bootstrap shows the registered ranks and the refused registrations"

kill -TERM "$pid"
wait "$pid"
rc=$?
pid=
[ $rc = 0 ] || fail "exit status $rc after SIGTERM"
echo "ok    a prefill-role daemon stops cleanly"
