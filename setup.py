"""Build of the C extension thunder_memfuse._C (csrc/core, csrc/cuda, csrc/python).

Warnings are errors when CI=true or MEMFUSE_WERROR=1.  The extension links only
libdl: CUDA libraries are opened at first use (csrc/cuda), never at import.
"""
import glob
import os

from setuptools import Extension, setup
from setuptools.command.build_py import build_py


def _sources():
    out = []
    for sub in ("core", "cuda", "python"):
        out += sorted(glob.glob(os.path.join("csrc", sub, "*.c")))
    return out


_warn = ["-Wall", "-Wextra", "-Wshadow", "-Wstrict-prototypes", "-Wmissing-prototypes"]
if os.environ.get("CI", "").lower() == "true" or os.environ.get("MEMFUSE_WERROR") == "1":
    _warn.append("-Werror")
_extra = ["-std=gnu11", "-O2", "-fvisibility=hidden"] + _warn
if os.environ.get("MEMFUSE_DEBUG") == "1":
    _extra += ["-O0", "-g"]


class build_py_with_pth(build_py):
    """Ship thunder_memfuse_compat.pth at the top of site-packages.

    NOTE [compat .pth]: the .pth imports the tiny _thunder_memfuse_boot module,
    which only registers an import hook; the hook applies
    the shims when `thunder` is first imported.  No torch import
    happens at interpreter start.
    """

    def run(self):
        super().run()
        self.copy_file("thunder_memfuse_compat.pth", os.path.join(self.build_lib, "thunder_memfuse_compat.pth"))

    def get_outputs(self, include_bytecode=True):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, "thunder_memfuse_compat.pth")]


setup(
    ext_modules=[
        Extension(
            "thunder_memfuse._C",
            sources=_sources(),
            include_dirs=["csrc/core", "csrc/cuda", "csrc/python"],
            extra_compile_args=_extra,
            libraries=["dl"],
        )
    ],
    cmdclass={"build_py": build_py_with_pth},
)
