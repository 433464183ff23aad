#!/usr/bin/env bash
# The package on a booted Debian: the .deb (scripts/build-deb) installed in
# a debootstrapped bookworm chroot booted with systemd-nspawn (private
# network), where a probe unit checks, under the real systemd and the
# units' real sandboxes:
#  - kvferry.target with kvferry-dataplane (net_null) and kvferry-worker@0/@1
#    enabled into it starts them in order, and the node answers a completion;
#  - ctrlctl status works as a member of the kvferry group after the
#    dataplane started (/run/kvferry stays kvferry:kvferry 0750);
#  - the liveness of the workers holds (ctrld never takes them for dead);
#  - restarting the target restarts every unit, stopping it stops them;
#  - the dataplane without [dp] port fails once (no restart), naming the key;
#  - an upgrade (the package installed again) restarts the running daemons;
#  - purge removes the units and the enabled worker instances' links, and
#    leaves /var/lib/kvferry/model and the kvferry user.
# The chroot is cached (KVFERRY_NSPAWN_CACHE, default
# /var/tmp/kvferry-nspawn-bookworm, with the package's dependencies) and
# copied for each run.
#   nspawn_node.sh SOURCE_ROOT
# Exit 77 where it cannot: not root, no systemd-nspawn/debootstrap/script,
# no Debian archive for the first debootstrap, or no container boots here.
set -uo pipefail
root=$1
cache=${KVFERRY_NSPAWN_CACHE:-/var/tmp/kvferry-nspawn-bookworm}
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root"
for t in systemd-nspawn debootstrap script dpkg-buildpackage; do
  command -v $t >/dev/null || skip "$t not found (apt-get install systemd-container debootstrap util-linux dpkg-dev)"
done
tmp=$(mktemp -d /var/tmp/kvf-nspawn-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; [ -f "$tmp/root/probe.out" ] && sed 's/^/      /' "$tmp/root/probe.out"; exit 1; }

DEB_BUILD_OPTIONS="nocheck parallel=$(nproc)" "$root/scripts/build-deb" "$tmp/debs" >"$tmp/build.out" 2>&1 \
  || { tail -n 20 "$tmp/build.out"; fail "scripts/build-deb"; }
deb=$(ls "$tmp"/debs/kvferry_*.deb)

# the cached chroot: bookworm, systemd, and the package's dependencies
# (and net_null, this test's port)
deps=$( (dpkg-deb -f "$deb" Depends | sed 's/([^)]*)//g; s/|[^,]*//g' | tr ',' '\n' | awk 'NF { print $1 }'
         dpkg-deb -f "$deb" Depends | grep -o 'librte-net-memif[0-9]*' | sed 's/memif/null/') | sort -u)
if [ ! -f "$cache/.kvferry-deps" ] || [ "$(cat "$cache/.kvferry-deps")" != "$deps" ]; then
  if [ ! -x "$cache/lib/systemd/systemd" ]; then
    rm -rf "$cache"
    debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus,curl,util-linux bookworm "$cache" \
      http://deb.debian.org/debian >"$tmp/debootstrap.out" 2>&1 || { rm -rf "$cache"; skip "debootstrap bookworm failed (no Debian archive?): $(tail -n 2 "$tmp/debootstrap.out")"; }
  fi
  cp /etc/resolv.conf "$cache/etc/resolv.conf" 2>/dev/null
  # shellcheck disable=SC2086
  chroot "$cache" sh -c "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(echo $deps)" \
    >"$tmp/apt.out" 2>&1 || skip "the package's dependencies cannot be installed in the chroot: $(tail -n 2 "$tmp/apt.out")"
  chroot "$cache" apt-get clean
  echo "$deps" >"$cache/.kvferry-deps"
fi
cp -a "$cache" "$tmp/root" || fail "copying the cached chroot"
r=$tmp/root
# not /tmp: a booted systemd mounts a tmpfs there
cp "$deb" "$r/var/cache/kvferry.deb"
chroot "$r" dpkg -i /var/cache/kvferry.deb >"$tmp/dpkg.out" 2>&1 || { cat "$tmp/dpkg.out"; fail "dpkg -i kvferry.deb in the chroot"; }
chroot "$r" sh -c 'kvferry-mkmodel --out /var/lib/kvferry/model --preset tiny >/dev/null && chown -R kvferry:kvferry /var/lib/kvferry/model && useradd -m -G kvferry op' \
  || fail "a model and an operator in the chroot"
cat >>"$r/etc/kvferry/kvferry.conf" <<'EOF'

