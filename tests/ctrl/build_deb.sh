#!/usr/bin/env bash
# The Debian package, built the way a release is: scripts/build-deb runs
# `dpkg-buildpackage -b` on the source package in pkg/debian (a scratch copy
# of the tree with debian -> pkg/debian). Then, without installing anything
# on this machine:
#  - lintian --pedantic on the .debs: no error, no warning;
#  - Depends comes from ${shlibs:Depends} (libhugetlbfs0, libisal2,
#    librte-*, ...) and names nothing of CUDA; no binary has a RUNPATH; the
#    build used the distribution's baseline, not -march=native;
#  - a man page for every program and kvferry.conf(5), each listing exactly
#    the options the program's --help lists;
#  - systemd-analyze verify accepts the units (their man: links resolve);
#    kvferry.target holds the node's units, none root, ctrld and the
#    workers within exposure 5 (systemd-analyze security);
#  - maintainer scripts: debhelper's systemd handling, purge keeps models;
#  - the packaged daemons accept the packaged configuration.
#   build_deb.sh SOURCE_ROOT BUILD_DIR
# Exit 77 when the packaging tools or build dependencies are missing.
set -uo pipefail
root=$1
for t in dpkg-buildpackage dh lintian scdoc man systemd-analyze; do
  command -v "$t" >/dev/null || { echo "SKIP: $t not found (scripts/install-deps installs it)"; exit 77; }
done
dpkg-checkbuilddeps "$root/pkg/debian/control" 2>/dev/null \
  || { echo "SKIP: build dependencies of pkg/debian/control missing (scripts/install-deps)"; exit 77; }
