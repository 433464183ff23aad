#!/usr/bin/env bash
# The main job's own output reads as English: scripts/run (one node over shm
# rings, so no root or hugepages are needed) serves models/ferry, and its
# summary line's share of English words (/usr/share/dict/words, counted by
# scripts/readable over the served text) is at least the threshold (0.90;
# measured 1.00 of 115 words; models/small's random weights give 0.58).
#   run_readable.sh SOURCE BUILD THRESHOLD
set -u
S=$1 B=$2 T=$3
[ -f /usr/share/dict/words ] || { echo "SKIP: no /usr/share/dict/words (apt-get install wamerican)"; exit 77; }
cd "$S" || exit 1
rel=$(realpath --relative-to="$S" "$B")
out=$(KVF_BUILD=$rel timeout 300 scripts/run --no-install --topology shm 2>&1)
rc=$?
line=$(printf '%s\n' "$out" | grep "\[run\] summary:" | tail -n1)
echo "$line"
[ $rc = 0 ] || { printf '%s\n' "$out" | tail -n 30; echo "FAIL: scripts/run exited $rc"; exit 1; }
share=$(printf '%s\n' "$line" | sed -n 's/.*English words: \([0-9.]*\) (.*/\1/p')
[ -n "$share" ] || { printf '%s\n' "$out" | tail -n 30; echo "FAIL: no English-words share in the summary"; exit 1; }
python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) >= float(sys.argv[2]) else 1)" "$share" "$T" \
  || { printf '%s\n' "$out" | tail -n 30; echo "FAIL: scripts/run wrote $share English words, below $T"; exit 1; }
printf '%s\n' "$line" | grep -q "speculation on a repeating prompt: [0-9]*% of [0-9]* drafted" \
  || { echo "FAIL: the summary shows no speculation acceptance"; exit 1; }
echo "PASS: scripts/run's text is $share English words (threshold $T), with the speculation acceptance shown"
