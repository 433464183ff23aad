#!/usr/bin/env bash
# A prefill node and a decode node, each with its own kvferry-dataplane, over
# net_memif (memif) or a veth pair between two network namespaces
# (netns, net_af_packet); memif-impair adds 5% loss, duplication, reordering
# and corruption; ctrld makes the prefill node a kvferry-ctrld (role =
# prefill, its dataplane link on node 1's region) that gets each prompt with
# bootstrap_room on /v1/completions, as from a router. The KV pages and
# control messages of 64 requests cross the link; test_pd_dataplane checks
# the tokens against one node's.
#   pd_dataplane.sh memif|memif-impair|netns|ctrld BUILD SOURCE
# Needs root (hugepages, namespaces): exits 77 without.
set -u
mode=$1 B=$2 S=$3
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root (hugepages, network namespaces)"
# shellcheck source=scripts/serve-lib.sh
. "$S/scripts/serve-lib.sh"
kvf_hugepages 200 || skip "cannot reserve 200 hugepages of 2 MiB"
KVF_RUN=$(mktemp -d /tmp/kvfpd.XXXXXX) KVF_BIN=$B
KVF_RA=kvfpdP$$ KVF_RB=kvfpdD$$
trap 'kvf_down; rm -rf "$KVF_RUN"' EXIT
topo=dataplane
case $mode in
  memif|ctrld) ;;
  memif-impair) KVF_DP_EXTRA="--impair loss=0.05,dup=0.05,reorder=0.05,corrupt=0.05,seed=11" ;;
  netns) kvf_netns $$ || skip "cannot create two network namespaces joined by a veth pair"; topo=netns ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac
KVF_DP_REGION=160
kvf_dataplanes "$topo" || { echo "FAIL: the dataplanes did not start"; exit 1; }
"$B/kvferry-mkmodel" --out "$KVF_RUN/model" --preset tiny >/dev/null || { echo "FAIL: kvferry-mkmodel"; exit 1; }
extra=()
if [ "$mode" = ctrld ]; then
  "$B/kvferry-ctrld" --model-dir "$KVF_RUN/model" --stages 2 --backend cpu --threads 1 --port 0 \
    --admin-socket "$KVF_RUN/ctrl.sock" --pd-role prefill --bootstrap-port 0 --pd-dataplane-region "$KVF_RA" \
    --served-model-name tiny >"$KVF_RUN/ctrld.log" 2>&1 &
  KVF_PIDS+=($!)
  kvf_wait_log "$KVF_RUN/ctrld.log" "serving " 60 || { echo "FAIL: ctrld did not start"; cat "$KVF_RUN/ctrld.log"; exit 1; }
  url=$(sed -n 's/.* on \(http:\/\/[^,]*\), admin.*/\1/p' "$KVF_RUN/ctrld.log" | head -n1)
  extra=("$url" tiny)
fi
# The decode node's ctrld is played by test_pd_dataplane on region D (node 2);
# without ctrld the same process plays the prefill node's on region P (node 1).
timeout 300 "$B/tests/ctrl/test_pd_dataplane" "$KVF_RUN/model" "$KVF_RA" 1 "$KVF_RB" 2 "${extra[@]}" \
  >"$KVF_RUN/out.log" 2>&1
rc=$?
cat "$KVF_RUN/out.log"
[ $rc = 77 ] && skip "$(tail -n1 "$KVF_RUN/out.log")"
if [ $rc != 0 ] || ! grep -q "^PASS" "$KVF_RUN/out.log"; then
  echo "FAIL: test_pd_dataplane exited $rc"
  for f in dataplane1 dataplane2 ctrld; do [ -f "$KVF_RUN/$f.log" ] && { echo "--- $f.log"; tail -n 30 "$KVF_RUN/$f.log"; }; done
  exit 1
fi
if [ "$mode" = ctrld ]; then
  # the prefill node reports its side on /stats
  python3 -c '
import json, sys, urllib.request
pd = json.load(urllib.request.urlopen(sys.argv[1] + "/stats"))["backend"]["pd"]
assert pd["rooms_done_total"] == 64 and pd["rooms_failed_total"] == 0, pd
print("prefill node /stats pd:", pd)' "$url" || { echo "FAIL: /stats of the prefill node"; exit 1; }
fi
if [ "$mode" = memif-impair ]; then
  # the impairment really dropped frames (each dataplane counts them as it stops)
  kvf_down
  grep -q "impair=[1-9]" "$KVF_RUN/dataplane1.log" && grep -q "impair=[1-9]" "$KVF_RUN/dataplane2.log" \
    || { echo "FAIL: no impairment drops counted"; tail -n 5 "$KVF_RUN"/dataplane*.log; exit 1; }
fi
echo "PASS ($mode)"