tmp=$(mktemp -d /tmp/kvf-deb-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# nocheck: this suite runs the unit tests itself
DEB_BUILD_OPTIONS="nocheck parallel=$(nproc)" "$root/scripts/build-deb" "$tmp/out" >"$tmp/build-deb.out" 2>&1 \
  || { tail -n 30 "$tmp/build-deb.out"; fail "scripts/build-deb (dpkg-buildpackage -b) failed"; }
deb=$(grep '/kvferry_[^/]*\.deb$' "$tmp/build-deb.out" | tail -1)
[ -f "$deb" ] || fail "scripts/build-deb produced no kvferry .deb"
debs=$(grep '\.deb$' "$tmp/build-deb.out")
log=$tmp/out/kvferry-build.log
ver=$(sed -n "s/^  version: '\([^']*\)',$/\1/p" "$root/meson.build")
[ "$(dpkg-deb -f "$deb" Version)" = "$ver" ] || fail "package version $(dpkg-deb -f "$deb" Version) is not meson's $ver (pkg/debian/changelog)"
echo "ok    dpkg-buildpackage -b built $(echo "$debs" | xargs -n1 basename | tr '\n' ' ')"

# lintian as root warns about running as root; that line is not about the package
# shellcheck disable=SC2086
lintian --pedantic --display-info $debs >"$tmp/lintian.out" 2>&1
grep -v '^running with root privileges' "$tmp/lintian.out" | sed 's/^/      /'
grep -qE '^[EW]: ' "$tmp/lintian.out" && fail "lintian --pedantic reports errors or warnings"
echo "ok    lintian --pedantic: no error, no warning ($(grep -cE '^[PI]: ' "$tmp/lintian.out") info/pedantic notes)"

dep=$(dpkg-deb -f "$deb" Depends)
# ... and the DPDK drivers the dataplane dlopen()s, which shlibs cannot see
for d in libhugetlbfs0 libisal2 librte-eal librte-ethdev librte-ring libjansson4 libmicrohttpd12 libsystemd0 adduser \
         librte-mempool-ring librte-net-memif librte-net-af-packet; do
  grep -q "\b$d" <<<"$dep" || fail "Depends lacks $d: $dep"
done
grep -qiE 'cuda|cublas' <<<"$dep" && fail "kvferry depends on CUDA ($dep): it must install on a node without a GPU"
grep -q -- '-march=native' "$log" && fail "the package was compiled with -march=native (meson -Dnative=false)"
grep -q 'native *: *false' "$log" || fail "the build log does not show meson's native: false"
dpkg-deb -x "$deb" "$tmp/root" || fail "dpkg-deb -x"
for b in "$tmp"/root/usr/bin/* "$tmp"/root/usr/sbin/*; do
  readelf -d "$b" 2>/dev/null | grep -qE 'RUNPATH|RPATH' && fail "$(basename "$b") has a RUNPATH: $(readelf -d "$b" | grep PATH)"
  readelf -d "$b" 2>/dev/null | grep -qE 'libcu(da|blas)' && fail "$(basename "$b") links CUDA"
done
echo "ok    Depends from shlibs: $dep"

# Every program has a man page, listing each option its --help lists; each
# option a page defines (an entry's first line, "--flag ...") is one the
# program accepts. kvferry.conf(5) lists every key of every daemon.
bin=$tmp/root/usr/bin man=$tmp/root/usr/share/man
render() { MANWIDTH=400 man --nh --nj -l "$1" 2>/dev/null; }
flags() { grep -oE -- '--[a-z][a-z0-9-]*[a-z0-9]' | sort -u; }
for b in "$bin"/* "$tmp"/root/usr/sbin/*; do
  p=$(basename "$b")
  page=$(ls "$man"/man[18]/"$p".[18].gz 2>/dev/null | head -1)
  [ -n "$page" ] || fail "$p has no man page"
  text=$(render "$page")
  help=$(env -u KVFERRY_CONFIG "$b" --help 2>&1)
  for f in $(flags <<<"$help"); do
    grep -qE -- "^ {7}(.*, )?$f( |,|$)" <<<"$text" || fail "$(basename "$page"): $f of $p --help is not an option there"
  done
  for f in $(grep -E '^ {7}--' <<<"$text" | flags); do
    [ "$f" = --help ] || [ "$f" = --version ] || grep -q -- "$f\b" <<<"$help" \
      || grep -q -- "--${f#--no-}\b" <<<"$help" || fail "$(basename "$page") defines $f, which $p --help does not list"
  done
done
[ -f "$man/man5/kvferry.conf.5.gz" ] || fail "kvferry.conf(5) is not in the package"
conf_page=$(render "$man/man5/kvferry.conf.5.gz")
for d in kvferry-ctrld kvferry-worker kvferry-dataplane; do
  for k in $("$bin/$d" --print-config | sed -n 's/^#\([a-z0-9_]*\) = .*/\1/p'); do
    grep -qE "^ {7}$k = " <<<"$conf_page" || fail "kvferry.conf(5) has no entry for $d's key $k"
  done
done
[ -x "$tmp/root/usr/sbin/kvferry-setup" ] || fail "kvferry-setup is not in /usr/sbin"
progs=("$bin"/* "$tmp"/root/usr/sbin/*)
echo "ok    a man page for each of ${#progs[@]} programs and kvferry.conf(5), matching --help and --print-config"

# systemd-analyze verify, in a root holding the package and this machine's
# own units; man: links resolve against the package's pages only.
mkdir -p "$tmp/root/lib/systemd/system"
cp -an /lib/systemd/system/. "$tmp/root/lib/systemd/system/" 2>/dev/null
units=$(dpkg-deb -c "$deb" | grep -oE 'lib/systemd/system/[^/]+\.(service|target|socket|timer|path)$')
[ -n "$units" ] || fail "the package has no systemd units"
# shellcheck disable=SC2046
MANPATH=$man systemd-analyze --root="$tmp/root" verify $(sed "s|^|$tmp/root/|" <<<"$units") >"$tmp/verify.out" 2>&1 \
  || { cat "$tmp/verify.out"; fail "systemd-analyze verify rejects the packaged units"; }
[ -s "$tmp/verify.out" ] && { cat "$tmp/verify.out"; fail "systemd-analyze verify complains about the packaged units"; }
echo "ok    systemd-analyze verify: $(echo $units | xargs -n1 basename | tr '\n' ' ')"

# Maintainer scripts: the conffile, the system user, debhelper's unit
# handling (deb-systemd-helper / -invoke, try-restart after an upgrade), and
# a purge that leaves /var/lib/kvferry (the models) alone.
dpkg-deb -e "$deb" "$tmp/ctl" || fail "dpkg-deb -e"
grep -qx /etc/kvferry/kvferry.conf "$tmp/ctl/conffiles" || fail "/etc/kvferry/kvferry.conf is not a conffile"
grep -q "adduser --system" "$tmp/ctl/postinst" || fail "postinst does not create the kvferry system user"
grep -q "deb-systemd-helper" "$tmp/ctl/postinst" || fail "postinst lacks debhelper's deb-systemd-helper snippet"
grep -q "deb-systemd-invoke try-restart" "$tmp/ctl/postinst" || fail "postinst does not restart the daemons after an upgrade"
grep -q "deb-systemd-invoke stop" "$tmp/ctl/prerm" || fail "prerm does not stop the daemons on remove"
# the node's target is stopped on remove and restarted (with the workers, PartOf=) after an upgrade
grep -q "deb-systemd-invoke stop kvferry.target 'kvferry-worker@\*.service'" "$tmp/ctl/prerm" \
  || fail "prerm does not stop kvferry.target and the worker instances"
grep -A3 "try-restart" "$tmp/ctl/postinst" | grep -q "kvferry.target" || fail "postinst does not try-restart kvferry.target"
grep -q "kvferry-worker@\*.service" "$tmp/ctl/postrm" || fail "purge leaves the enabled worker instances' links"
grep -q "systemd-tmpfiles.*--create kvferry.conf" "$tmp/ctl/postinst" || fail "postinst does not create /run/kvferry (tmpfiles.d)"
code=$(grep -v '^[[:space:]]*#' "$tmp/ctl/postrm")
grep -q "/var/lib/kvferry" <<<"$code" && fail "postrm touches /var/lib/kvferry (the models)"
grep -q "deluser" <<<"$code" && fail "postrm removes the kvferry user, which owns the models"
echo "$(dpkg-deb -c "$deb")" | awk '$1 ~ /^d/ && $1 != "drwxr-xr-x" { bad = 1; print "bad mode:", $0 } END { exit bad }' \
  || fail "a directory is not 0755"
echo "ok    conffile, system user, deb-systemd-helper/-invoke, restart after upgrade, purge keeps /var/lib/kvferry"

r=$tmp/root
grep -q "^Type=notify" "$r/lib/systemd/system/kvferry-ctrld.service" || fail "kvferry-ctrld.service is not Type=notify"
[ -f "$r/lib/systemd/system/kvferry.target" ] || fail "no kvferry.target"
grep -q "^Wants=kvferry-ctrld.service" "$r/lib/systemd/system/kvferry.target" || fail "kvferry.target does not want ctrld"
for u in kvferry-ctrld kvferry-dataplane kvferry-worker@; do
  # a configuration error (exit 2) is not retried every 2 s forever; the daemons read kvferry.conf
  grep -q "^RestartPreventExitStatus=2" "$r/lib/systemd/system/$u.service" || fail "$u.service restarts on a config error"
  grep -q "^ExecStart=.*--config /etc/kvferry/kvferry.conf" "$r/lib/systemd/system/$u.service" \
    || fail "$u.service does not read /etc/kvferry/kvferry.conf"
  # one target brings up the node, and stops it
  grep -q "^WantedBy=kvferry.target" "$r/lib/systemd/system/$u.service" || fail "$u.service is not enabled into kvferry.target"
  grep -q "^PartOf=kvferry.target" "$r/lib/systemd/system/$u.service" || fail "$u.service is not PartOf=kvferry.target"
  # none is root: /run/kvferry keeps its owner, the regions are the group's
  grep -q "^User=kvferry" "$r/lib/systemd/system/$u.service" || fail "$u.service runs as root"
done
grep -q "^ExecStart=.* --instance %i" "$r/lib/systemd/system/kvferry-worker@.service" \
  || fail "kvferry-worker@.service does not read its instance's [worker.%i]"
# only ctrld's unit owns /run/kvferry: another unit's RuntimeDirectory would reset its owner or mode
for u in kvferry-dataplane kvferry-worker@; do
  ! grep -q "^RuntimeDirectory=" "$r/lib/systemd/system/$u.service" \
    || fail "$u.service takes a RuntimeDirectory (only ctrld's unit owns /run/kvferry)"
done
# confined: systemd-analyze security rates ctrld and the workers at most 5 (tests/pkg pins each unit)
for u in kvferry-ctrld.service kvferry-worker@.service; do
  e=$(cd "$r/lib/systemd/system" && systemd-analyze security --offline=yes "$u" 2>/dev/null |
      sed -n 's/^→ Overall exposure level for [^:]*: \([0-9.]*\) .*/\1/p')
  [ -n "$e" ] || { echo "      (systemd-analyze security --offline is not available: exposure not checked)"; break; }
  awk -v e="$e" 'BEGIN { exit !(e <= 5) }' || fail "$u is exposed at $e (systemd-analyze security), above 5"
done
[ -f "$r/usr/share/doc/kvferry/examples/kvferry-worker@.service.d/cuda.conf" ] || fail "no CUDA drop-in in the examples"
grep -q "^d /run/kvferry 0750 kvferry kvferry" "$r/usr/lib/tmpfiles.d/kvferry.conf" || fail "tmpfiles.d does not create /run/kvferry"
conf=$r/etc/kvferry/kvferry.conf
# Every key is there, commented, with its default: uncommented it must still parse.
for k in listen_address port model_dir served_model_name stages backend threads kv_blocks kv_memory \
         max_slots mb_k step_budget groups max_tokens_default max_context request_body_limit admin_socket \
         spec_depth spec_c_full spec_c_half replicas node_id peers drain_timeout; do
  grep -q "^#$k = " "$conf" || fail "key $k is missing from the packaged kvferry.conf"
done
# --check opens the model directory too: a tiny model stands in for /var/lib/kvferry/model
"$bin/kvferry-mkmodel" --out "$tmp/model" --preset tiny >/dev/null || fail "the packaged kvferry-mkmodel"
"$bin/kvferry-ctrld" --check --config "$conf" --model-dir "$tmp/model" >/dev/null \
  || fail "the packaged daemon rejects the packaged config"
"$bin/kvferry-ctrld" --check --config "$conf" --model-dir "$tmp/no-such-model" >"$tmp/nomodel.log" 2>&1 \
  && fail "--check passes for a model directory that does not exist"
grep -q "no-such-model" "$tmp/nomodel.log" || fail "--check does not name the missing model directory"
sed 's/^#\([a-z_]* = \)/\1/' "$conf" > "$tmp/uncommented.conf"
"$bin/kvferry-ctrld" --check --config "$tmp/uncommented.conf" --model-dir "$tmp/model" >/dev/null \
  || fail "the packaged config with every default uncommented is rejected"
grep -q "^\[worker\]" "$conf" || fail "the packaged kvferry.conf has no [worker] section"
grep -q "^\[dp\]" "$conf" || fail "the packaged kvferry.conf has no [dp] section"
for c in "$conf" "$tmp/uncommented.conf"; do
  env -u KVFERRY_CONFIG "$bin/kvferry-worker" --check --config "$c" --region r --model m --in ring:a \
    --out ring:b >/dev/null || fail "the packaged worker rejects $c"
  env -u KVFERRY_CONFIG "$bin/kvferry-dataplane" --check --config "$c" --port net_null0 --region r \
    >/dev/null || fail "the packaged dataplane rejects $c"
done
# the CPU engine runs from the package on this machine (no GPU, no CUDA libraries)
out=$("$bin/kvferry-generate" --model "$tmp/model" --prompt "Hello" --max-tokens 4 2>&1) \
  || fail "the packaged kvferry-generate: $out"
grep -q "^ids:" <<<"$out" || fail "the packaged kvferry-generate printed no ids: $out"
echo "ok    kvferry.target and its units, tmpfiles.d, the packaged config and the packaged CPU engine"
