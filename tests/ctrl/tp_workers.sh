#!/usr/bin/env bash
# Integration: tensor parallelism across worker processes (CPU backend).
# kvferry-ctrld and two stages over shm rings (scripts/serve-lib.sh's shm
# topology) on a generated model whose heads and MLP split (the small
# preset, 2 layers), 8 streaming clients (greedy and seeded, half with
# logprobs):
#  1. stage 0 run by 2 worker processes (--tp-size 2, ranks 0 and 1): every
#     answer equals the run with one worker per stage, text, tokens and
#     logprobs, bit for bit (the CPU engine's ranks add their partial sums
#     in the order that gives the unsharded bits: kn_cpu.c);
#  2. the same with 4 ranks;
#  3. rank 1 SIGKILLed mid-stream and started again at once: the group
#     starts again whole (rank 0 sees it gone), ctrld replays what was in
#     flight, and every answer still equals the reference; no KV block left;
#  4. the ranks declared once in kvferry.conf ([worker.0] tp_size = 2) and
#     started as instances 0 and 0-1, as kvferry-worker@0-1.service does:
#     the same answers.
#   tp_workers.sh BUILD_DIR SOURCE_ROOT
# KVF_BACKEND=cuda runs the same on a GPU (BUILD_DIR: scripts/gpu-carry's
# bin): the ranks share the one GPU and sum on the host (no NCCL between
# ranks of one device), their sums in another order than one worker's, so
# each answer must complete in full and the share of identical answers and
# tokens is printed (not asserted: near-ties of random weights may flip).
# With KVF_TP_GPUS=1 on a machine with a GPU per rank, rank r runs on
# device r and the ranks sum with NCCL (the workers' logs say which).
set -u
B=$(cd "$1" && pwd) S=$(cd "$2" && pwd)
skip() { echo "SKIP: $*"; exit 77; }
command -v python3 >/dev/null || skip "python3 missing"
command -v curl >/dev/null || skip "curl missing"

KVF_BIN=$B KVF_BACKEND=${KVF_BACKEND:-cpu} KVF_THREADS=1 KVF_KV_MEMORY=16M
# CUDA workers: wider output areas than the CPU's, and every process of the
# one GPU a small share of its memory for KV
[ "$KVF_BACKEND" = cuda ] && KVF_WREGION_SIZE=512M KVF_CTRLD_EXTRA="--kv-mem-fraction 0.04"
KVF_RUN=$(mktemp -d /tmp/kvferry-tp.XXXXXX)
KVF_MODEL=$KVF_RUN/tiny # the name stream_clients.py asks for; the small preset inside
. "$S/scripts/serve-lib.sh"
cleanup() { kvf_down; [ -n "${KEEP:-}" ] || rm -rf "$KVF_RUN"; }
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$KVF_RUN"/*.log; do echo "--- $f"; tail -n 25 "$f"; done
  exit 1
}
"$B/kvferry-mkmodel" --out "$KVF_MODEL" --preset small --layers 2 --seed 12 >/dev/null || fail "kvferry-mkmodel"

clients() { python3 "$S/tests/ctrl/stream_clients.py" "$KVF_URL" "$KVF_RUN/$1.json" "$KVF_RUN/$1.ready" "$2" "$3"; }
wait_ready() {
  for _ in $(seq 600); do [ -e "$KVF_RUN/$1.ready" ] && return 0; sleep 0.05; done
  fail "the streams of $1 did not start"
}
same() { # REF RUN WHAT
  python3 - "$KVF_RUN/$1.json" "$KVF_RUN/$2.json" "$3" "$KVF_BACKEND" <<'EOF'
import json, sys
ref, run = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert len(ref) == len(run), (len(ref), len(run))
if sys.argv[4] == "cuda":
    n_same = n_tok = n_all = 0
    for i, (a, b) in enumerate(zip(ref, run)):
        assert b["status"] == 200 and b["done"] and not b["errors"], (i, b["status"], b["errors"])
        assert a["usage"] == b["usage"] and a["finish"] == b["finish"], (i, a["usage"], b["usage"])
        n_same += a["tokens"] == b["tokens"]
        k = 0
        while k < min(len(a["tokens"]), len(b["tokens"])) and a["tokens"][k] == b["tokens"][k]:
            k += 1
        n_tok += k
        n_all += len(a["tokens"])
    print("ok    %s: every answer complete; %d of %d identical to one worker per stage's, %d of %d tokens "
          "before the first difference" % (sys.argv[3], n_same, len(ref), n_tok, n_all))
    sys.exit(0)
for i, (a, b) in enumerate(zip(ref, run)):
    assert b["status"] == 200 and b["done"] and not b["errors"], (i, b["status"], b["errors"])
    for k in ("text", "tokens", "token_logprobs", "top_logprobs", "finish", "usage"):
        assert a[k] == b[k], "client %d: %s differs from one worker per stage:\n%r\n%r" % (i, k, a[k], b[k])
print("ok    %s: every answer equals one worker per stage's (text, tokens, logprobs)" % sys.argv[3])
EOF
}
blocks_back() {
  for _ in $(seq 100); do
    [ "$("$B/ctrlctl" --socket "$KVF_SOCK" --json pool | python3 -c 'import json,sys; d=json.load(sys.stdin)["data"][0]; print(d["blocks_in_use"] + d["live"])')" = 0 ] && return 0
    sleep 0.1
  done
  "$B/ctrlctl" --socket "$KVF_SOCK" pool
  fail "$1: KV blocks or requests left in the scheduler"
}

