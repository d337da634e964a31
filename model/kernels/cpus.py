"""The CPUs this process may run on."""

from __future__ import annotations

import os


def usable_cpus() -> int:
    """The CPUs of this process's affinity mask where the OS has one (Linux, a container's cpuset
    included), else every CPU the machine has (macOS, Windows)."""
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is not None:
        return len(affinity(0))
    return os.cpu_count() or 1
