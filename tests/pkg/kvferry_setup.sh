#!/usr/bin/env bash
# kvferry-setup, where no NIC can be bound: the refusals on real interfaces
# (the one carrying the default route, in a network namespace of its own and
# on this machine; a dummy and a veth, which are virtual), then the whole
# bind / unbind round trip on a PCI NIC stood in for by a scratch sysfs and
# a dpdk-devbind.py that only records what it is asked (the dry-run output,
# /etc/dpdk/interfaces as dpdk.service reads it, the udev rule, the record
# of the kernel driver, all under a scratch root, which the undo leaves as
# it found it), and hugepages: the dry run and refusals, then a real
# reservation of two more pages on node 0 through dpdk-hugepages.py,
# persisted in a scratch /etc/dpdk/dpdk.conf, and its release back to the
# count this machine had (restored on any exit).
#   kvferry_setup.sh KVFERRY_SETUP
set -uo pipefail
setup=$1
tmp=$(mktemp -d /tmp/kvf-setup-XXXXXX)
ns=
hp_file='' hp_before=''
cleanup() {
  [ -n "$ns" ] && ip netns del "$ns" 2>/dev/null
  [ -n "$hp_file" ] && [ "$(cat "$hp_file")" != "$hp_before" ] && echo "$hp_before" >"$hp_file"
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; [ -f "$tmp/out" ] && sed 's/^/      /' "$tmp/out"; exit 1; }
run() { "$@" >"$tmp/out" 2>&1; echo $?; }
is_root=0
[ "$(id -u)" = 0 ] && is_root=1

"$setup" --help >"$tmp/out" 2>&1 || fail "--help"
for w in "nic bind" "nic unbind" "hugepages reserve" "release" "--dry-run" "--persist-only" "--root"; do
  grep -q -- "$w" "$tmp/out" || fail "--help does not mention $w"
done
"$setup" --version | grep -q "^kvferry-setup [0-9]" || fail "--version"
[ "$(run "$setup" frobnicate)" = 2 ] || fail "an unknown command is not a usage error"

# --- refusals on real interfaces ---------------------------------------------
[ "$(run "$setup" --dry-run nic bind kvfnosuch0)" = 2 ] || fail "a missing device is not refused"
grep -q "neither an interface nor a PCI address" "$tmp/out" || fail "a missing device: message"
dflt=$(ip -o route show default 2>/dev/null | sed -n 's/.* dev \([^ ]*\).*/\1/p' | head -n1)
if [ -n "$dflt" ]; then
  [ "$(run "$setup" --dry-run nic bind "$dflt")" = 2 ] || fail "$dflt (this machine's default route) is not refused"
  grep -q "$dflt carries the default route" "$tmp/out" || fail "default route: message"
  echo "ok    this machine's default-route interface ($dflt) is refused"
fi
if [ $is_root = 1 ] && command -v ip >/dev/null && ip netns add "kvfsetup$$" 2>/dev/null; then
  ns=kvfsetup$$
  nsx() { ip netns exec "$ns" "$@"; }
  # the default route through one end of a veth pair (a dummy where the kernel has the module)
  nsx ip link add kvfr0 type veth peer name kvfr1 && nsx ip link set kvfr1 up && nsx ip link set kvfr0 up \
    && nsx ip addr add 10.77.0.2/24 dev kvfr0 && nsx ip route add default via 10.77.0.1 dev kvfr0 \
    || fail "a veth with the default route in $ns"
  nsx ip link add kvfva type veth peer name kvfvb || fail "a veth pair in $ns"
  virt="kvfva kvfvb"
  nsx ip link add kvfd1 type dummy 2>/dev/null && virt="kvfd1 $virt"
  [ "$(run nsx "$setup" nic bind kvfr0)" = 2 ] || fail "the namespace's default-route interface is not refused"
  grep -q "kvfr0 carries the default route" "$tmp/out" || fail "netns default route: message"
  # whatever the options: no --force exists, --persist-only and --root do not help
  [ "$(run nsx "$setup" --persist-only --root "$tmp" nic bind kvfr0)" = 2 ] || fail "--persist-only binds the default route"
  [ ! -e "$tmp/etc" ] || fail "a refused bind wrote under --root"
  for i in $virt; do
    [ "$(run nsx "$setup" --dry-run nic bind $i)" = 2 ] || fail "virtual $i is not refused"
    grep -q "$i is a virtual interface" "$tmp/out" && grep -q "net_af_packet0,iface=$i" "$tmp/out" \
      || fail "virtual $i: message"
  done
  echo "ok    in a network namespace: the default-route interface refused (also --persist-only); $virt refused as virtual, naming the af_packet vdev"
