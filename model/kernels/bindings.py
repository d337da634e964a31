"""The C library's kernels bound by ctypes from their one declaration, csrc/beamserve.h: the header is parsed for
each kernel's result and argument types (a pointer, int64_t, int or float each), and the level of the build this
CPU runs (csrc/dispatch.c) is bound under the plain names. A kernel declared in the header and defined in a
source is bound here with nothing else written (docs/design.md, "Adding a C kernel").
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

ENV = "BEAMSERVE_NATIVE_KERNELS"
# x86-64-v3 as the psABI defines it (AVX2, FMA: AMD's Zen 2 and 3, Intel's Haswell to Skylake), and with AVX-VNNI
# beside it (Intel's cores since Alder Lake, its E-core Xeons): the packed int8 kernel multiplies with it where the
# CPU has it, unless the setting says x86-64-v3.
LEVELS = {"x86-64": 1, "x86-64-v2": 2, "x86-64-v3": 3, "x86-64-v3+avxvnni": 3, "x86-64-v4": 4, "x86-64-v4+amx": 4}
MODULE = "model.kernels._native"
HEADER = Path(__file__).with_name("csrc") / "beamserve.h"

# The C types a kernel's result and arguments may have, as ctypes holds them (None: void).
SCALARS: dict[str, Any] = {"void": None, "int64_t": ctypes.c_int64, "int": ctypes.c_int, "float": ctypes.c_float}
_PROTOTYPE = re.compile(r"^[ \t]*(void|int|int64_t)\s+(beamserve_\w+)\s*\(([^)]*)\)\s*;", re.MULTILINE)
_RENAMED = re.compile(r"^[ \t]*#define (beamserve_\w+) BEAMSERVE_LEVELED\((\w+)\)[ \t]*$", re.MULTILINE)


@dataclass(frozen=True)
class Signature:
    """A kernel's declaration: its result's and arguments' ctypes types (c_void_p for every pointer)."""

    name: str
    result: Any
    arguments: tuple[Any, ...]
    parameters: tuple[str, ...]  # the arguments' names, as the header writes them


def _argument(declaration: str, kernel: str) -> tuple[Any, str]:
    """(ctypes type, name) of one parameter declaration such as `const float *x` or `int64_t N`."""
    words = declaration.replace("*", " * ").split()
    name = words[-1]
    if "*" in words:
        return ctypes.c_void_p, name
    kind = " ".join(w for w in words[:-1] if w != "const")
    if kind not in SCALARS or SCALARS[kind] is None:
        raise ValueError(f"{kernel}: the parameter {declaration!r} is not a pointer, int64_t, int or float")
    return SCALARS[kind], name


def parse(header: str) -> dict[str, Signature]:
    """Every kernel the header declares, by name; ValueError where a declaration's types are not ones ctypes is
    given here, or a kernel is declared without its level's name (or named without a declaration)."""
    text = re.sub(r"/\*.*?\*/", " ", header, flags=re.DOTALL)
    found: dict[str, Signature] = {}
    for result, name, params in _PROTOTYPE.findall(text):
        params = " ".join(params.split())
        args = [] if params in ("", "void") else [_argument(p.strip(), name) for p in params.split(",")]
        if name in found:
            raise ValueError(f"{name} is declared twice")
        found[name] = Signature(name, SCALARS[result], tuple(t for t, _ in args), tuple(n for _, n in args))
    renamed = {a for a, b in _RENAMED.findall(text) if a == b}
    if renamed != set(found):
        raise ValueError(f"declared without BEAMSERVE_LEVELED, or the reverse: {sorted(renamed ^ set(found))}")
    return found


@cache
def signatures() -> dict[str, Signature]:
    """The kernels csrc/beamserve.h declares."""
    return parse(HEADER.read_text())


class Kernels:
    """One level's build of the library: each kernel the header declares under its plain name, its types set."""

    def __init__(self, lib: ctypes.CDLL, level: int) -> None:
        self.level = level
        for name, signature in signatures().items():
            fn = lib[f"{name}_v{level}"]  # a function object of its own: another level's keeps its own types
            fn.restype, fn.argtypes = signature.result, list(signature.arguments)
            setattr(self, name, fn)

    def __getattr__(self, name: str) -> Any:  # the kernels set above; for the type checker
        raise AttributeError(f"the C kernels have no {name}")


def load() -> Kernels | None:
    """The level of the library this CPU runs, at most the one BEAMSERVE_NATIVE_KERNELS names (`x86-64-v3`,
    `x86-64`: what a CPU of that level computes, for measurements and tests; `x86-64-v3` without AVX-VNNI and
    `x86-64-v4` without AMX, their `+avxvnni` and `+amx` with them where the CPU has them); None where turned off
    (`0`) or not built."""
    setting = os.environ.get(ENV, "1")
    if setting == "0":
        return None
    if setting != "1" and setting not in LEVELS:
        raise ValueError(f"{ENV}={setting!r}: expected 0, 1 or one of {', '.join(LEVELS)}")
    lib = library()
    if lib is None:
        return None
    try:
        kernels = Kernels(lib, lib.beamserve_level(LEVELS.get(setting, 4)))
    except AttributeError:  # a library built from other sources than these (an install not rebuilt)
        return None
    kernels.beamserve_avx_vnni_allow(int(setting != "x86-64-v3"))
    kernels.beamserve_amx_allow(int(setting != "x86-64-v4"))
    return kernels


def library() -> ctypes.CDLL | None:
    """The library setup.py built beside the package, or None (no C compiler, or not loadable here)."""
    try:
        spec = importlib.util.find_spec(MODULE)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    try:
        lib = ctypes.CDLL(spec.origin)
        level = lib.beamserve_level
    except (OSError, AttributeError):  # not loadable here, or built from other sources
        return None
    level.argtypes, level.restype = [ctypes.c_int], ctypes.c_int
    return lib
