#!/usr/bin/env bash
# Integration: kvferry-ctrld and the model's chat template.
#   - a model whose chat_template is of no family kn_tok renders is refused at
#     start (--check and a real start), the error naming the template's file,
#     its text and the fix;
#   - --chat-template FILE, KVFERRY_CHAT_TEMPLATE and [model] chat_template
#     replace it, and chat requests are rendered with the replacement;
#   - --chat-template none, and a model with no template at all, start and
#     answer chat with 400 chat_template_unsupported (completions still work).
#   ctrld_chat_template.sh KVFERRY_CTRLD KVFERRY_MKMODEL KVFERRY_TOK SOURCE_ROOT
set -u
ctrld=$1 mkmodel=$2 tok=$3 root=$4
chat=$root/tests/kernels/data/chat
# shellcheck source=scripts/serve-lib.sh
. "$root/scripts/serve-lib.sh"

command -v curl >/dev/null || { echo "curl not found: skipping"; exit 77; }
tmp=$(mktemp -d /tmp/kvf-chat-tmpl-XXXXXX)
pid=
stop() { if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; pid=; fi; }
cleanup() { [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$tmp"/*.log; do echo "--- $f"; cat "$f"; done; exit 1; }

"$mkmodel" --out "$tmp/base" --preset tiny >/dev/null || fail "kvferry-mkmodel"
# the same model with a Mistral-style template, and with none at all
set_template() {  # DIR TEMPLATE|-  (- removes the key)
  cp -r "$tmp/base" "$1"
  /usr/bin/python3 - "$1/tokenizer_config.json" "$2" <<'EOF' || fail "editing $1"
import json, sys
path, tmpl = sys.argv[1], sys.argv[2]
with open(path) as f:
    cfg = json.load(f)
if tmpl == "-":
    cfg.pop("chat_template", None)
else:
    cfg["chat_template"] = tmpl
with open(path, "w") as f:
    json.dump(cfg, f)
EOF
}
set_template "$tmp/unknown" "{{ bos_token }}{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}"
set_template "$tmp/plain" "-"

check() { "$ctrld" --check --config "${CONF:-/dev/null}" --model-dir "$@"; }

# 1. refused, naming the file, the template and the fix
check "$tmp/unknown" >"$tmp/refused.log" 2>&1 && fail "--check passes a model whose chat template kvferry cannot render"
for want in "$tmp/unknown/tokenizer_config.json" "[INST]" "unknown family" "--chat-template FILE" \
            "chat_template in [model]" "--chat-template none"; do
  grep -qF -- "$want" "$tmp/refused.log" || fail "the refusal does not say '$want'"
done
"$ctrld" --config /dev/null --model-dir "$tmp/unknown" --port 0 --admin-socket "$tmp/a.sock" \
  >"$tmp/start.log" 2>&1 && fail "kvferry-ctrld started serving a model whose chat template it cannot render"
grep -qF "[INST]" "$tmp/start.log" || fail "a real start is not refused with the template named"
echo "ok    a model whose chat template is of an unknown family is refused at start, with the template and the fix named"

# 2. each way of naming a replacement
check "$tmp/unknown" --chat-template "$chat/llama31.jinja" >"$tmp/flag.log" 2>&1 || fail "--chat-template FILE"
KVFERRY_CHAT_TEMPLATE=$chat/llama31.jinja check "$tmp/unknown" >"$tmp/env.log" 2>&1 || fail "KVFERRY_CHAT_TEMPLATE"
printf '[model]\nchat_template = %s\n' "$chat/llama31.jinja" >"$tmp/kvferry.conf"
CONF=$tmp/kvferry.conf check "$tmp/unknown" >"$tmp/conf.log" 2>&1 || fail "[model] chat_template in the config file"
check "$tmp/unknown" --chat-template none >"$tmp/none.log" 2>&1 || fail "--chat-template none"
check "$tmp/unknown" --chat-template "$tmp/no-such.jinja" >"$tmp/missing.log" 2>&1 && fail "a missing template file passes"
grep -q "chat_template" "$tmp/missing.log" && grep -q "no-such.jinja" "$tmp/missing.log" \
  || fail "a missing template file is not named with its key"
check "$tmp/plain" >"$tmp/plain.log" 2>&1 || fail "a model without a chat template is refused (it serves completions)"
echo "ok    --chat-template FILE, KVFERRY_CHAT_TEMPLATE and [model] chat_template override it; a missing file is named"

start() {  # LOG MODEL [OPTION ...]
  local log=$1 model=$2
  shift 2
  "$ctrld" --config /dev/null --model-dir "$model" --served-model-name m --port 0 --admin-socket "$tmp/ctrl.sock" \
    --stages 1 --threads 1 --kv-memory 16M "$@" >"$tmp/$log" 2>&1 &
  pid=$!
  port=$(kvf_ctrld_port "$tmp/$log" "$pid") || fail "$port ($log)"
}
msgs='[{"role":"system","content":"Be brief."},{"role":"user","content":"Hello there"}]'
post() {  # ROUTE BODY -> $tmp/body, prints the status
  curl -s -o "$tmp/body" -w '%{http_code}' "http://127.0.0.1:$port$1" -H 'content-type: application/json' -d "$2"
}

# 3. chat rendered with the replacement: as many prompt tokens as kvferry-tok counts with it
start served.log "$tmp/unknown" --chat-template "$chat/llama31.jinja"
code=$(post /v1/chat/completions "{\"model\":\"m\",\"messages\":$msgs,\"max_tokens\":2}")
[ "$code" = 200 ] || fail "a chat request with --chat-template got $code: $(cat "$tmp/body")"
got=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["usage"]["prompt_tokens"])' "$tmp/body")
want=$(echo "$msgs" | "$tok" chat --model "$tmp/unknown" --chat-template "$chat/llama31.jinja" --gen |
       /usr/bin/python3 -c 'import json,sys; print(len(json.loads(sys.stdin.readline())["ids"]))')
[ "$got" = "$want" ] || fail "the chat prompt has $got tokens; rendered with the --chat-template file it has $want"
stop
echo "ok    chat requests are rendered with the --chat-template file ($got prompt tokens)"

# 4. none, and no template at all: completions serve, chat answers 400 chat_template_unsupported
for how in none plain; do
  if [ $how = none ]; then start $how.log "$tmp/unknown" --chat-template none; else start $how.log "$tmp/plain"; fi
  code=$(post /v1/chat/completions "{\"model\":\"m\",\"messages\":$msgs,\"max_tokens\":2}")
  [ "$code" = 400 ] && grep -q '"chat_template_unsupported"' "$tmp/body" \
    || fail "$how: a chat request got $code, not 400 chat_template_unsupported: $(cat "$tmp/body")"
  code=$(post /v1/completions '{"model":"m","prompt":"Hello","max_tokens":2}')
  [ "$code" = 200 ] || fail "$how: a completion got $code"
  stop
done
echo "ok    --chat-template none and a model without a template serve completions; chat gets 400 chat_template_unsupported"
