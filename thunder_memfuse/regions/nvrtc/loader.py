"""Finding and opening the CUDA libraries (driver, NVRTC, cuBLAS, cuBLASLt) for memfuse's own
kernels, and what was found.  Nothing here touches CUDA at import: the C side (csrc/cuda) dlopens
the libraries at first use (docs/CUDA.md)."""
from __future__ import annotations

import functools
import glob
import os
import sys
import threading

from ... import _C

KernelCompileError = _C.KernelCompileError

# ---------------------------------------------------------------------------------------------
# Loader setup and status


def library_search_dirs() -> list[str]:
    """lib folders of the nvidia pip wheels on sys.path (nvidia/*/lib, e.g. nvidia/cu13/lib for CUDA 13,
    nvidia/cuda_nvrtc/lib and nvidia/cublas/lib for CUDA 12), then torch/lib."""
    dirs: list[str] = []
    roots = [p for p in sys.path if p and os.path.isdir(p)]
    for root in roots:
        for d in sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib"))):
            if d not in dirs:
                dirs.append(d)
    for root in roots:
        d = os.path.join(root, "torch", "lib")
        if os.path.isdir(d) and d not in dirs:
            dirs.append(d)
    return dirs


_setup_lock = threading.Lock()
_setup_done = False


def _ensure_loader() -> None:
    global _setup_done
    if _setup_done:
        return
    with _setup_lock:
        if not _setup_done:
            _C.cuda_set_search_dirs(library_search_dirs())
            _setup_done = True


def cuda_status() -> dict:
    """What was found: {'driver': {...}, 'nvrtc': {...}, 'cublas': {...}, 'cublaslt': {...}, 'cache': {...},
    'cache_dir', 'search_dirs', 'can_compile', 'can_run', 'torch_cuda'}.  Each library entry has
    found/path/how/version or the loader's error text."""
    _ensure_loader()
    st = _C.cuda_status()
    st["search_dirs"] = [d for d in st.get("search_dirs", "").split(":") if d]
    try:
        import torch

        st["torch_cuda"] = {
            "available": bool(torch.cuda.is_available()),
            "version": torch.version.cuda,
            "device_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        }
    except Exception as e:  # pragma: no cover - torch is a dependency
        st["torch_cuda"] = {"available": False, "error": repr(e)}
    return st


def nvrtc_compile(source: str, arch: int, **kw) -> dict:
    """NVRTC compile through the kernel cache (see _C.nvrtc_compile)."""
    _ensure_loader()
    return _C.nvrtc_compile(source, arch, **kw)


@functools.lru_cache(maxsize=None)
def _device_info(device: int):
    _ensure_loader()
    return _C.cuda_device_info(device)  # (arch, sm count)


def _shared(table: dict, lock, key, make):
    """table[key], made once by make() under lock (process-wide caches read without it)."""
    value = table.get(key)
    if value is None:
        with lock:
            value = table.get(key)
            if value is None:
                value = table[key] = make()
    return value