else
  echo "skip  network namespace refusals (need root and ip netns)"
fi

# --- a PCI NIC in a scratch sysfs, a recording dpdk-devbind.py ----------------
S=$tmp/sys R=$tmp/root
dev=$S/devices/pci0000:00/0000:00:09.0
mkdir -p "$dev/net/kvfens9" "$S/bus/pci/devices" "$S/bus/pci/drivers/e1000e" "$S/bus/pci/drivers/vfio-pci" \
  "$S/class/net" "$S/kernel/iommu_groups/7/devices" "$S/devices/system/node" "$S/kernel/mm/hugepages" "$R/etc/dpdk"
echo 0x020000 >"$dev/class"
ln -s "$S/bus/pci" "$dev/subsystem"
ln -s "$S/bus/pci/drivers/e1000e" "$dev/driver"
ln -s "$S/kernel/iommu_groups/7" "$dev/iommu_group"
ln -s "$dev" "$dev/net/kvfens9/device"
ln -s "$dev" "$S/bus/pci/devices/0000:00:09.0"
ln -s "$dev/net/kvfens9" "$S/class/net/kvfens9"
gpu=$S/devices/pci0000:00/0000:00:0a.0
mkdir -p "$gpu" && echo 0x030200 >"$gpu/class" && ln -s "$gpu" "$S/bus/pci/devices/0000:00:0a.0"
cat >"$tmp/devbind" <<EOF
#!/bin/sh
echo "\$*" >>"$tmp/devbind.calls"
case \$1 in
--status-dev) echo "Network devices (scratch): 0000:00:09.0 drv=\$(basename \$(readlink "$dev/driver"))" ;;
--bind=*) mkdir -p "$S/bus/pci/drivers/\${1#--bind=}"; ln -sfn "$S/bus/pci/drivers/\${1#--bind=}" "$dev/driver" ;;
esac
EOF
chmod +x "$tmp/devbind"
# Debian's own file: kvferry-setup adds an entry and its undo takes it away
if [ -f /etc/dpdk/interfaces ]; then cp /etc/dpdk/interfaces "$R/etc/dpdk/interfaces"
else printf '# <bus>\t<id>\t\t<driver>\n' >"$R/etc/dpdk/interfaces"; fi
cp "$R/etc/dpdk/interfaces" "$tmp/interfaces.orig"
export KVFERRY_SETUP_SYSFS=$S DPDK_DEVBIND=$tmp/devbind
sum() { (cd "$R" && find . -type f -exec md5sum {} + | sort); }

