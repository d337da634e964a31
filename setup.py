"""beamserve's C kernels (model/csrc: the int8 row passes, a decode step's attention, log-softmax and
candidate ranking), built as one plain shared library beside the package.

Optional: without a C compiler the build goes on without it, and the model computes with PyTorch's ops
(model/native.py says which runs).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "model._native",
            sources=["model/csrc/int8_rows.c", "model/csrc/attention.c", "model/csrc/search.c"],
            depends=["model/csrc/vec16.h"],
            # No contraction of a separate multiply and add into one rounding: the int8 passes must match
            # PyTorch's bits, and the decode-step kernels' bits must not depend on the CPU.
            extra_compile_args=["-O3", "-ffp-contract=off", "-fno-math-errno"],
            optional=True,
        )
    ]
)
