"""beamserve's C kernels (model/kernels/csrc: the int8 row passes and GEMM, a decode step's attention, log-softmax and
candidate ranking), built as plain shared libraries beside the package: on x86-64 once for the baseline
and once each for the x86-64-v3 (AVX2, FMA) and x86-64-v4 (AVX-512) levels, of which model/kernels/native.py
loads the best this CPU runs.

Optional: without a C compiler the build goes on without them, and the model computes with PyTorch's ops
(model/kernels/native.py says which runs).
"""

import platform

from setuptools import Extension, setup

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
        optional=True,
    )


setup(
    ext_modules=[library("model.kernels._native", [])]
    + [library(f"model.kernels._native_{level[-2:]}", [f"-march={level}"]) for level in LEVELS]
)
