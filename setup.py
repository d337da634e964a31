"""beamserve's C kernels (model/kernels/csrc: the int8 row passes and GEMM, a decode step's attention, log-softmax and
candidate ranking), built as one plain shared library beside the package (model.kernels._native): on x86-64
every source is compiled for the baseline and for the x86-64-v3 (AVX2, FMA) and x86-64-v4 (AVX-512) levels,
each build's functions named by its level (csrc/beamserve.h, the kernel API, declares them), and csrc/dispatch.c
says which level this CPU runs, whose functions model/kernels/bindings.py binds.

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
    "model/kernels/csrc/int8_avx2.c",
    "model/kernels/csrc/f32_gemm.c",
    "model/kernels/csrc/attention.c",
    "model/kernels/csrc/search.c",
    "model/kernels/csrc/sublayers.c",
    "model/kernels/csrc/layer_norm.c",
    "model/kernels/csrc/silu.c",
    "model/kernels/csrc/beam_steps.c",
]
# No contraction of a separate multiply and add into one rounding: the int8 passes must match PyTorch's
# bits, and the decode-step kernels' bits must not depend on the CPU.
FLAGS = ["-O3", "-ffp-contract=off", "-fno-math-errno"]
X86 = platform.machine() in ("x86_64", "AMD64")
# (BEAMSERVE_LEVEL, compiler flags) of each build in the library.
LEVELS = [(1, []), (3, ["-march=x86-64-v3"]), (4, ["-march=x86-64-v4"])] if X86 else [(1, [])]
DEPENDS = [f"model/kernels/csrc/{name}.h" for name in ("beamserve", "vec16", "vreg", "quantize")]
NAME = "model.kernels._native"


class BuildKernels(build_ext):
    """build_ext that compiles the kernel sources once per level into the one library, and says, in a block a person
    sees in pip's output, when it did not build."""

    def build_extension(self, ext: Extension) -> None:
        objects = []
        for level, flags in LEVELS:
            objects += self.compiler.compile(
                SOURCES,
                output_dir=os.path.join(self.build_temp, f"v{level}"),
                macros=[("BEAMSERVE_LEVEL", str(level))],
                extra_postargs=FLAGS + flags,
                depends=DEPENDS,
                debug=self.debug,
            )
        ext.extra_objects = objects
        super().build_extension(ext)

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
    ext_modules=[
        Extension(
            NAME,
            sources=["model/kernels/csrc/dispatch.c"],
            depends=SOURCES + DEPENDS,  # the levels' sources, compiled by BuildKernels: a change rebuilds the library
            define_macros=[("BEAMSERVE_X86_LEVELS", "1")] if X86 else [],
            extra_compile_args=FLAGS,
            optional=not REQUIRED,
        )
    ],
)
