#!/usr/bin/env bash
# kvferry-dataplane reads its options like every daemon: kvferry.conf's [dp]
# section (the other daemons' sections skipped), KVFERRY_DP_* variables and
# flags (--peer repeats); a bad value is refused at start (exit 2) naming the
# key, the value, where it came from and what is allowed.
#   dp_config.sh KVFERRY_DATAPLANE
set -u
dp=$1
tmp=$(mktemp -d /tmp/kvf-dpcfg-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; cat "$tmp/out" 2>/dev/null; exit 1; }
run() { env -u KVFERRY_CONFIG "$@" >"$tmp/out" 2>&1; echo $?; }

cat > "$tmp/kvferry.conf" <<'CONF'
[http]
port = 8000
[worker]
depth = 2
[dp]
node_id = 3
port = net_null0
region = kvf_test
ip = 10.9.0.3
peers = 1=10.9.0.1 2=02:00:00:00:00:02,10.9.0.2,47475
window = 2048
CONF
[ "$(run "$dp" --config "$tmp/kvferry.conf" --check)" = 0 ] || fail "--check on a good file"
[ "$(run "$dp" --config "$tmp/kvferry.conf" --peer 4=10.9.0.4 --check)" = 0 ] || fail "--peer on top of the file"
echo "ok    a [dp] section in a shared kvferry.conf configures the dataplane; the others' sections are skipped"

sed -i 's/^window = 2048/window = 3000/' "$tmp/kvferry.conf"
[ "$(run "$dp" --config "$tmp/kvferry.conf" --check)" = 2 ] || fail "window 3000 accepted"
grep -q "kvferry.conf:11: value '3000' for 'window' is not a power of two" "$tmp/out" || fail "window 3000: message"
sed -i 's/^window = 3000/window = 100000/' "$tmp/kvferry.conf"
[ "$(run "$dp" --config "$tmp/kvferry.conf" --check)" = 2 ] || fail "window 100000 accepted"
grep -q "value '100000' for 'window' is out of range 512..65536" "$tmp/out" || fail "window 100000: message"
sed -i 's/^window = 100000/window = 4096/' "$tmp/kvferry.conf"
[ "$(run "$dp" --config "$tmp/kvferry.conf" --peer 70=10.0.0.1 --check)" = 2 ] || fail "peer 70 accepted"
grep -q "\-\-peer: invalid value '70=10.0.0.1' for 'peers'" "$tmp/out" || fail "peer 70: message"
[ "$(run KVFERRY_DP_IP=10.0.0.300 "$dp" --config "$tmp/kvferry.conf" --check)" = 2 ] || fail "ip .300 accepted"
grep -q "KVFERRY_DP_IP: invalid value '10.0.0.300' for 'ip': expected an IPv4 address" "$tmp/out" || fail "ip: message"
[ "$(run "$dp" --config "$tmp/kvferry.conf" --node-id 64 --check)" = 2 ] || fail "node 64 accepted"
grep -q "value '64' for 'node_id' is out of range 0..63" "$tmp/out" || fail "node 64: message"
[ "$(run "$dp" --config "$tmp/kvferry.conf" --rx-small 0:10 --check)" = 2 ] || fail "rx-small 0:10 accepted"
[ "$(run "$dp" --config "$tmp/kvferry.conf" --framesize 100 --check)" = 2 ] || fail "--framesize accepted"
grep -q "unknown option '--framesize'" "$tmp/out" || fail "--framesize: message"
# found by tests/fuzz/fuzz_ini.c: a seed past 2^64 was converted (undefined), a NaN taken as a probability
for imp in loss=0.05,seed=18446744073709551616 seed=1e30 loss=nan; do
  [ "$(run "$dp" --config "$tmp/kvferry.conf" --impair "$imp" --check)" = 2 ] || fail "--impair $imp accepted"
  grep -q "invalid value '$imp' for 'impair'" "$tmp/out" || fail "--impair $imp: message"
done
[ "$(run "$dp" --config "$tmp/kvferry.conf" --impair loss=0.05,seed=18446744073709549568 --check)" = 0 ] \
  || fail "a seed below 2^64 refused"
[ "$(run KVFERRY_PORT=9 KVFERRY_WK_DEPTH=1 "$dp" --config "$tmp/kvferry.conf" --check)" = 0 ] \
  || fail "the other daemons' variables broke the dataplane"
# a zero-copy memif client, alone or received in place (its consumers map
# its packet memory), is a valid configuration
for v in no yes auto; do
  [ "$(run KVFERRY_DP_RX_IN_PLACE=$v "$dp" --config "$tmp/kvferry.conf" \
    --port net_memif0,role=client,socket=/tmp/kvf.sock,zero-copy=yes --check)" = 0 ] \
    || fail "a zero-copy memif client refused (rx_in_place = $v)"
done
# rx_in_place is auto, yes or no (auto the default): another word is refused naming them
[ "$(run "$dp" --config "$tmp/kvferry.conf" --rx-in-place sometimes --check)" = 2 ] || fail "rx_in_place sometimes accepted"
grep -q "sometimes" "$tmp/out" && grep -q "auto" "$tmp/out" || fail "rx_in_place sometimes: message"
"$dp" --print-config | grep -q "^#rx_in_place = auto" || fail "rx_in_place's default is not auto"
echo "ok    bad values from the file, variables and flags are refused at start, naming key, origin and what is allowed"

"$dp" --print-config | sed -e 's/^#\([a-z_]* = \)/\1/' > "$tmp/defaults.conf"
[ "$(run "$dp" --config "$tmp/defaults.conf" --port net_null0 --region r --check)" = 0 ] \
  || fail "the printed defaults do not parse back"
echo "ok    --print-config writes every key's default, and that file parses back"
