#!/usr/bin/env bash
# Integration: a real kvferry-ctrld serving a tiny generated model, driven by
# the official `openai` npm client, ctrlctl and curl; then SIGTERM drains a
# request in flight before the daemon exits.
#   ctrld_openai.sh KVFERRY_CTRLD KVFERRY_MKMODEL CTRLCTL SOURCE_ROOT
# Exits 77 (skip) when node or the npm references are missing.
set -u  # no pipefail: `producer | grep -q` may SIGPIPE the producer
ctrld=$1 mkmodel=$2 ctrlctl=$3 root=$4
ref=$root/tests/reference
# shellcheck source=scripts/serve-lib.sh
. "$root/scripts/serve-lib.sh"

command -v node >/dev/null || { echo "node not found: skipping"; exit 77; }
[ -d "$ref/node_modules/openai" ] || { echo "$ref/node_modules/openai missing (scripts/install-deps): skipping"; exit 77; }
command -v curl >/dev/null || { echo "curl not found: skipping"; exit 77; }

tmp=$(mktemp -d /tmp/kvf-openai-XXXXXX)
pid=
cleanup() { [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- daemon log"; cat "$tmp/ctrld.log"; exit 1; }

"$mkmodel" --out "$tmp/model" >/dev/null || fail "kvferry-mkmodel"
sock=$tmp/ctrl.sock
KVFERRY_MAX_SLOTS=8 "$ctrld" --model-dir "$tmp/model" --served-model-name tiny --port 0 \
  --admin-socket "$sock" --stages 3 --threads 1 --kv-memory 16M --drain-timeout 20 \
  --config /dev/null >"$tmp/ctrld.log" 2>&1 &
pid=$!
port=$(kvf_ctrld_port "$tmp/ctrld.log" "$pid") || fail "$port"
base=http://127.0.0.1:$port

node "$root/tests/ctrl/openai_client.mjs" "$base" tiny "$ref" "$(dirname "$ctrld")/kvferry-generate" "$tmp/model" \
  || fail "openai client checks"

# ctrlctl sees the daemon and says where the configuration came from.
"$ctrlctl" --socket "$sock" status | grep -q "model  *tiny" || fail "ctrlctl status"
"$ctrlctl" --socket "$sock" --json config | grep -A4 '"key": "max_slots"' | grep -q '"origin": "KVFERRY_MAX_SLOTS"' \
  || fail "ctrlctl config does not name KVFERRY_MAX_SLOTS as the source of max_slots"
"$ctrlctl" --socket "$sock" stages | grep -q "^0  *2  *2-3" || fail "ctrlctl stages"
echo "ok    ctrlctl status, config and stages answer"

# drain/resume from the admin socket.
"$ctrlctl" --socket "$sock" drain >/dev/null || fail "ctrlctl drain"
code=$(curl -s -o /dev/null -w '%{http_code}' "$base/v1/completions" -d '{"model":"tiny","prompt":"x"}')
[ "$code" = 503 ] || fail "a request while draining got $code, not 503"
"$ctrlctl" --socket "$sock" resume >/dev/null || fail "ctrlctl resume"
code=$(curl -s -o /dev/null -w '%{http_code}' "$base/v1/completions" -d '{"model":"tiny","prompt":"x","max_tokens":2}')
[ "$code" = 200 ] || fail "a request after resume got $code"
echo "ok    ctrlctl drain refuses new requests with 503 and resume admits them again"

# SIGTERM: the request in flight finishes in full, new ones get 503, then exit 0.
# ignore_eos and 1,900 tokens (~0.9 s on an idle machine): the request must
# still be in flight when the probe comes. An early end of text, and once
# 400 tokens (0.12 s) on a loaded CI machine, let the daemon drain and exit
# first: the probe got 000.
curl -s "$base/v1/completions" -d '{"model":"tiny","prompt":"long","max_tokens":1900,"temperature":0,"ignore_eos":true}' \
  >"$tmp/inflight.json" &
cpid=$!
for _ in $(seq 100); do
  "$ctrlctl" --socket "$sock" --json requests | grep -q '"backend_id"' && break
  sleep 0.02
done
kill -TERM "$pid"
code=$(curl -s -o /dev/null -w '%{http_code}' "$base/v1/completions" -d '{"model":"tiny","prompt":"x"}')
[ "$code" = 503 ] || fail "a request during SIGTERM drain got $code, not 503"
wait "$cpid"
wait "$pid"; rc=$?
pid=
[ $rc = 0 ] || fail "kvferry-ctrld exited $rc after SIGTERM"
node -e '
const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
const u = r.usage, f = r.choices[0].finish_reason;
if (!(f === "length" && u.completion_tokens === 1900)) { console.log(JSON.stringify(r).slice(0, 400)); process.exit(1); }
' "$tmp/inflight.json" || fail "the request in flight at SIGTERM did not finish"
[ ! -e "$sock" ] || fail "the admin socket was left behind"
echo "ok    SIGTERM drains: the request in flight completes, new ones get 503, exit 0"

# Tool calling through the official client, on a Qwen 2.5 chat template.
KVFERRY_MAX_SLOTS=8 "$ctrld" --model-dir "$tmp/model" --served-model-name tiny --port 0 \
  --admin-socket "$tmp/tools.sock" --stages 1 --threads 1 --kv-memory 16M \
  --chat-template "$root/tests/kernels/data/chat/qwen25.jinja" --config /dev/null >"$tmp/ctrld.log" 2>&1 &
pid=$!
port=$(kvf_ctrld_port "$tmp/ctrld.log" "$pid") || fail "$port"
node "$root/tests/ctrl/openai_tools.mjs" "http://127.0.0.1:$port" tiny "$ref" || fail "openai client tool checks"
kill -TERM "$pid"; wait "$pid"; pid=
