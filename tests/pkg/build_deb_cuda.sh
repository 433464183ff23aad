#!/usr/bin/env bash
# The package kvferry-cuda: `scripts/build-deb --cuda` (the build profile
# pkg.kvferry.cuda) on a machine with NVIDIA's CUDA 13 toolkit. Without
# installing anything here:
#  - lintian --pedantic on both .debs: no error, no warning;
#  - kvferry-cuda holds the module where the loader looks, exporting one
#    symbol, and the worker's CUDA drop-in; Depends names kvferry of the
#    same version and NVIDIA's cuda-cudart-13-0 and libcublas-13-0;
#  - kvferry from the same build still links nothing of CUDA;
#  - the packaged programs, unpacked, load the packaged module for backend =
#    cuda (this machine has no GPU: the engine answers "no CUDA device",
#    which only the loaded module can say), and without it name the
#    package to install.
#   build_deb_cuda.sh SOURCE_ROOT
# Exit 77 without the packaging tools or NVIDIA's toolkit.
set -uo pipefail
root=$1
for t in dpkg-buildpackage dh lintian; do
  command -v "$t" >/dev/null || { echo "SKIP: $t not found (scripts/install-deps installs it)"; exit 77; }
done
[ -x /usr/local/cuda/bin/nvcc ] || { echo "SKIP: no NVIDIA CUDA toolkit in /usr/local/cuda"; exit 77; }
dpkg-checkbuilddeps "$root/pkg/debian/control" 2>/dev/null \
  || { echo "SKIP: build dependencies of pkg/debian/control missing (scripts/install-deps)"; exit 77; }
tmp=$(mktemp -d /tmp/kvf-debcuda-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

DEB_BUILD_OPTIONS="nocheck parallel=$(nproc)" "$root/scripts/build-deb" --cuda "$tmp/out" >"$tmp/build-deb.out" 2>&1 \
  || { tail -n 30 "$tmp/build-deb.out"; fail "scripts/build-deb --cuda failed"; }
deb=$(grep '/kvferry_[^/]*\.deb$' "$tmp/build-deb.out" | tail -1)
cdeb=$(grep '/kvferry-cuda_[^/]*\.deb$' "$tmp/build-deb.out" | tail -1)
[ -f "$deb" ] && [ -f "$cdeb" ] || fail "no kvferry and kvferry-cuda .debs: $(cat "$tmp/build-deb.out")"
echo "ok    dpkg-buildpackage -b -Ppkg.kvferry.cuda built $(basename "$deb") and $(basename "$cdeb")"

lintian --pedantic --display-info "$deb" "$cdeb" >"$tmp/lintian.out" 2>&1
grep -v '^running with root privileges' "$tmp/lintian.out" | sed 's/^/      /'
grep -qE '^[EW]: ' "$tmp/lintian.out" && fail "lintian --pedantic reports errors or warnings"
echo "ok    lintian --pedantic: no error, no warning"

ver=$(dpkg-deb -f "$deb" Version)
dep=$(dpkg-deb -f "$cdeb" Depends)
for d in "kvferry (= $ver)" cuda-cudart-13-0 libcublas-13-0; do
  grep -qF "$d" <<<"$dep" || fail "kvferry-cuda's Depends lacks $d: $dep"
done
grep -qiE 'cuda|cublas' <<<"$(dpkg-deb -f "$deb" Depends)" && fail "kvferry depends on CUDA: $(dpkg-deb -f "$deb" Depends)"
echo "ok    kvferry-cuda Depends: $dep"

dpkg-deb -x "$deb" "$tmp/root" && dpkg-deb -x "$cdeb" "$tmp/root" || fail "dpkg-deb -x"
mod=$tmp/root/usr/lib/x86_64-linux-gnu/kvferry/kvferry-cuda.so
[ -f "$mod" ] || fail "kvferry-cuda has no usr/lib/x86_64-linux-gnu/kvferry/kvferry-cuda.so"
[ -f "$tmp/root/lib/systemd/system/kvferry-worker@.service.d/cuda.conf" ] || fail "kvferry-cuda has no worker drop-in"
exports=$(nm -D --defined-only "$mod" | awk '{ print $3 }')
[ "$exports" = kn_cuda_module_v1 ] || fail "the module exports more than its table: $exports"
for b in "$tmp"/root/usr/bin/*; do
  readelf -d "$b" 2>/dev/null | grep -qE 'libcu(da|blas)' && fail "$(basename "$b") links CUDA"
done
echo "ok    the module exports one symbol; no program of kvferry links CUDA"

"$root/build/kvferry-mkmodel" --out "$tmp/model" --preset tiny >/dev/null 2>&1 \
  || "$tmp/root/usr/bin/kvferry-mkmodel" --out "$tmp/model" --preset tiny >/dev/null || fail "kvferry-mkmodel"
gen() { "$tmp/root/usr/bin/kvferry-generate" --model "$tmp/model" --prompt hi --max-tokens 2 --backend cuda "$@" 2>&1; }
out=$(gen)
grep -q "not installed: no kvferry-cuda.so .*/usr/lib/x86_64-linux-gnu/kvferry (install the kvferry-cuda package" <<<"$out" \
  || fail "without the module installed, kvferry-generate does not name the package: $out"
cp "$mod" "$tmp/root/usr/bin/"
out=$(gen)
if [ -e /dev/nvidia0 ]; then
  grep -q "no CUDA device\|not installed\|dlopen" <<<"$out" && fail "the packaged module did not run on this GPU: $out"
else
  grep -q "no CUDA device" <<<"$out" || fail "the packaged programs did not load the packaged module: $out"
fi
echo "ok    the packaged programs load the packaged module for backend = cuda, and name the package without it"