# the reference: one worker per stage
kvf_up shm 2 || fail "the shm topology did not come up"
clients ref 8 160 || fail "the reference clients"
same ref ref "one worker per stage (the reference)" >/dev/null || fail "the reference run itself is not clean"
kvf_down
KVF_PIDS=()

# 1 and 2: stage 0 as 2, then 4 ranks
for T in 2 4; do
  KVF_TP_STAGE=0 KVF_TP=$T kvf_up shm 2 || fail "the shm topology with stage 0 as $T ranks did not come up"
  for _ in $(seq 50); do grep -q "rank 0 of $T" "$KVF_RUN/worker0.log" && break; sleep 0.1; done
  grep -q "rank 0 of $T" "$KVF_RUN/worker0.log" || fail "stage 0's worker is not rank 0 of $T"
  clients tp$T 8 160 || fail "the clients with $T ranks"
  same ref tp$T "stage 0 as $T worker processes (tensor parallelism)" || fail "answers with $T ranks"
  # ctrlctl stages names the stage's ranks, rank 0 first
  want="${KVF_WPIDS[0]}"
  for ((r = 1; r < T; r++)); do want="$want,${KVF_TPPIDS[$r]}"; done
  got=$("$B/ctrlctl" --socket "$KVF_SOCK" --json stages | python3 -c 'import json,sys; s=json.load(sys.stdin)["data"]["stages"]; print(s[0]["tp"], s[0]["tp_pids"], s[1]["tp"])')
  [ "$got" = "$T $want 1" ] || fail "ctrlctl stages says '$got' for the stages' ranks, not '$T $want 1'"
  echo "ok    ctrlctl stages: stage 0 has $T ranks (pids $want), stage 1 one"
  [ $T = 4 ] || { kvf_down; KVF_PIDS=(); }
done

# 3. rank 1 killed mid-stream and started again at once
rm -f "$KVF_RUN/kill.ready"
clients kill 8 160 & cli=$!
wait_ready kill
kill -9 "${KVF_TPPIDS[1]}"
${KVF_TPCMD[1]} >>"$KVF_RUN/worker0.tp1.log" 2>&1 &
KVF_PIDS+=($!)
wait $cli || fail "the clients of the run with a killed rank"
same ref kill "rank 1 killed mid-stream and started again at once" || fail "a client saw the rank's death"
grep -q "starting again" "$KVF_RUN/worker0.log" || fail "rank 0 did not start again when rank 1 died"
# ctrld saw the stage go by its liveness slot, not by the 30 s group timeout
# (rank 0 releases its slot and registers anew as it starts again)
! grep -q "within group_timeout" "$KVF_RUN/ctrld.log" \
  || fail "ctrld noticed the stage's restart only by its group timeout: $(grep -m1 'within group_timeout' "$KVF_RUN/ctrld.log")"
clients after 8 160 || fail "the clients after the restart"
same tp4 after "after the group started again" || fail "answers after the restart"
blocks_back "after the kill"
echo "ok    every KV block back in the pool"

# 4. the stage's ranks declared once, as the package's units start them:
# [worker.0] says tp_size 2, instances 0 and 0-1 are its ranks (the same
# ring, roles stage0 and stage0.tp1), instance 1 the next stage; then
# ctrld as kvf_up starts it, on the same region
kvf_down
KVF_PIDS=()
cat > "$KVF_RUN/kvferry.conf" <<CONF
[worker]
region = $KVF_RA
model = $KVF_MODEL
backend = $KVF_BACKEND
threads = 1
[worker.0]
in = ring:serve.s0.in
out = ring:serve.s1.in
tp_size = 2
[worker.1]
in = ring:serve.s1.in
out = ring:serve.ret
CONF
rm -f /dev/hugepages/*"$KVF_RA"* /dev/shm/*"$KVF_RA"* 2>/dev/null
for i in 0 0-1 1; do
  env -u KVFERRY_CONFIG "$B/kvferry-worker" --config "$KVF_RUN/kvferry.conf" --instance $i >"$KVF_RUN/declared.$i.log" 2>&1 &
  KVF_PIDS+=($!)
done
"${KVF_CTRLD_CMD[@]}" >"$KVF_RUN/ctrld.declared.log" 2>&1 &
KVF_CTRLD=$!
KVF_PIDS+=($!)
kvf_wait_log "$KVF_RUN/ctrld.declared.log" "serving " 150 || fail "ctrld did not serve the declared ranks"
for _ in $(seq 100); do # the line may still be being written
  KVF_URL=$(sed -n 's/.* on \(http:\/\/[^,]*\), admin.*/\1/p' "$KVF_RUN/ctrld.declared.log" | head -n1)
  [ -n "$KVF_URL" ] && break
  sleep 0.02
done
grep -q "tensor parallelism: rank 1 of 2 of the stage fed by serve.s0.in" "$KVF_RUN/declared.0-1.log" \
  || fail "instance 0-1 is not rank 1 of stage 0"
clients declared 8 160 || fail "the clients of the declared ranks"
same ref declared "stage 0's 2 ranks declared in [worker.0], started as instances 0 and 0-1" \
  || fail "answers of the declared ranks"
echo "PASS: a stage as 2 and 4 worker processes gives one worker's answers, and survives a killed rank"