[ "$(run "$setup" --root "$R" --dry-run nic bind kvfens9)" = 0 ] || fail "--dry-run nic bind kvfens9"
grep -q "device 0000:00:09.0 (kvfens9), driver now: e1000e" "$tmp/out" || fail "dry run: the device and its driver"
grep -q "would run: $tmp/devbind --bind=vfio-pci 0000:00:09.0" "$tmp/out" || fail "dry run: the devbind command"
grep -q "would change $R/etc/dpdk/interfaces:" "$tmp/out" || fail "dry run: the interfaces file"
grep -qP "^    \+pci\t0000:00:09.0\tvfio-pci$" "$tmp/out" || fail "dry run: the entry (a line the diff adds)"
grep -q "would write $R/etc/udev/rules.d/60-kvferry-vfio.rules:" "$tmp/out" || fail "dry run: the udev rule"
grep -q -- "--bind" "$tmp/devbind.calls" && fail "the dry run called devbind --bind"
cmp -s "$R/etc/dpdk/interfaces" "$tmp/interfaces.orig" || fail "the dry run changed the interfaces file"
[ ! -e "$R/run" ] && [ ! -e "$R/etc/udev" ] || fail "the dry run left a record or a rule"
echo "ok    --dry-run nic bind shows the device, the devbind command and the files, and changes nothing"

[ "$(run "$setup" --root "$R" --dry-run nic bind 0000:00:0a.0)" = 2 ] || fail "a display controller is not refused"
grep -q "not a network controller (PCI class 0x030200)" "$tmp/out" || fail "not a NIC: message"
[ "$(run "$setup" --root "$R" --dry-run nic bind 00:0b.0)" = 2 ] || fail "a missing PCI address is not refused"
[ "$(run "$setup" --root "$R" --dry-run --driver e1000e nic bind kvfens9)" = 2 ] || fail "--driver e1000e binds"
rmdir "$S/kernel/iommu_groups/7/devices" "$S/kernel/iommu_groups/7"
[ "$(run "$setup" --root "$R" nic bind kvfens9)" = 2 ] || fail "vfio-pci without an IOMMU is not refused"
grep -q "no IOMMU groups.*intel_iommu=on iommu=pt" "$tmp/out" || fail "no IOMMU: message"
mkdir -p "$S/kernel/iommu_groups/7/devices"
echo "ok    refused: a display controller, a missing PCI address, a kernel driver as --driver, vfio-pci without an IOMMU"

: >"$tmp/devbind.calls"
[ "$(run "$setup" --root "$R" nic bind kvfens9)" = 0 ] || fail "nic bind kvfens9"
grep -qx -- "--bind=vfio-pci 0000:00:09.0" "$tmp/devbind.calls" || fail "devbind was not asked to bind: $(cat "$tmp/devbind.calls")"
grep -q "^before:" "$tmp/out" && grep -q "^after:" "$tmp/out" || fail "no before/after status"
grep -A1 "^after:" "$tmp/out" | grep -q "drv=vfio-pci" || fail "the after status does not show vfio-pci"
# as dpdk.service's dpdk-init reads it: the lines that are not comments, BUS ID MOD
entries=$(grep -v '^[ \t]*#' "$R/etc/dpdk/interfaces" | while read -r bus id mod; do [ -n "$bus" ] && echo "$bus $id $mod"; done)
[ "$entries" = "pci 0000:00:09.0 vfio-pci" ] || fail "dpdk-init would read '$entries' from /etc/dpdk/interfaces"
grep -q "^# kvferry-setup: 0000:00:09.0 was e1000e (kvfens9)$" "$R/etc/dpdk/interfaces" || fail "no record of e1000e in the entry"
grep -q 'SUBSYSTEM=="vfio", KERNEL!="vfio", GROUP="kvferry", MODE="0660"' "$R/etc/udev/rules.d/60-kvferry-vfio.rules" \
  || fail "no udev rule for /dev/vfio/N"
[ "$(cat "$R/run/kvferry-setup/nic-0000:00:09.0")" = "e1000e kvfens9" ] || fail "no record since boot"
# twice is once
[ "$(run "$setup" --root "$R" nic bind 0000:00:09.0)" = 0 ] || fail "nic bind again"
grep -q "bound to vfio-pci already" "$tmp/out" || fail "a second bind does not say it is bound already"
[ "$(grep -c "^pci" "$R/etc/dpdk/interfaces")" = 1 ] || fail "a second bind added a second entry"
grep -q "was e1000e" "$R/etc/dpdk/interfaces" || fail "a second bind lost the kernel driver"
echo "ok    nic bind: dpdk-devbind.py --bind=vfio-pci, before/after, /etc/dpdk/interfaces as dpdk-init reads it, the udev rule; twice is once"

