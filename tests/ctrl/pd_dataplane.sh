#!/usr/bin/env bash
# A prefill node and a decode node, each with its own kvferry-dataplane, over
# net_memif (memif) or a veth pair between two network namespaces
# (netns, net_af_packet); memif-impair adds 5% loss, duplication, reordering
# and corruption. The KV pages and control messages of 64 requests cross it;
# test_pd_dataplane checks the tokens against one node's.
#   pd_dataplane.sh memif|memif-impair|netns BUILD SOURCE
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
  memif) ;;
  memif-impair) KVF_DP_EXTRA="--impair loss=0.05,dup=0.05,reorder=0.05,corrupt=0.05,seed=11" ;;
  netns) kvf_netns $$ || skip "cannot create two network namespaces joined by a veth pair"; topo=netns ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac
KVF_DP_REGION=160
kvf_dataplanes "$topo" || { echo "FAIL: the dataplanes did not start"; exit 1; }
# One process plays both ctrlds: the prefill node's on region P (node 1), the
# decode node's on region D (node 2); each reaches only its own dataplane.
timeout 300 "$B/tests/ctrl/test_pd_dataplane" "$B/kvferry-mkmodel" "$KVF_RA" 1 "$KVF_RB" 2 >"$KVF_RUN/out.log" 2>&1
rc=$?
cat "$KVF_RUN/out.log"
[ $rc = 77 ] && skip "$(tail -n1 "$KVF_RUN/out.log")"
if [ $rc != 0 ] || ! grep -q "^PASS" "$KVF_RUN/out.log"; then
  echo "FAIL: test_pd_dataplane exited $rc"
  for f in dataplane1 dataplane2; do echo "--- $f.log"; tail -n 30 "$KVF_RUN/$f.log"; done
  exit 1
fi
if [ "$mode" = memif-impair ]; then
  # the impairment really dropped frames (each dataplane counts them as it stops)
  kvf_down
  grep -q "impair=[1-9]" "$KVF_RUN/dataplane1.log" && grep -q "impair=[1-9]" "$KVF_RUN/dataplane2.log" \
    || { echo "FAIL: no impairment drops counted"; tail -n 5 "$KVF_RUN"/dataplane*.log; exit 1; }
fi
echo "PASS ($mode)"
