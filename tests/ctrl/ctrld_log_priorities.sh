#!/usr/bin/env bash
# kvferry-ctrld under systemd (JOURNAL_STREAM set) prefixes each stderr line
# with its syslog priority, so journald files errors as errors (`journalctl
# -p err`); in a terminal the lines stay plain. A fatal signal leaves a
# backtrace in the log.
#   ctrld_log_priorities.sh KVFERRY_CTRLD KVFERRY_MKMODEL
set -u
ctrld=$1 mk=$2
tmp=$(mktemp -d /tmp/kvf-logpri-XXXXXX)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
JOURNAL_STREAM=8:12345 "$ctrld" --config /dev/null --model-dir "$tmp/none" >"$tmp/err.log" 2>&1 && fail "started without a model"
head -n1 "$tmp/err.log" | grep -q "^<3>kvferry-ctrld: kn_model_open" || { cat "$tmp/err.log"; fail "the error is not at priority 3"; }
env -u JOURNAL_STREAM "$ctrld" --config /dev/null --model-dir "$tmp/none" >"$tmp/plain.log" 2>&1
head -n1 "$tmp/plain.log" | grep -q "^kvferry-ctrld: kn_model_open" || { cat "$tmp/plain.log"; fail "a terminal got a priority prefix"; }
echo "ok    a start error is <3> in the journal, plain in a terminal"
"$mk" --out "$tmp/model" --preset tiny >/dev/null || fail "kvferry-mkmodel"
JOURNAL_STREAM=8:12345 "$ctrld" --config /dev/null --model-dir "$tmp/model" --port 0 --admin-socket "$tmp/s.sock" \
  >"$tmp/run.log" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q "serving " "$tmp/run.log" && break; sleep 0.1; done
grep -q "^<6>kvferry-ctrld: serving " "$tmp/run.log" || { cat "$tmp/run.log"; fail "the serving line is not <6>"; }
if grep -v "^<[0-7]>" "$tmp/run.log" | grep -q .; then cat "$tmp/run.log"; fail "a line without a priority"; fi
echo "ok    info lines are <6>, and every line has a priority"
kill -SEGV "$pid"
wait "$pid"
st=$?
pid=
[ "$st" = $((128 + 11)) ] || { cat "$tmp/run.log"; fail "a SIGSEGV ended ctrld with status $st, not 139"; }
grep -q "^<3>kvferry-ctrld: fatal signal SIGSEGV; backtrace:" "$tmp/run.log" \
  && [ "$(sed -n '/fatal signal SIGSEGV/,$p' "$tmp/run.log" | grep -c 'kvferry-ctrld\|libc')" -ge 3 ] \
  || { cat "$tmp/run.log"; fail "a crash left no backtrace at priority 3"; }
echo "ok    a fatal signal leaves a backtrace at <3>, and ctrld still dies of it"
