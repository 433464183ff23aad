#!/usr/bin/env python3
"""KN_CUDA_ENV_KNOBS (kernels/include/kn_stage.h) names exactly the KVFERRY_CUDA_
variables the CUDA engine reads (every "KVFERRY_CUDA_..." literal in
kernels/cuda): a knob added there and not to the list would be refused by
ctrld, which passes the list through; a name left in the list after its knob
went would let a misspelling through.
  cuda_knobs.py SOURCE_ROOT"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1])
header = (root / "kernels/include/kn_stage.h").read_text()
m = re.search(r"#define KN_CUDA_ENV_KNOBS((?:[^\n]*\\\n)*[^\n]*)", header)
if not m:
    sys.exit("FAIL: no KN_CUDA_ENV_KNOBS in kernels/include/kn_stage.h")
listed = re.findall(r'"(KVFERRY_CUDA_[A-Z0-9_]+)"', m.group(1))
read = set()
for f in sorted((root / "kernels/cuda").rglob("*")):
    if f.suffix in (".cu", ".cuh", ".c", ".h"):
        # the names the engine looks up (getenv and its own env_* readers),
        # not the ones its messages quote (a "KVFERRY_CUDA_TP=host" in a reason)
        read |= set(re.findall(r'"(KVFERRY_CUDA_[A-Z0-9_]+)"', f.read_text()))
dups = sorted({k for k in listed if listed.count(k) > 1})
missing, stale = sorted(read - set(listed)), sorted(set(listed) - read)
for k in missing:
    print(f"FAIL: the CUDA engine reads {k}, which KN_CUDA_ENV_KNOBS does not name (ctrld would refuse it)")
for k in stale:
    print(f"FAIL: KN_CUDA_ENV_KNOBS names {k}, which no file of kernels/cuda reads")
for k in dups:
    print(f"FAIL: KN_CUDA_ENV_KNOBS names {k} twice")
if missing or stale or dups:
    sys.exit(1)
print(f"PASS: KN_CUDA_ENV_KNOBS names the {len(read)} variables the CUDA engine reads")
