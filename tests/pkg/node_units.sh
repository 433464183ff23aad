#!/usr/bin/env bash
# The packaged units and the packaged kvferry.conf agree: each unit's
# ExecStart= line, run as systemd would run it (its /usr/bin program from
# this build, the packaged file in place of /etc/kvferry/kvferry.conf, %i
# the instance, an empty environment), reads its own sections of the file.
#  - Unconfigured, each daemon exits with a status its unit's
#    RestartPreventExitStatus= lists (it fails once instead of restarting
#    every 2 s) and names the key to set.
#  - Configured as the file's own node example says (two stages over shm:
#    [engine], [worker], [worker.0], [worker.1]), kvferry-worker@0,
#    kvferry-worker@1 and then kvferry-ctrld start and answer a
#    completion; each worker took its hops from its [worker.K] and its role
#    stageK. When this runs as root, each runs as the units confine it
#    (systemd-analyze cannot start them here): an unprivileged uid with no
#    capability and no_new_privs (User=, CapabilityBoundingSet=,
#    NoNewPrivileges=), the workers without a network (PrivateNetwork=),
#    under the kernel's MDWE where it has one (MemoryDenyWriteExecute=),
#    and under strace: every syscall they make is in @system-service and
#    not in @privileged (SystemCallFilter=).
#  - As root with hugepages: the dataplane's ExecStart on a net_null port
#    creates the region, the workers and ctrld attach to it: the order of
#    kvferry.target (dataplane, workers, ctrld) brings up a node.
#   node_units.sh SOURCE_ROOT BUILD_DIR
set -uo pipefail
root=$1 b=$2
units=$root/pkg/systemd
for t in curl python3; do command -v $t >/dev/null || { echo "SKIP: $t not found"; exit 77; }; done
for p in kvferry-ctrld kvferry-worker kvferry-dataplane kvferry-mkmodel ctrlctl; do
  [ -x "$b/$p" ] || { echo "SKIP: $b/$p not built"; exit 77; }
done
tmp=$(mktemp -d /tmp/kvf-units-XXXXXX)
# the daemons may run as uid 65534 (below): their socket and traces go in run/
mkdir -m 1777 "$tmp/run" && chmod 755 "$tmp"
reg=kvfunits$$
pids=()
stop_all() {
  local i
  # the daemon, or under strace (which holds off SIGTERM while it traces
  # with -o) strace's child, the daemon; strace ends with it
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    # shellcheck disable=SC2046 # the children's pids, one word each
    kill -TERM $(ps -o pid= --ppid "${pids[$i]}" 2>/dev/null) "${pids[$i]}" 2>/dev/null
  done
  for i in "${pids[@]}"; do wait "$i" 2>/dev/null; done
  pids=()
  rm -f /dev/shm/kvferry-"$reg"* /dev/hugepages/kvferry-"$reg"* 2>/dev/null
}
trap 'stop_all; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; for f in "$tmp"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -n 20 "$f"; }; done; exit 1; }

# The packaged file, made as debian/rules makes it.
sh "$root/pkg/kvferry.conf.sh" "$b" >"$tmp/packaged.conf" || fail "pkg/kvferry.conf.sh"
"$b/kvferry-mkmodel" --out "$tmp/model" --preset tiny >/dev/null || fail "kvferry-mkmodel"
chmod -R a+rX "$tmp/model" "$tmp/packaged.conf"

# ExecStart= of UNIT on CONF, instance INST, as words; the program is this build's.
execstart() {
  local line
  line=$(sed -n 's/^ExecStart=//p' "$units/$1")
  [ "$(wc -l <<<"$line")" = 1 ] || fail "$1 has $(wc -l <<<"$line") ExecStart= lines"
  grep -q "^/usr/bin/[a-z-]* " <<<"$line" || fail "$1: ExecStart= does not start with a /usr/bin program: $line"
  line=$(sed "s|^/usr/bin/|$b/|; s|/etc/kvferry/kvferry.conf|$2|g; s|%i|${3:-}|g" <<<"$line")
  grep -q "%" <<<"$line" && fail "$1: ExecStart= has a specifier this test does not know: $line"
  echo "$line"
}
# Would systemd restart UNIT after a main process exit STATUS (Restart=,
# RestartPreventExitStatus=; a clean exit is not abnormal)?
restarts() {
  local policy prevent
  policy=$(sed -n 's/^Restart=//p' "$units/$1") prevent=$(sed -n 's/^RestartPreventExitStatus=//p' "$units/$1")
  grep -qw -- "$2" <<<"$prevent" && return 1
  case $policy in always) return 0 ;; on-failure) [ "$2" != 0 ] ;; *) return 1 ;; esac
}

