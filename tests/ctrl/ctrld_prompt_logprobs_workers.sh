#!/usr/bin/env bash
# Integration: ctrld_prompt_logprobs.py against kvferry-ctrld whose two
# stages are kvferry-worker processes over shm rings (the columns that score
# a prompt, and their answers, cross the workers' rings): every prompt
# position's logprob equals PyTorch's.
#   ctrld_prompt_logprobs_workers.sh BUILD_DIR SOURCE_ROOT
# Exits 77 (skip) when /usr/bin/python3 lacks torch.
set -u
B=$1 S=$2
/usr/bin/python3 -c 'import torch' 2>/dev/null || { echo "SKIP: /usr/bin/python3 cannot import torch"; exit 77; }
# shellcheck source=scripts/serve-lib.sh
. "$S/scripts/serve-lib.sh"
KVF_BIN=$B KVF_BACKEND=cpu KVF_THREADS=1 KVF_KV_MEMORY=32M KVF_MODEL=$S/models/ferry
KVF_RUN=$(mktemp -d /tmp/kvferry-plp.XXXXXX)
export KVFERRY_PREFIX_CACHE=yes
cleanup() { kvf_down; rm -rf "$KVF_RUN"; }
trap cleanup EXIT
kvf_up shm 2 || { echo "FAIL: the workers and kvferry-ctrld did not start"; exit 1; }
/usr/bin/python3 "$S/tests/ctrl/ctrld_prompt_logprobs.py" --url "$KVF_URL" "$KVF_MODEL" "$S" && exit 0
for f in "$KVF_RUN"/*.log; do echo "--- $f"; tail -n 20 "$f"; done
exit 1
