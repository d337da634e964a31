"""The memory allocator of the model replicas: jemalloc where the host has it; and the C library's
freed heap given back after a gateway's large transient work (`released`).

A replica allocates tensors of ever-changing sizes (rows x positions of each decoder step, encoder
outputs of each admission). Under glibc's malloc its resident memory keeps creeping from that
fragmentation; under jemalloc it levels off lower (docs/benchmarks.md "Memory"). The library is
preloaded into the replica processes only (Ray's runtime_env sets LD_PRELOAD before the worker
starts), so nothing else of the host changes.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, ParamSpec, TypeVar

if TYPE_CHECKING:
    from service.settings import Allocator

P = ParamSpec("P")
T = TypeVar("T")

# Where Debian, Ubuntu, Fedora and Alpine put it (the libjemalloc2 package and its equivalents).
JEMALLOC_PATHS = (
    "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
    "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2",
    "/usr/lib64/libjemalloc.so.2",
    "/usr/lib/libjemalloc.so.2",
)


def jemalloc_path() -> str | None:
    return next((p for p in JEMALLOC_PATHS if Path(p).is_file()), None)


def replica_env(allocator: Allocator) -> dict[str, str]:
    """Environment variables for a model replica's process; ValueError if jemalloc is asked for and absent."""
    if allocator == "system":
        return {}
    path = jemalloc_path()
    if path is None:
        if allocator == "jemalloc":
            raise ValueError(
                f"allocator jemalloc: no libjemalloc.so.2 in {', '.join(JEMALLOC_PATHS)} "
                "(apt install libjemalloc2), or set BEAMSERVE_ALLOCATOR=system"
            )
        return {}
    return {"LD_PRELOAD": path}


@functools.cache
def in_use() -> str:
    """The allocator of this process: jemalloc when it is mapped, else the C library's. Read once: a
    process keeps its allocator, and /proc/self/maps of a process holding torch takes milliseconds."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return "unknown"
    return "jemalloc" if "libjemalloc" in maps else "system"


def resident_bytes() -> int:
    """This process's resident memory (0 where /proc is missing)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def released(work: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """work(*args, **kwargs), then the C library's freed heap given back to the system (glibc's
    malloc_trim). A document's XML trees take tens of megabytes for a moment in whichever executor
    thread parsed it, and glibc keeps those pages in that thread's arena: without this a gateway's
    resident memory climbs by each large document it reads (docs/benchmarks.md "Memory")."""
    try:
        return work(*args, **kwargs)
    finally:
        trimmed()


def trimmed() -> None:
    """The C library's freed heap given back to the system now (a memory's index dropped, its strings freed)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim; None where the C library has none (musl, macOS)."""
    try:
        found: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    return found
