#!/usr/bin/env bash
# Builds the .deb with scripts/build-deb and checks what it would install,
# without installing it: dpkg-deb -I/-c, then dpkg-deb -x into a temp dir
# where the packaged daemon must accept the packaged config file.
#   build_deb.sh SOURCE_ROOT BUILD_DIR
set -uo pipefail
root=$1 build=$2
command -v dpkg-deb >/dev/null || { echo "dpkg-deb not found: skipping"; exit 77; }
tmp=$(mktemp -d /tmp/kvf-deb-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

deb=$("$root/scripts/build-deb" "$build" "$tmp" 2>/dev/null | tail -1)
[ -f "$deb" ] || fail "scripts/build-deb produced no .deb"
info=$(dpkg-deb -I "$deb")
grep -q "^ Package: kvferry$" <<<"$info" || fail "control has no Package: kvferry"
grep -q "^ Version: " <<<"$info" || fail "control has no Version"
[ "$(dpkg-deb -f "$deb" Package)" = kvferry ] || fail "dpkg-deb -f Package"
dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles | grep -x /etc/kvferry/kvferry.conf >/dev/null \
  || fail "/etc/kvferry/kvferry.conf is not a conffile"
dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./postinst | grep "adduser --system" >/dev/null \
  || fail "postinst does not create the kvferry system user"
list=$(dpkg-deb -c "$deb")
for p in ./usr/bin/kvferry-ctrld ./usr/bin/ctrlctl ./etc/kvferry/kvferry.conf \
         ./lib/systemd/system/kvferry-ctrld.service ./lib/systemd/system/kvferry-dataplane.service \
         ./lib/systemd/system/kvferry-worker@.service ./usr/lib/tmpfiles.d/kvferry.conf; do
  grep -q " $p\$" <<<"$list" || fail "$p is not in the package"
done
echo "$list" | awk '$1 ~ /^d/ && $1 != "drwxr-xr-x" { bad = 1; print "bad mode:", $0 } END { exit bad }' \
  || fail "a directory is not 0755"
echo "ok    the package holds the binaries, units, tmpfiles.d and a conffile"

dpkg-deb -x "$deb" "$tmp/root" || fail "dpkg-deb -x"
grep -q "^Type=notify" "$tmp/root/lib/systemd/system/kvferry-ctrld.service" || fail "kvferry-ctrld.service is not Type=notify"
for u in kvferry-ctrld kvferry-dataplane kvferry-worker@; do
  # a configuration error (exit 2) is not retried every 2 s forever; the daemons read kvferry.conf
  grep -q "^RestartPreventExitStatus=2" "$tmp/root/lib/systemd/system/$u.service" || fail "$u.service restarts on a config error"
  grep -q "^ExecStart=.*--config /etc/kvferry/kvferry.conf" "$tmp/root/lib/systemd/system/$u.service" \
    || fail "$u.service does not read /etc/kvferry/kvferry.conf"
done
# only ctrld's unit owns /run/kvferry: a root dataplane start must not chown it away from ctrlctl's group
! grep -q "^RuntimeDirectory=" "$tmp/root/lib/systemd/system/kvferry-dataplane.service" \
  || fail "kvferry-dataplane.service takes /run/kvferry (RuntimeDirectory)"
grep -q "^d /run/kvferry 0750 kvferry kvferry" "$tmp/root/usr/lib/tmpfiles.d/kvferry.conf" || fail "tmpfiles.d does not create /run/kvferry"
conf=$tmp/root/etc/kvferry/kvferry.conf
# Every key is there, commented, with its default: uncommented it must still parse.
for k in listen_address port model_dir served_model_name stages backend threads kv_blocks kv_memory \
         max_slots mb_k step_budget groups max_tokens_default max_context request_body_limit admin_socket \
         spec_depth spec_c_full spec_c_half replicas node_id peers drain_timeout; do
  grep -q "^#$k = " "$conf" || fail "key $k is missing from the packaged kvferry.conf"
done
# --check opens the model directory too: a tiny model stands in for /var/lib/kvferry/model
"$build/kvferry-mkmodel" --out "$tmp/model" --preset tiny >/dev/null || fail "kvferry-mkmodel"
"$tmp/root/usr/bin/kvferry-ctrld" --check --config "$conf" --model-dir "$tmp/model" >/dev/null \
  || fail "the packaged daemon rejects the packaged config"
"$tmp/root/usr/bin/kvferry-ctrld" --check --config "$conf" --model-dir "$tmp/no-such-model" >"$tmp/nomodel.log" 2>&1 \
  && fail "--check passes for a model directory that does not exist"
grep -q "no-such-model" "$tmp/nomodel.log" || fail "--check does not name the missing model directory"
sed 's/^#\([a-z_]* = \)/\1/' "$conf" > "$tmp/uncommented.conf"
"$tmp/root/usr/bin/kvferry-ctrld" --check --config "$tmp/uncommented.conf" --model-dir "$tmp/model" >/dev/null \
  || fail "the packaged config with every default uncommented is rejected"
if [ -x "$tmp/root/usr/bin/kvferry-worker" ]; then
  grep -q "^\[worker\]" "$conf" || fail "the packaged kvferry.conf has no [worker] section"
  for c in "$conf" "$tmp/uncommented.conf"; do
    env -u KVFERRY_CONFIG "$tmp/root/usr/bin/kvferry-worker" --check --config "$c" --region r --model m --in ring:a \
      --out ring:b >/dev/null || fail "the packaged worker rejects $c"
  done
fi
if [ -x "$tmp/root/usr/bin/kvferry-dataplane" ]; then
  grep -q "^\[dp\]" "$conf" || fail "the packaged kvferry.conf has no [dp] section"
  for c in "$conf" "$tmp/uncommented.conf"; do
    env -u KVFERRY_CONFIG "$tmp/root/usr/bin/kvferry-dataplane" --check --config "$c" --port net_null0 --region r \
      >/dev/null || fail "the packaged dataplane rejects $c"
  done
fi
echo "ok    the packaged config lists every key and the packaged daemons accept it"
