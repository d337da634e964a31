"""The int8 row kernels (model/csrc/int8_rows.c), built as a plain shared library beside the package.

Optional: without a C compiler the build goes on without it, and model/quant.py computes the same bits
with PyTorch's ops (model/native.py says which runs).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "model._int8_rows",
            sources=["model/csrc/int8_rows.c"],
            # No contraction of a separate multiply and add into one rounding: the bits must match PyTorch's.
            extra_compile_args=["-O3", "-ffp-contract=off", "-fno-math-errno"],
            optional=True,
        )
    ]
)
