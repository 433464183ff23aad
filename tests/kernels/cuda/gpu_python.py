# SPDX-License-Identifier: Apache-2.0
"""Shared guard of the GPU-machine Python checks: exit 77 (skipped) when a
module they need is missing or torch sees no CUDA device."""
import importlib
import sys


def require(*modules):
    """Import each of `modules` or exit 77 naming the one that is missing;
    then exit 77 unless torch has a CUDA device."""
    for m in modules:
        try:
            importlib.import_module(m)
        except ImportError as e:
            print(f"SKIP: {e}")
            sys.exit(77)
    import torch
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device for torch")
        sys.exit(77)
