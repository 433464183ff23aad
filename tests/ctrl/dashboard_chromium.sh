#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Integration: headless Chromium renders a real kvferry-ctrld's dashboard
# after the page's script ran (--virtual-time-budget), once as its DOM
# (--dump-dom) and once as pixels (--screenshot); dashboard_check.py then
# asserts the occupancy fill sits inside its bar at the occupancy's width,
# tokens/s and the latency percentiles are shown, and the client error the
# test caused is highlighted.
#   dashboard_chromium.sh KVFERRY_CTRLD KVFERRY_MKMODEL SOURCE_ROOT
# Exits 77 (skip) when no Chromium (Debian's chromium-headless-shell or
# chromium), curl or python3 is found.
set -u
ctrld=$1 mkmodel=$2 root=$3
# shellcheck source=scripts/serve-lib.sh
. "$root/scripts/serve-lib.sh"

chrome=
for c in chromium-headless-shell chromium chromium-browser google-chrome; do
  command -v "$c" >/dev/null && { chrome=$c; break; }
done
[ -n "$chrome" ] || { echo "no headless Chromium (apt-get install chromium-headless-shell; scripts/install-deps): skipping"; exit 77; }
command -v curl >/dev/null || { echo "curl not found: skipping"; exit 77; }
command -v python3 >/dev/null || { echo "python3 not found: skipping"; exit 77; }

tmp=$(mktemp -d /tmp/kvf-dash-XXXXXX)
pid=
cleanup() { [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- daemon log"; cat "$tmp/ctrld.log"; echo "--- chromium"; tail -20 "$tmp/chrome.log"; exit 1; }

"$mkmodel" --out "$tmp/model" >/dev/null || fail "kvferry-mkmodel"
"$ctrld" --model-dir "$tmp/model" --served-model-name tiny --port 0 --admin-socket "$tmp/ctrl.sock" \
  --stages 3 --threads 1 --kv-memory 16M --config /dev/null >"$tmp/ctrld.log" 2>&1 &
pid=$!
port=$(kvf_ctrld_port "$tmp/ctrld.log" "$pid") || fail "$port"
base=http://127.0.0.1:$port

# Work for the pipeline to show (6 requests, one streamed), and one client error.
N=6
for i in $(seq $((N - 1))); do
  curl -sf -o /dev/null "$base/v1/completions" -d '{"model":"tiny","prompt":"fill the pipe '$i'","max_tokens":24,"ignore_eos":true}' \
    || fail "completion $i"
done
curl -sf -o /dev/null "$base/v1/completions" -d '{"model":"tiny","prompt":"streamed","max_tokens":24,"ignore_eos":true,"stream":true}' \
  || fail "streamed completion"
code=$(curl -s -o /dev/null -w '%{http_code}' "$base/v1/completions" -d '{"model":"nope","prompt":"x"}')
[ "$code" = 404 ] || fail "a request for another model got $code, not 404"

# As root Chromium needs --no-sandbox; a container's small /dev/shm needs
# --disable-dev-shm-usage. 5 s of virtual time: the page polls /stats 5 times.
run_chrome() {
  timeout 60 "$chrome" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run \
    --user-data-dir="$tmp/profile" --hide-scrollbars --window-size=1000,1400 --virtual-time-budget=5000 \
    "$@" "$base/dashboard" 2>>"$tmp/chrome.log"
}
run_chrome --dump-dom >"$tmp/dom.html" || fail "$chrome --dump-dom"
run_chrome --screenshot="$tmp/shot.png" >/dev/null || fail "$chrome --screenshot"
[ -s "$tmp/dom.html" ] && [ -s "$tmp/shot.png" ] || fail "$chrome wrote no DOM or no screenshot"
curl -sf "$base/stats" >"$tmp/stats.json" || fail "GET /stats"

python3 "$root/tests/ctrl/dashboard_check.py" "$tmp/dom.html" "$tmp/shot.png" "$tmp/stats.json" "$N" \
  || fail "the dashboard as $chrome rendered it"
echo "ok    $chrome draws the occupancy fill inside its bar, tokens/s, latency percentiles and the client error in red"
kill -TERM "$pid"
wait "$pid"
pid=
