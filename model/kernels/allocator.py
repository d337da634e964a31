"""Keep freed host memory in the process, so decoding does not fault fresh pages in at every step.

glibc's malloc serves blocks over 32 MB (its largest mmap threshold) with a fresh mmap and unmaps
them on free; smaller ones come from the heap, whose free top it hands back past M_TRIM_THRESHOLD.
A decoder step allocates the same large tensors every time (logits: rows x vocabulary floats, 60 MB
for 256 beams of a 58k-word model), so each step paid for tens of thousands of page faults and the
kernel zeroing those pages: on this repo's OPUS-MT-base-sized benchmark model, 1.1M minor faults
and 3 s of system time per 64 sentences. With mmap off and trimming off, freed blocks are reused
instead. The cost is memory: the process keeps its peak heap (as the CUDA caching allocator does on
the GPU), and aligned large blocks fragment it somewhat (the base model decoding batches of 64 holds
1.45 GB resident instead of 0.89 GB, steady after the first batch).

Translator.load applies it for CPU inference; BEAMSERVE_RETAIN_FREED_MEMORY=0 leaves malloc as is.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
M_MMAP_MAX = -4
ENV = "BEAMSERVE_RETAIN_FREED_MEMORY"


def retain_freed_memory() -> bool:
    """Tell glibc malloc to keep freed memory for reuse; False where it cannot (not glibc, or turned off)."""
    if os.environ.get(ENV, "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's C library
    except (OSError, AttributeError):  # musl and others have no mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success. -1 turns trimming off entirely; a max of 0 mmaps puts every block on the heap.
    return bool(mallopt(M_TRIM_THRESHOLD, -1)) and bool(mallopt(M_MMAP_MAX, 0))
