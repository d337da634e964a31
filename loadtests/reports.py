"""A benchmark's report: printed, and written to --out when given (its folder made)."""

from __future__ import annotations

from pathlib import Path


def emit(report: str, out: Path | None) -> None:
    print(report)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(report)
