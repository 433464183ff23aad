#!/usr/bin/env bash
# Every program answers --version with "NAME VERSION" on stdout and exit 0,
# before it looks at any other option, a config file or the machine.
#   versions.sh VERSION PROGRAM...
set -u
want=$1; shift
bad=0
for p in "$@"; do
  name=$(basename "$p")
  out=$(env -u KVFERRY_CONFIG "$p" --version </dev/null 2>&1); rc=$?
  if [ $rc -ne 0 ] || [ "$out" != "$name $want" ]; then
    echo "FAIL: $name --version exited $rc and printed '$out' (want '$name $want')"
    bad=1
  else
    echo "ok    $out"
  fi
done
exit $bad