: >"$tmp/devbind.calls"
[ "$(run "$setup" --root "$R" nic unbind 0000:00:09.0)" = 0 ] || fail "nic unbind"
grep -qx -- "--bind=e1000e 0000:00:09.0" "$tmp/devbind.calls" || fail "unbind did not return it to e1000e: $(cat "$tmp/devbind.calls")"
cmp -s "$R/etc/dpdk/interfaces" "$tmp/interfaces.orig" || { diff "$tmp/interfaces.orig" "$R/etc/dpdk/interfaces"; fail "unbind did not restore /etc/dpdk/interfaces"; }
[ ! -e "$R/etc/udev/rules.d/60-kvferry-vfio.rules" ] || fail "unbind left the udev rule"
[ ! -e "$R/run/kvferry-setup/nic-0000:00:09.0" ] || fail "unbind left the record"
[ "$(run "$setup" --root "$R" nic unbind 0000:00:09.0)" = 2 ] || fail "unbind without a record is not refused"
grep -q "give --driver" "$tmp/out" || fail "unbind without a record: message"
echo "ok    nic unbind: back to e1000e, /etc/dpdk/interfaces byte for byte as before, rule and record gone; without a record it asks for --driver"

: >"$tmp/devbind.calls"
[ "$(run "$setup" --root "$R" --persist-only nic bind kvfens9)" = 0 ] || fail "--persist-only nic bind"
grep -q -- "--bind" "$tmp/devbind.calls" && fail "--persist-only called devbind --bind"
grep -qP "^pci\t0000:00:09.0\tvfio-pci$" "$R/etc/dpdk/interfaces" || fail "--persist-only wrote no entry"
[ "$(run "$setup" --root "$R" --persist-only nic unbind 0000:00:09.0)" = 0 ] || fail "--persist-only nic unbind"
cmp -s "$R/etc/dpdk/interfaces" "$tmp/interfaces.orig" || fail "--persist-only unbind did not restore the file"
echo "ok    --persist-only writes and removes the entry for the next boot without touching the device"
unset KVFERRY_SETUP_SYSFS DPDK_DEVBIND

# --- hugepages ----------------------------------------------------------------
node0=/sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages
[ "$(run "$setup" --root "$R" --dry-run hugepages reserve 3M --node 0)" = 2 ] || fail "3M of 2M pages"
grep -q "not a multiple of the 2M page size" "$tmp/out" || fail "3M: message"
[ "$(run "$setup" --root "$R" --dry-run hugepages reserve lots)" = 2 ] || fail "size 'lots'"
[ "$(run "$setup" --root "$R" --dry-run --pagesize 4M hugepages reserve 8M)" = 2 ] || fail "--pagesize 4M"
if [ -f "$node0" ]; then
  [ "$(run "$setup" --root "$R" --dry-run hugepages reserve 4M --node 99)" = 2 ] || fail "--node 99"
  grep -q "no NUMA node 99" "$tmp/out" || fail "--node 99: message"
  before=$(cat "$node0")
  [ "$(run "$setup" --root "$R" --dry-run --group root hugepages reserve 4M --node 0)" = 0 ] || fail "--dry-run hugepages reserve"
  grep -q "would run: dpdk-hugepages.py --pagesize 2M --node 0 --reserve 4M" "$tmp/out" || fail "dry run: the dpdk-hugepages command"
  grep -q "would write $R/etc/dpdk/dpdk.conf:" "$tmp/out" && grep -q '^    NR_2M_PAGES=".*2.*"$' "$tmp/out" \
    || fail "dry run: the dpdk.conf block"
  mountpoint -q /dev/hugepages && { grep -q "would run: chgrp root /dev/hugepages" "$tmp/out" || fail "dry run: the mount's group"; }
  [ "$(cat "$node0")" = "$before" ] || fail "the dry run changed nr_hugepages"
  [ ! -e "$R/etc/dpdk/dpdk.conf" ] || fail "the dry run wrote dpdk.conf"
  echo "ok    hugepages: refusals (3M, lots, 4M pages, node 99); --dry-run shows dpdk-hugepages.py, the dpdk.conf block and the mount's group, changes nothing"