# As root: the confinement of the units, emulated (see the top). Not root:
# as we are.
confine=() wconfine=() mdwe=() strace_ok=0
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
  confine=(setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all --bounding-set=-all --no-new-privs)
  # PR_SET_MDWE (65), PR_MDWE_REFUSE_EXEC_GAIN (1): inherited and kept across execve
  if python3 -c 'import ctypes,sys; sys.exit(ctypes.CDLL(None, use_errno=True).prctl(65, 1, 0, 0, 0) != 0)' 2>/dev/null; then
    mdwe=(python3 -c 'import ctypes,os,sys; ctypes.CDLL(None).prctl(65, 1, 0, 0, 0) == 0 or sys.exit("PR_SET_MDWE failed"); os.execvp(sys.argv[1], sys.argv[1:])')
  else
    echo "note  this kernel has no PR_SET_MDWE: MemoryDenyWriteExecute= is not emulated"
  fi
  command -v unshare >/dev/null && unshare -n true 2>/dev/null && wconfine=(unshare -n)
  command -v strace >/dev/null && strace -f -qq -o /dev/null true 2>/dev/null && strace_ok=1
  [ $strace_ok = 1 ] || echo "note  no strace: the syscalls are not checked against SystemCallFilter="
fi
# start NAME UNIT CONF [INST]: the unit's ExecStart= in the background, its log NAME.log
start() {
  local name=$1 unit=$2 conf=$3 inst=${4:-} pre=()
  read -r -a cmd <<<"$(execstart "$unit" "$conf" "$inst")"
  [ ${#confine[@]} -gt 0 ] && pre=("${confine[@]}")
  case $unit in kvferry-worker@*) [ ${#wconfine[@]} -gt 0 ] && pre=("${wconfine[@]}" "${pre[@]}");; esac
  [ ${#mdwe[@]} -gt 0 ] && pre+=("${mdwe[@]}")
  [ $strace_ok = 1 ] && pre+=(strace -f -qq -o "$tmp/run/$name.strace")
  # emptied here, not by the background job's redirection: a wait_log right
  # after must not read a previous run's "serving" line before the job starts
  : >"$tmp/$name.log"
  (cd / && exec env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "${pre[@]}" "${cmd[@]}") >>"$tmp/$name.log" 2>&1 &
  pids+=($!)
}
wait_log() { # FILE PATTERN SECONDS: 1 also as soon as a daemon started here has exited
  local i p
  for ((i = 0; i < $3 * 10; i++)); do
    grep -q -- "$2" "$1" 2>/dev/null && return 0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || { echo "      (a daemon exited)"; return 1; }; done
    sleep 0.1
  done
  return 1
}

# --- 1. unconfigured: one failure each, the key named -----------------------
check_unconfigured() { # UNIT INST PATTERN
  local st
  read -r -a cmd <<<"$(execstart "$1" "$tmp/packaged.conf" "$2")"
  (cd / && env -i PATH=/usr/bin:/bin timeout 30 "${cmd[@]}") >"$tmp/unconf.log" 2>&1
  st=$?
  [ "$st" != 0 ] && [ "$st" -lt 124 ] || fail "$1 unconfigured exits $st"
  restarts "$1" "$st" && fail "$1 unconfigured exits $st, which its Restart=/RestartPreventExitStatus= restart: every 2 s, forever"
  grep -q -- "$3" "$tmp/unconf.log" || fail "$1 unconfigured does not name the key ($3): $(cat "$tmp/unconf.log")"
}
check_unconfigured kvferry-dataplane.service "" "port is not set: give --port, KVFERRY_DP_PORT or \[dp\] port"
check_unconfigured kvferry-worker@.service 0 "region is not set: .*\[worker\] region or \[worker.0\] region"
if [ ! -e /var/lib/kvferry/model ]; then
  check_unconfigured kvferry-ctrld.service "" "kn_model_open(/var/lib/kvferry/model).*set model_dir"
fi
echo "ok    unconfigured, each unit's daemon exits naming the key to set, with a status its unit does not restart"

# --- 1b. kvferry-worker@K reads [worker.K] over [worker], wherever it stands ---
# (role is the observable: one longer than 23 bytes is refused naming its line)
long=role-much-longer-than-the-limit
wk() { env -i PATH=/usr/bin:/bin "$b/kvferry-worker" --config "$tmp/inst.conf" --region r --model m --in ring:a --out ring:b "$@" --check >"$tmp/inst.out" 2>&1; }
printf '[worker.3]\nrole = %s\n[http]\nport = 1\n[worker]\nrole = short\n[worker.4]\nthreads = 2\n' "$long" >"$tmp/inst.conf"
wk --instance 3 && fail "[worker.3] role (before [worker] in the file) did not win for --instance 3"
grep -q "role '$long' (from $tmp/inst.conf:2)" "$tmp/inst.out" || fail "--instance 3: $(cat "$tmp/inst.out")"
wk --instance 4 || fail "--instance 4 read [worker.3]: $(cat "$tmp/inst.out")"
wk || fail "no --instance read [worker.3]: $(cat "$tmp/inst.out")"
printf '[worker]\nrole = %s\n[worker.3]\nrole = short\n' "$long" >"$tmp/inst.conf"
wk --instance 3 || fail "[worker.3] role (after [worker]) did not win for --instance 3: $(cat "$tmp/inst.out")"
wk --instance 4 && fail "--instance 4 took [worker.3]'s role"
printf '[worker.3]\nrole = x\nbogus = 1\n' >"$tmp/inst.conf"
env -i "$b/kvferry-dataplane" --config "$tmp/inst.conf" --port net_null0 --region r --check >"$tmp/inst.out" 2>&1 \
  || fail "the dataplane does not skip [worker.3]: $(cat "$tmp/inst.out")"
env -i "$b/kvferry-ctrld" --config "$tmp/inst.conf" --model-dir "$tmp/model" --check >"$tmp/inst.out" 2>&1 \
  || fail "ctrld does not skip [worker.3]: $(cat "$tmp/inst.out")"
echo "ok    kvferry-worker --instance K takes [worker.K] over [worker] wherever it stands, skips other instances; ctrld and the dataplane skip them"

# --- 2. a two-stage node over shm, as the file's example says ---------------
node_conf() { # OUT [EXTRA LINES...]: the packaged file, then this node's sections
  local out=$1
  shift
  {
    cat "$tmp/packaged.conf"
    cat <<EOF

[http]
listen_address = 127.0.0.1
port = 0
[model]
model_dir = $tmp/model
[engine]
stages = 2
threads = 1
kv_memory = 16M
worker_region = $reg
worker_region_size = 64M
worker_join_timeout = 120
[ctrl]
admin_socket = $tmp/run/ctrl.sock
[worker]
region = $reg
model = $tmp/model
threads = 1
[worker.0]
in = ring:serve.s0.in
out = ring:serve.s1.in
[worker.1]
in = ring:serve.s1.in
out = ring:serve.ret
EOF
    for l in "$@"; do echo "$l"; done
  } >"$out"
  chmod a+r "$out"
}
serve_check() { # TAG: ctrld up, a completion, ctrlctl status, each worker's role
  wait_log "$tmp/ctrld.log" "serving " 180 || fail "$1: kvferry-ctrld did not start serving"
  url=$(sed -n 's/.* on \(http:\/\/[^,]*\), admin.*/\1/p' "$tmp/ctrld.log" | head -n1)
  [ -n "$url" ] || fail "$1: no URL in ctrld's log"
  name=$(sed -n 's/.*: serving \([^ ]*\) (.*/\1/p' "$tmp/ctrld.log" | head -n1)
  out=$(curl -s --max-time 120 "$url/v1/completions" -H 'content-type: application/json' \
        -d "{\"model\":\"$name\",\"prompt\":\"Hello\",\"max_tokens\":4,\"temperature\":0}") \
    || fail "$1: the completion failed: $out"
  grep -q '"completion_tokens":4' <<<"$out" || fail "$1: the completion did not carry 4 tokens: $out"
  "$b/ctrlctl" --socket "$tmp/run/ctrl.sock" status >"$tmp/status.out" 2>&1 || fail "$1: ctrlctl status: $(cat "$tmp/status.out")"
  for k in 0 1; do
    grep -q "kvferry-worker\[stage$k\]" "$tmp/worker$k.log" || fail "$1: worker@$k did not take the role stage$k"
  done
  grep -q "stage1" <<<"$("$b/ctrlctl" --socket "$tmp/run/ctrl.sock" stages 2>&1)" || fail "$1: ctrlctl stages does not show stage1"
}
node_conf "$tmp/node.conf"
start worker0 kvferry-worker@.service "$tmp/node.conf" 0
start worker1 kvferry-worker@.service "$tmp/node.conf" 1
start ctrld kvferry-ctrld.service "$tmp/node.conf"
serve_check "shm node"
how="as we are"
[ ${#confine[@]} -gt 0 ] && how="as uid 65534, no capability, no_new_privs, workers without a network${mdwe:+, under MDWE}"
echo "ok    kvferry-worker@0, @1 and kvferry-ctrld started from their ExecStart= on the packaged file serve a completion ($how)"
stop_all

# check_syscalls ALLOWED NAME...: every syscall NAME made under strace is
# one the units' filter lets through (in @system-service, not in
# @privileged) or one of ALLOWED (comma-separated: refused, and harmless)
cat >"$tmp/syscalls.py" <<'EOF'
import re, subprocess, sys
out = subprocess.run(["systemd-analyze", "syscall-filter", "--no-pager"], capture_output=True, text=True).stdout
groups, cur = {}, None
for line in out.splitlines():
    if line.startswith("@"):
        cur = groups.setdefault(line.strip(), [])
    elif line.startswith("    ") and not line.strip().startswith("#") and cur is not None:
        cur.append(line.strip())
def expand(g, seen):
    r = set()
    for m in groups.get(g, []):
        if m.startswith("@"):
            if m not in seen:
                seen.add(m)
                r |= expand(m, seen)
        else:
            r.add(m)
    return r
if not groups:
    sys.exit("systemd-analyze syscall-filter listed nothing")
allowed = expand("@system-service", set()) - expand("@privileged", set())
bad = False
extra_ok = set(filter(None, sys.argv[2].split(",")))
for name in sys.argv[3:]:
    calls = set()
    for line in open("%s/run/%s.strace" % (sys.argv[1], name)):
        m = re.match(r"^\d+ +([a-z_0-9]+)\(", line)
        if m:
            calls.add(m.group(1))
    # execve of the daemon itself happens before the filter is installed
    extra = sorted(calls - allowed - extra_ok - {"execve"})
    print("      %s: %d distinct syscalls%s" % (name, len(calls), ", outside: " + " ".join(extra) if extra else ""))
    bad |= bool(extra)
sys.exit(1 if bad else 0)
EOF
check_syscalls() { python3 "$tmp/syscalls.py" "$tmp" "$@"; }
if [ $strace_ok = 1 ]; then
  check_syscalls "" worker0 worker1 ctrld || fail "a daemon makes a syscall the units' SystemCallFilter= refuses"
  echo "ok    every syscall of the workers and ctrld is in @system-service and none in @privileged (SystemCallFilter=)"
fi

# --- 3. dataplane first: it creates the region, the others attach -----------
hp_free=$(awk '/HugePages_Free/{print $2}' /proc/meminfo)
if [ "$(id -u)" != 0 ] || [ "${hp_free:-0}" -lt 160 ]; then
  echo "skip  the dataplane's unit (needs root and 160 free hugepages for DPDK; have ${hp_free:-0})"
  exit 0
fi
node_conf "$tmp/dp.conf" "[engine]" "worker_region_size = 0" "worker_return = ring" \
  "[dp]" "port = net_null0" "region = $reg" "region_size = 192" "mbufs = 1023" "idle_mode = sleep" "eal = -l 0"
start dataplane kvferry-dataplane.service "$tmp/dp.conf"
wait_log "$tmp/dataplane.log" "memory:" 60 || fail "the dataplane did not start"
start worker0 kvferry-worker@.service "$tmp/dp.conf" 0
start worker1 kvferry-worker@.service "$tmp/dp.conf" 1
start ctrld kvferry-ctrld.service "$tmp/dp.conf"
serve_check "dataplane node"
grep -q "region '$reg'" "$tmp/dataplane.log" || fail "the dataplane did not create region $reg"
stop_all
if [ $strace_ok = 1 ]; then
  # iopl(2): a PMD's constructor tries it; refused (EPERM) under the filter, harmless (kvferry-dataplane.service)
  check_syscalls iopl dataplane || fail "the dataplane makes a syscall its unit's SystemCallFilter= refuses"
fi
echo "ok    in kvferry.target's order, kvferry-dataplane (net_null) creates the region, the workers and ctrld attach and serve$([ $strace_ok = 1 ] && echo "; the dataplane's syscalls pass its filter")"
