"""A benchmark's report: printed, and written to --out when given (its folder made), stamped with
what produced it: the commit (and whether the tree had uncommitted changes), the CPU and its usable
cores, the GPUs where there are any, and the command that ran it."""

from __future__ import annotations

import contextlib
import io
import os
import platform
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO

REPO = Path(__file__).resolve().parents[1]


def emit(report: str, out: Path | None, stamp: str | None = None) -> None:
    """Print the report and write it to `out`, with its provenance line after the title (first where
    it has no "# " title) where the report has none: `stamp` where given (a report rewritten from an
    earlier run's data keeps that run's), else this process's."""
    if "\nCommit: " not in report and not report.startswith("Commit: "):
        stamp = stamp or provenance()
        title, _, rest = report.partition("\n")
        report = f"{title}\n\n{stamp}\n{rest}" if title.startswith("#") else f"{stamp}\n\n{report}"
    print(report)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(report if report.endswith("\n") else report + "\n", encoding="utf-8")


def provenance() -> str:
    gpus = gpu_names()
    return f"Commit: {commit()}. CPU: {cpu_name()}." + (f" GPU: {gpus}." if gpus else "") + f" Command: `{command()}`."


# Settings that make a CPU compute as a lesser one (docs/benchmarks.md, "The AVX2 build"): a report names them
ISA_SETTINGS = (
    "BEAMSERVE_NATIVE_KERNELS", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "CT2_FORCE_CPU_ISA",
    "MKL_ENABLE_INSTRUCTIONS",
)  # fmt: skip


def command() -> str:
    """The command line that ran this benchmark, its script relative to the repository, after the ISA settings
    in force."""
    script = Path(sys.argv[0]).resolve()
    name = str(script.relative_to(REPO)) if script.is_relative_to(REPO) else sys.argv[0]
    settings = [f"{key}={os.environ[key]}" for key in ISA_SETTINGS if key in os.environ]
    return shlex.join([*settings, "python", name, *sys.argv[1:]])


def commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
        # Reports under loadtests/results are the benchmarks' own output (a script of several writes one while the
        # next measures): changes there are not changes to the code measured.
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!loadtests/results"],
            cwd=REPO,
            capture_output=True,
        )
        return out.stdout.strip() + (" (uncommitted changes)" if dirty.stdout.strip() else "")
    except OSError:
        return "unknown"


def cpu_name() -> str:
    from model.kernels.cpus import usable_cpus

    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    found = next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), [])
    flags = [f for f in ISA_FLAGS if f in found]
    name = names[0] if names else platform.processor() or platform.machine()
    return f"{name}, {usable_cpus()} cores" + (f" ({' '.join(flags)})" if flags else "")


# The instruction sets the kernels choose by (model/kernels/int8_choice.py, native.py's builds), as Linux names them.
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8", "amx_bf16")


def gpu_names() -> str:
    """The NVIDIA GPUs nvidia-smi lists, or "" (no driver, no GPU)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ""
    try:
        out = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
    except OSError:
        return ""
    return ", ".join(line.strip() for line in out.stdout.splitlines() if line.strip())


@contextlib.contextmanager
def recorded(title: str, out: Path | None) -> Iterator[None]:
    """What the block prints, printed as it goes and, with `out`, written there afterwards as a report: `title`,
    then the output as a code block (a suite's run: its counts and checks as they were printed)."""
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(_Tee(sys.stdout, printed)):
            yield
    finally:
        if out is not None:
            emit(f"{title}\n\n```\n{printed.getvalue()}```\n", out)


class _Tee(io.TextIOBase):
    def __init__(self, *streams: IO[str]) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for s in self.streams:
            s.write(text)
        return len(text)

    def flush(self) -> None:
        for s in self.streams:
            s.flush()