fi

if [ $is_root = 1 ] && [ -w "$node0" ] && command -v dpdk-hugepages.py >/dev/null; then
  hp_file=$node0 hp_before=$(cat "$node0")
  [ -f /etc/dpdk/dpdk.conf ] && cp /etc/dpdk/dpdk.conf "$R/etc/dpdk/dpdk.conf"
  cp "$R/etc/dpdk/dpdk.conf" "$tmp/dpdk.conf.orig" 2>/dev/null || : >"$tmp/dpdk.conf.orig"
  want=$((hp_before + 2))
  # a group that does not exist: the real mount keeps its owner and mode
  rc=$(run "$setup" --root "$R" --group kvfunit-nogroup hugepages reserve "$((want * 2))M" --node 0)
  if [ "$rc" != 0 ] && grep -q "Unable to set pages" "$tmp/out"; then
    echo "skip  a real reservation: the kernel could not find 2 more free 2 MiB pages"
  else
    [ "$rc" = 0 ] || fail "hugepages reserve $((want * 2))M --node 0"
    [ "$(cat "$node0")" = "$want" ] || fail "node 0 has $(cat "$node0") pages, not $want"
    grep -q "^after:" "$tmp/out" || fail "no after status"
    blk=$(sed -n '/^# kvferry-setup begin/,/^# kvferry-setup end/p' "$R/etc/dpdk/dpdk.conf")
    nodes=$(ls -d /sys/devices/system/node/node[0-9]* | wc -l)
    exp="$want"; [ "$nodes" -gt 1 ] && exp="$want$(printf ' 0%.0s' $(seq 2 "$nodes"))"
    grep -qx "NR_2M_PAGES=\"$exp\"" <<<"$blk" || fail "dpdk.conf block: $blk"
    # as dpdk-init reads it: sourced, the last assignment wins
    v=$(sh -c ". '$R/etc/dpdk/dpdk.conf'; echo \"\$NR_2M_PAGES\"")
    [ "$v" = "$exp" ] || fail "dpdk-init would read NR_2M_PAGES='$v'"
    [ "$(run "$setup" --root "$R" --group kvfunit-nogroup hugepages release)" = 0 ] || fail "hugepages release"
    [ "$(cat "$node0")" = "$hp_before" ] || fail "release left node 0 at $(cat "$node0") pages, not $hp_before"
    cmp -s "$R/etc/dpdk/dpdk.conf" "$tmp/dpdk.conf.orig" || fail "release did not restore dpdk.conf"
    [ ! -e "$R/run/kvferry-setup/hugepages" ] || fail "release left its record"
    [ "$(run "$setup" --root "$R" hugepages release)" = 0 ] || fail "a second release"
    grep -q "no record of the counts" "$tmp/out" || fail "a release without a record does not say so"
    [ "$(cat "$node0")" = "$hp_before" ] || fail "a release without a record changed the count"
    echo "ok    hugepages reserve: node 0 at $want pages through dpdk-hugepages.py, NR_2M_PAGES=\"$exp\" in dpdk.conf; release: back to $hp_before, dpdk.conf as it was"
  fi
else
  echo "skip  a real reservation (needs root, a writable $node0 and dpdk-hugepages.py)"
fi

"$setup" --root "$R" status >"$tmp/out" 2>&1 || fail "status"
grep -q "^hugepages" "$tmp/out" && grep -q "^persisted by kvferry-setup" "$tmp/out" || fail "status sections"
echo "ok    status lists devices, hugepages and what was persisted"
