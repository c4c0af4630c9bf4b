"""Compatibility shims for lightning-thunder 0.2.6 on newer PyTorch.

Imported at interpreter start by thunder_memfuse_compat.pth (installed next to
the package) and by thunder_memfuse/__init__.py.  It registers a meta-path hook
that applies the shims the first time `thunder` is imported, so that
`import thunder` works first too.  Costs nothing until then: no torch import
at interpreter start.  It is a top-level module (not inside the package) so
that applying it never imports thunder_memfuse/__init__.py, which imports
thunder itself.

NOTE [torch 2.13 named tensors]
lightning-thunder 0.2.6 lists ``torch.Tensor.align_as``, ``align_to``,
``has_names``, ``refine_names`` and ``rename`` in
``thunder/torch/default_torch_ops.py`` at import time.  PyTorch 2.13 removed
named tensors, so ``import thunder`` fails with AttributeError.  We add
stand-ins that raise a clear RuntimeError if called; Thunder only needs the
attributes to exist to build its operator table.  Nothing else is patched.
"""
import sys


_REMOVED_NAMED_TENSOR_METHODS = ("align_as", "align_to", "has_names", "refine_names", "rename")


def _make_stub(name):
    def stub(self, *args, **kwargs):
        raise RuntimeError(f"torch.Tensor.{name}: named tensors were removed from this PyTorch version")

    stub.__name__ = name
    stub.__qualname__ = "Tensor." + name
    return stub


def apply():
    try:
        import torch
    except Exception:  # torch missing or broken: nothing to patch
        return
    for name in _REMOVED_NAMED_TENSOR_METHODS:
        if not hasattr(torch.Tensor, name):
            setattr(torch.Tensor, name, _make_stub(name))


class _ThunderCompatFinder:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name == "thunder":
            try:
                sys.meta_path.remove(cls)
            except ValueError:
                pass
            try:
                apply()
            except Exception:  # never break an import because of the shim
                pass
        return None  # let the normal finders import the module


if "thunder" not in sys.modules and _ThunderCompatFinder not in sys.meta_path:
    sys.meta_path.insert(0, _ThunderCompatFinder)
