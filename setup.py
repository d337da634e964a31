"""beamserve's C kernels (model/kernels/csrc: the int8 row passes and GEMM, a decode step's attention, log-softmax and
candidate ranking), built as plain shared libraries beside the package: on x86-64 once for the baseline
and once each for the x86-64-v3 (AVX2, FMA) and x86-64-v4 (AVX-512) levels, of which model/kernels/native.py
loads the best this CPU runs.

Without a C compiler the build goes on without them, says so in a block on stderr, and the model computes with
PyTorch's ops (model/kernels/native.py says which runs); with BEAMSERVE_REQUIRE_KERNELS=1 (`make test`, the
Docker build) a library that does not build fails the install.
"""

import os
import platform
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

REQUIRED = os.environ.get("BEAMSERVE_REQUIRE_KERNELS") == "1"

SOURCES = [
    "model/kernels/csrc/int8_rows.c",
    "model/kernels/csrc/int8_gemm.c",
    "model/kernels/csrc/int8_vnni.c",
    "model/kernels/csrc/f32_gemm.c",
    "model/kernels/csrc/attention.c",
    "model/kernels/csrc/search.c",
    "model/kernels/csrc/sublayers.c",
    "model/kernels/csrc/layer_norm.c",
]
# No contraction of a separate multiply and add into one rounding: the int8 passes must match PyTorch's
# bits, and the decode-step kernels' bits must not depend on the CPU.
FLAGS = ["-O3", "-ffp-contract=off", "-fno-math-errno"]
LEVELS = ["x86-64-v3", "x86-64-v4"] if platform.machine() in ("x86_64", "AMD64") else []


def library(name: str, flags: list[str]) -> Extension:
    return Extension(
        name,
        sources=SOURCES,
        depends=["model/kernels/csrc/vec16.h", "model/kernels/csrc/quantize.h"],
        extra_compile_args=FLAGS + flags,
        optional=not REQUIRED,
    )


class BuildKernels(build_ext):
    """build_ext that says, in a block a person sees in pip's output, which kernel libraries did not build."""

    def run(self) -> None:
        super().run()
        missing = [e.name for e in self.extensions if not os.path.exists(self.get_ext_fullpath(e.name))]
        if missing:
            bar = "=" * 78
            print(
                f"\n{bar}\nbeamserve: the C kernels did not build ({', '.join(missing)}): no C compiler?\n"
                "The model will compute with PyTorch's ops, correct and slower. Install gcc (or clang) and\n"
                "reinstall; BEAMSERVE_REQUIRE_KERNELS=1 makes this an error.\n"
                f"{bar}\n",
                file=sys.stderr,
            )


setup(
    cmdclass={"build_ext": BuildKernels},
    ext_modules=[library("model.kernels._native", [])]
    + [library(f"model.kernels._native_{level[-2:]}", [f"-march={level}"]) for level in LEVELS]
)
