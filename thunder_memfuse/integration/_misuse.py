"""Misuse of the transform that Thunder or torch would answer without a hint: each gets a TypeError
that names the fix.

NOTE [misuse hooks]: where a misuse reaches an object of ours, the object answers it:
- thunder.jit(fn, transforms=memfuse) (one transform, not a list): Thunder slices the argument
  (`transforms[:]`, for a function) or iterates it (for a module), so MemFuse's __getitem__ and
  __iter__ raise, as a MemFuse would have anyway, but saying transforms=[memfuse];
- torch.compile(fn, backend=memfuse), or memfuse used as a decorator: the object is called, so
  MemFuse's __call__ raises (torch.compile wraps it in its BackendCompilerFailed, message kept);
- thunder.jit(fn, transforms=[memfuse], kernels=...) (a MemFuse option given to thunder.jit, which
  keeps unknown keyword arguments as compile options and never reads them): our first hook of the
  compilation reads the compile options (check_compile_options).
Two misuses never reach us, so they are documented instead (docs/API.md, "Misuse"):
executors=[memfuse] (Thunder's own ValueError: not a valid Executor) and thunder.jit(fn,
memfuse=True) without memfuse in transforms (Thunder ignores the unknown option, and no hook of
ours runs in that compilation).
"""
from __future__ import annotations

# MemFuse's options, and the name a user might give the whole thing, as thunder.jit keywords
OPTION_NAMES = ("memfuse", "kernels", "fuse", "replace_fusion", "strict", "max_states", "comm_overlap",
                "recompute", "backend")

_USE = "thunder.jit(fn, transforms=[memfuse])"


def _not_a_list(self):
    return TypeError("thunder.jit(..., transforms=memfuse) passes one transform where thunder.jit takes a list: "
                     "use transforms=[memfuse] (or transforms=[MemFuse(...)] with options)")


class MisuseHints:
    """Mixed into MemFuse: the misuses of NOTE [misuse hooks] that reach the object raise a
    TypeError naming the fix."""

    def __iter__(self):
        raise _not_a_list(self)

    def __getitem__(self, key):
        raise _not_a_list(self)

    def __call__(self, *args, **kwargs):
        import torch

        if args and isinstance(args[0], torch.fx.GraphModule):
            raise TypeError("torch.compile(fn, backend=memfuse): memfuse is a Thunder transform, not a "
                            f"torch.compile backend; use {_USE}, and to have torch.compile (Inductor) compile "
                            "memfuse's fusion regions, thunder.jit(fn, executors=['torchcompile'], "
                            "transforms=[memfuse])")
        raise TypeError(f"memfuse is a Thunder transform, not a function or a decorator to call; use {_USE}")


def check_compile_options(cd) -> None:
    """A MemFuse option (or memfuse=) passed to thunder.jit itself, where memfuse is in transforms:
    Thunder would keep it and never read it, so the user's setting would be silently lost."""
    opts = getattr(cd, "compile_options", None) or {}
    given = [k for k in OPTION_NAMES if k in opts]
    if not given:
        return
    shown = ", ".join(f"{k}={opts[k]!r}" for k in given)
    settings = ", ".join(f"{k}={opts[k]!r}" for k in given if k != "memfuse")
    fix = (f"pass them to the transform: transforms=[MemFuse({settings})]" if settings else
           "memfuse runs because it is in transforms= (leave it out of transforms, or set THUNDER_MEMFUSE=0, "
           "to run without it)")
    raise TypeError(f"thunder.jit(..., {shown}): thunder.jit does not know these options and would ignore "
                    f"them; {fix}, and drop them from thunder.jit's arguments")