# --- this test's node: a dataplane on net_null creates the region, two workers, ctrld
[engine]
stages = 2
threads = 1
kv_memory = 16M
worker_region = node
worker_region_size = 0
[worker]
region = node
model = /var/lib/kvferry/model
threads = 1
[worker.0]
in = ring:serve.s0.in
out = ring:serve.s1.in
[worker.1]
in = ring:serve.s1.in
out = ring:serve.ret
[dp]
port = net_null0
region = "node"
region_size = 192
mbufs = 1023
idle_mode = sleep
EOF
cat >"$r/usr/local/sbin/kvferry-probe" <<'EOF'
#!/bin/sh
# runs once the boot's jobs are done; PASS/FAIL lines in /probe.out
exec >/probe.out 2>&1
echo booted
while systemctl list-jobs --no-legend | grep -v kvferry-probe | grep -q .; do sleep 1; done
ok() { echo "PASS $*"; }
no() { echo "FAIL $*"; }
active() { [ "$(systemctl is-active "$@" | sort -u)" = active ]; }
units="kvferry-dataplane kvferry-worker@0 kvferry-worker@1 kvferry-ctrld"
dp=kvferry-dataplane
if [ ! -d /sys/module ]; then
  # DPDK 22.11's EAL refuses to start without /sys/module (it looks for the
  # vfio module there), which some container hosts do not show: the node
  # then runs without a dataplane (ctrld creates the region), and the
  # dataplane is started beside it, to fail, for the ownership check
  echo "note: no /sys/module in this container: the node runs without its dataplane"
  # (on a region of its own: it creates its region before DPDK refuses)
  sed -i -e 's/^worker_region_size = 0$/worker_region_size = 64M/' -e 's/^region = "node"$/region = dp-only/' \
    /etc/kvferry/kvferry.conf
  units="kvferry-worker@0 kvferry-worker@1 kvferry-ctrld" dp=
fi
complete() {
  curl -s --max-time 60 http://127.0.0.1:8000/v1/completions -H 'content-type: application/json' \
    -d '{"model":"model","prompt":"Hello","max_tokens":4,"temperature":0}' | grep -q '"completion_tokens":4'
}
wait_serving() { for i in $(seq 60); do complete && return 0; sleep 1; done; return 1; }
systemctl enable $dp kvferry-worker@0 kvferry-worker@1 kvferry.target
systemctl start kvferry.target
[ -n "$dp" ] || { systemctl start kvferry-dataplane; sleep 2; }
if wait_serving && active $units kvferry.target; then ok "kvferry.target started $units and the node answers a completion"
else no "the node did not come up: $(systemctl is-active $units | tr '\n' ' ')"; journalctl -b --no-pager -o cat -u 'kvferry*' | tail -n 30; fi
t() { systemctl show -p ActiveEnterTimestampMonotonic --value "$1"; }
if { [ -z "$dp" ] || [ "$(t kvferry-dataplane)" -le "$(t kvferry-worker@0)" ]; } && [ "$(t kvferry-worker@1)" -le "$(t kvferry-ctrld)" ]; then
  ok "started in order: ${dp:+dataplane, }workers, ctrld"; else no "start order: $(for u in $units; do echo "$u=$(t $u)"; done)"; fi
if su op -s /bin/sh -c 'ctrlctl status' | grep -q "serving"; then ok "ctrlctl status as a member of the kvferry group, after the dataplane started$([ -n "$dp" ] || echo ' (and failed: no EAL here)')"
else no "ctrlctl status as op: $(su op -s /bin/sh -c 'ctrlctl status' 2>&1 | head -n 3)"; fi
if [ "$(stat -c '%U:%G %a' /run/kvferry)" = "kvferry:kvferry 750" ]; then ok "/run/kvferry is kvferry:kvferry 0750"
else no "/run/kvferry is $(stat -c '%U:%G %a' /run/kvferry)"; fi
if journalctl -b --no-pager -o cat -u kvferry-ctrld | grep -q "died"; then no "ctrld took a live worker for dead: $(journalctl -b --no-pager -o cat -u kvferry-ctrld | grep died | head -n 1)"
else ok "ctrld never took a live worker for dead"; fi
before=$(systemctl show -p MainPID --value kvferry-ctrld kvferry-worker@0 | tr '\n' ' ')
systemctl restart kvferry.target
if wait_serving && active $units && [ "$(systemctl show -p MainPID --value kvferry-ctrld kvferry-worker@0 | tr '\n' ' ')" != "$before" ]; then
  ok "restarting kvferry.target restarts its units, and the node serves again"; else no "restart of kvferry.target"; fi
