"""Build of the C extension thunder_memfuse._C (csrc/core, csrc/cuda, csrc/python).

Warnings are errors when CI=true or MEMFUSE_WERROR=1.  The extension links only
libdl: CUDA libraries are opened at first use (csrc/cuda), never at import.
"""
import glob
import os

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

try:  # PEP 660 editable installs (setuptools >= 64)
    from setuptools.command.editable_wheel import editable_wheel
except ImportError:  # pragma: no cover - old setuptools: no editable wheel to patch
    editable_wheel = None

PTH = "thunder_memfuse_compat.pth"


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
        self.copy_file(PTH, os.path.join(self.build_lib, PTH))

    def get_outputs(self, include_bytecode=True):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, PTH)]


class _StrategyWithPth:
    """Wraps setuptools' editable strategy: writes its files, then our .pth.

    An editable wheel holds only setuptools' own .pth and finder, so without
    this `import thunder` first fails after `pip install -e .`.  Our .pth sorts
    after setuptools' `__editable__.*.pth`, whose finder (or path entry) makes
    _thunder_memfuse_boot importable by the time our line runs.
    """

    def __init__(self, inner):
        self.inner = inner

    def __call__(self, wheel, files, mapping):
        out = self.inner(wheel, files, mapping)
        with open(PTH, "rb") as f:
            wheel.writestr(PTH, f.read())
        return out

    def __enter__(self):
        self.inner.__enter__()
        return self

    def __exit__(self, *exc):
        return self.inner.__exit__(*exc)


cmdclass = {"build_py": build_py_with_pth}
if editable_wheel is not None and hasattr(editable_wheel, "_select_strategy"):

    class editable_wheel_with_pth(editable_wheel):
        def _select_strategy(self, *args, **kwargs):
            return _StrategyWithPth(super()._select_strategy(*args, **kwargs))

    cmdclass["editable_wheel"] = editable_wheel_with_pth


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
    cmdclass=cmdclass,
)
