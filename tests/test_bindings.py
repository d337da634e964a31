"""The C kernels' bindings come from their one declaration (model/kernels/csrc/beamserve.h, parsed by
model/kernels/bindings.py): every kernel the header declares is exported by each level's build with its level's
name, nothing the library exports goes undeclared, and the parser refuses what it cannot bind."""

from __future__ import annotations

import ctypes
import os
import platform
import re
import shutil
import subprocess

import pytest

from model.kernels import bindings, native

LIBRARY = bindings.library()
BUILT = pytest.mark.skipif(
    LIBRARY is None or os.environ.get(bindings.ENV) == "0", reason="the C library is not built or turned off here"
)
LEVELS = (1, 3, 4) if platform.machine() == "x86_64" else (1,)


def _exported() -> set[str]:
    """The library's exported function names (its dynamic symbol table)."""
    assert LIBRARY is not None and shutil.which("nm"), "nm (binutils) reads the library's symbols"
    path = LIBRARY._name
    out = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if " T " in line}


@BUILT
def test_every_declared_kernel_is_exported_by_every_level_and_nothing_else_is() -> None:
    declared = bindings.signatures()
    exported = _exported()
    for level in LEVELS:
        missing = [name for name in declared if f"{name}_v{level}" not in exported]
        assert not missing, f"declared in beamserve.h, not built at level {level}: {missing}"
    leveled = {re.sub(r"_v\d$", "", name) for name in exported if re.search(r"_v\d$", name)}
    assert leveled - set(declared) == set(), "exported by the library and not declared in beamserve.h"
    assert {name for name in exported if not re.search(r"_v\d$", name)} == {"beamserve_level"}  # dispatch.c's


@BUILT
def test_the_bound_kernels_carry_the_header_types() -> None:
    kernels = native.kernels()
    attend = bindings.signatures()["beamserve_attend"]
    fn = kernels.beamserve_attend
    assert fn.restype is ctypes.c_int and tuple(fn.argtypes) == attend.arguments
    assert attend.parameters[:3] == ("q", "k", "v") and attend.arguments[-2:] == (ctypes.c_float, ctypes.c_void_p)
    assert kernels.beamserve_vnni_packed_bytes.restype is ctypes.c_int64
    assert kernels.beamserve_silu.restype is None


def test_the_parser_reads_declarations_as_the_compiler_does() -> None:
    header = """
    /* a comment with int beamserve_fake(int x); in it */
    #define beamserve_scale_rows BEAMSERVE_LEVELED(beamserve_scale_rows)
    void beamserve_scale_rows(float *x, int64_t rows,
                              int64_t cols, const float *const *scale, float eps, int early);
    #define beamserve_count BEAMSERVE_LEVELED(beamserve_count)
    int64_t beamserve_count(void);
    """
    found = bindings.parse(header)
    assert set(found) == {"beamserve_scale_rows", "beamserve_count"}
    rows = found["beamserve_scale_rows"]
    assert rows.result is None and rows.parameters == ("x", "rows", "cols", "scale", "eps", "early")
    p, q = ctypes.c_void_p, ctypes.c_int64
    assert rows.arguments == (p, q, q, p, ctypes.c_float, ctypes.c_int)
    assert found["beamserve_count"].result is ctypes.c_int64 and found["beamserve_count"].arguments == ()


@pytest.mark.parametrize(
    ("header", "says"),
    [
        ("#define beamserve_f BEAMSERVE_LEVELED(beamserve_f)\nint beamserve_f(double x);", "not a pointer"),
        ("int beamserve_f(int x);", "without BEAMSERVE_LEVELED"),
        ("#define beamserve_f BEAMSERVE_LEVELED(beamserve_f)\n", "without BEAMSERVE_LEVELED"),
        (
            "#define beamserve_f BEAMSERVE_LEVELED(beamserve_f)\nint beamserve_f(int x);\nint beamserve_f(int x);",
            "declared twice",
        ),
    ],
)
def test_the_parser_refuses_what_it_cannot_bind(header: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        bindings.parse(header)


# The kernels that still take more than MOST_ARGUMENTS arguments: a kernel may leave this set (its arguments
# grouped into a struct, as the beam search's state, rules and answer are), and none may join it.
MOST_ARGUMENTS = 12
STILL_LONGER = {
    "beamserve_attend", "beamserve_self_attend_step", "beamserve_copy_rows", "beamserve_avx2_linear",
    "beamserve_vnni_linear", "beamserve_decoder_segment", "beamserve_encoder_segment",
}  # fmt: skip


def test_no_kernel_joins_those_taking_more_than_twelve_arguments() -> None:
    longer = {name for name, s in bindings.signatures().items() if len(s.arguments) > MOST_ARGUMENTS}
    assert longer <= STILL_LONGER, f"over {MOST_ARGUMENTS} arguments (pass a struct): {sorted(longer - STILL_LONGER)}"
    assert longer >= STILL_LONGER, f"now within {MOST_ARGUMENTS}, out of STILL_LONGER: {STILL_LONGER - longer}"
    steps = bindings.signatures()["beamserve_beam_steps"]
    assert len(steps.arguments) <= MOST_ARGUMENTS and "beams" in steps.parameters and "rules" in steps.parameters
