"""The model replicas' allocator choice (service/engine/allocator.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.engine import allocator


def test_system_sets_nothing() -> None:
    assert allocator.replica_env("system") == {}


def test_auto_preloads_jemalloc_where_the_host_has_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lib = tmp_path / "libjemalloc.so.2"
    monkeypatch.setattr(allocator, "JEMALLOC_PATHS", (str(tmp_path / "missing.so"), str(lib)))
    assert allocator.replica_env("auto") == {}  # not there: the C library's malloc, no error
    with pytest.raises(ValueError, match="apt install libjemalloc2"):
        allocator.replica_env("jemalloc")  # asked for by name: say what is missing
    lib.write_bytes(b"")
    assert allocator.replica_env("auto") == allocator.replica_env("jemalloc") == {"LD_PRELOAD": str(lib)}


def test_this_process_reports_its_allocator_and_memory() -> None:
    assert allocator.in_use() == "system"  # pytest runs without LD_PRELOAD
    assert allocator.resident_bytes() > 10 * 2**20