systemctl stop kvferry.target
# systemctl waits for the target's own job; the units' stops (PartOf=)
# run beside it and may still be deactivating: each must end within 30 s
for _ in $(seq 300); do [ "$(systemctl is-active $units | sort -u)" = inactive ] && break; sleep 0.1; done
if [ "$(systemctl is-active $units | sort -u)" = inactive ]; then ok "stopping kvferry.target stops every unit"
else no "after stop: $(systemctl is-active $units | tr '\n' ' ')"; fi
cp /etc/kvferry/kvferry.conf /etc/kvferry/kvferry.conf.node
sed -i 's/^port = net_null0$//' /etc/kvferry/kvferry.conf
systemctl start kvferry-dataplane; sleep 6
if [ "$(systemctl is-active kvferry-dataplane)" = failed ] && [ "$(systemctl show -p NRestarts --value kvferry-dataplane)" = 0 ] \
   && journalctl -b --no-pager -o cat -u kvferry-dataplane | grep -q "port is not set: give --port, KVFERRY_DP_PORT or \[dp\] port"; then
  ok "the dataplane without [dp] port fails once, naming the key"
else no "unconfigured dataplane: $(systemctl is-active kvferry-dataplane), restarts $(systemctl show -p NRestarts --value kvferry-dataplane)"; fi
cp /etc/kvferry/kvferry.conf.node /etc/kvferry/kvferry.conf
systemctl reset-failed kvferry-dataplane
[ -n "$dp" ] || systemctl disable -q kvferry-dataplane
systemctl start kvferry.target
wait_serving || no "the node did not come back"
before=$(systemctl show -p MainPID --value kvferry-ctrld)
dpkg -i /var/cache/kvferry.deb >/tmp/upgrade.out 2>&1 || no "dpkg -i again: $(tail -n 3 /tmp/upgrade.out)"
if wait_serving && [ "$(systemctl show -p MainPID --value kvferry-ctrld)" != "$before" ] && active $units; then
  ok "an upgrade restarts the running daemons, and the node serves again"; else no "after the upgrade: $(systemctl is-active $units | tr '\n' ' ')"; fi
dpkg --purge kvferry >/tmp/purge.out 2>&1 || no "dpkg --purge: $(tail -n 3 /tmp/purge.out)"
systemctl daemon-reload
if [ ! -e /lib/systemd/system/kvferry-ctrld.service ] && [ -f /var/lib/kvferry/model/config.json ] && getent passwd kvferry >/dev/null \
   && ! ls /etc/systemd/system/kvferry.target.wants/kvferry-worker@0.service >/dev/null 2>&1 \
   && [ "$(systemctl is-active kvferry-ctrld kvferry-worker@0 | sort -u)" != active ]; then
  ok "purge stops and removes the units and the worker links, keeps /var/lib/kvferry/model and the kvferry user"
else no "purge: $(ls /etc/systemd/system/kvferry.target.wants 2>&1 | head -n 3)"; fi
echo done
systemctl poweroff
EOF
chmod +x "$r/usr/local/sbin/kvferry-probe"
cat >"$r/etc/systemd/system/kvferry-probe.service" <<'EOF'
[Unit]
Description=kvferry package probe
After=multi-user.target
[Service]
Type=simple
ExecStart=/usr/local/sbin/kvferry-probe
[Install]
WantedBy=multi-user.target
EOF
ln -s /etc/systemd/system/kvferry-probe.service "$r/etc/systemd/system/multi-user.target.wants/kvferry-probe.service"

# systemd inside wants a terminal (script gives it one) and, on a host with
# both cgroup hierarchies, the unified one
SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1 timeout 600 script -qec \
  "systemd-nspawn -D '$r' --boot --private-network --register=no --keep-unit" /dev/null >"$tmp/boot.out" 2>&1
grep -q "^booted" "$r/probe.out" 2>/dev/null || skip "no container booted here: $(tr -d '\r' <"$tmp/boot.out" | grep -v '^$' | tail -n 3 | tr '\n' ' ')"
grep -q "^done" "$r/probe.out" || fail "the probe did not finish"
sed -n 's/^PASS /ok    /p' "$r/probe.out"
grep -q "^FAIL" "$r/probe.out" && fail "$(grep -c '^FAIL' "$r/probe.out") check(s) failed in the booted container"
[ "$(grep -c '^PASS' "$r/probe.out")" = 10 ] || fail "expected 10 checks, $(grep -c '^PASS' "$r/probe.out") passed"
echo "ok    (booted bookworm in systemd-nspawn: $(head -n1 "$r/etc/debian_version"))"
