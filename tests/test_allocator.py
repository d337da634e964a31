"""model.allocator: with freed memory retained, re-allocating a large tensor faults no fresh pages in."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import resource, sys
import torch
from model.allocator import retain_freed_memory
if sys.argv[1] == "retain":
    assert retain_freed_memory()
faults = []
for _ in range(4):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x = torch.ones(64, 2**20)  # 256 MB, written (each fresh page faults once)
    del x
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(min(faults[1:]))
"""


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's (Linux)")
def test_retained_memory_is_reused_without_page_faults() -> None:
    pages = 64 * 2**20 * 4 // 4096
    assert _faults("default") > pages // 2  # glibc maps and unmaps a block this large every time
    assert _faults("retain") < pages // 100  # the freed block is reused


def test_it_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from model.allocator import ENV, retain_freed_memory

    monkeypatch.setenv(ENV, "0")
    assert not retain_freed_memory()
