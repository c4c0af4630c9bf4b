"""Type stub of the C extension thunder_memfuse._C (csrc/python).

The docstrings of the functions carry the same signatures (inspect.signature works on each).
Ids are ints; sequences may be lists or tuples (the binding snapshots them, plan.c NOTE
[snapshots]).  Bad input raises TypeError or ValueError naming the argument.
"""
from collections.abc import Callable, Sequence
from typing import Any

DEFAULT_MAX_STATES: int
EFF_ORDERED: int
EFF_WRITES: int
EFF_COMM: int
EFF_WAIT: int
EPI_HEAD: int
EPI_TAIL: int
FUSIBLE_POINTWISE: int
RECORD_OP: int
RECORD_PROLOGUE: int
RECORD_DROP: int
RECORD_RETURN: int

class MemFuseError(RuntimeError): ...

class KernelCompileError(MemFuseError):
    log: str
    source: str

_Ids = Sequence[int]
_Pairs = Sequence[Sequence[int]]

def plan(
    ops: Sequence[tuple[_Ids, _Ids] | Sequence[_Ids]],
    value_bytes: Sequence[int],
    *,
    graph_inputs: _Ids = (),
    graph_outputs: _Ids = (),
    aliases: _Pairs = (),
    fusible: Sequence[object] | None = None,
    after: _Pairs = (),
    max_states: int | None = None,
    fuse: bool = True,
    epilogues: _Pairs = (),
    fusion_moves: bool = True,
    comm: _Pairs = (),
    comm_overlap: bool = True,
    recompute: int = 0,
    cheap: Sequence[object] | None = None,
    peak_allowance: int = 0,
    peak_target: int = 0,
    donatable: _Ids = (),
) -> dict[str, Any]: ...
def simulate(
    ops: Sequence[tuple[_Ids, _Ids] | Sequence[_Ids]],
    value_bytes: Sequence[int],
    order: _Ids,
    groups: Sequence[_Ids] | None = None,
    *,
    graph_inputs: _Ids = (),
    graph_outputs: _Ids = (),
    aliases: _Pairs = (),
    fusible: Sequence[object] | None = None,
    epilogues: _Pairs = (),
    donatable: _Ids = (),
) -> tuple[int, list[int], list[int]]: ...
def min_cut(
    n: int, src: Sequence[int], dst: Sequence[int], capacity: Sequence[int], source: int, sink: int
) -> tuple[int, bytes]: ...
def plan_trace(
    bsyms: Sequence[Any],
    records: Sequence[tuple[int, int, object, Any, int, int]],
    *,
    tensor_type: type | tuple[type, ...],
    max_states: int | None = None,
    fuse: bool = True,
    freeable: Any = None,
    comm_overlap: bool = True,
    recompute: int = 0,
    peak_allowance: int = 0,
    peak_target: int = 0,
    donatable: Any = None,
) -> dict[str, Any]: ...
def _validate_max_states(max_states: int | None, /) -> int | None: ...

# CUDA (csrc/python/cuda_py.c): libraries load at the first call that needs them.
def cuda_set_search_dirs(dirs: Sequence[str], /) -> None: ...
def cuda_status() -> dict[str, Any]: ...
def cuda_codegen(region: tuple[Any, ...], /) -> str: ...
def cuda_codegen_info() -> dict[str, Any]: ...
def nvrtc_compile(
    source: str,
    arch: int,
    mode: str = "auto",
    cache: bool = True,
    cache_dir: str | None = None,
    name: str = "mf_kernel",
) -> dict[str, Any]: ...
def cuda_cache_stats() -> dict[str, int]: ...
def cuda_cache_clear() -> None: ...
def cuda_device_info(device: int, /) -> tuple[int, int]: ...
def cuda_load_function(image: bytes, name: str, device: int, /) -> int: ...
def cuda_launch(function: int, device: int, grid: Sequence[int], block: Sequence[int], stream: int,
                params: bytes, /) -> None: ...
def cublas_gemm(device: int, stream: int, workspace: int, workspace_bytes: int, transa: bool, transb: bool,
                m: int, n: int, k: int, A: int, lda: int, stride_a: int, B: int, ldb: int, stride_b: int,
                C: int, ldc: int, stride_c: int, batch: int, dtype: str, alpha: float, beta: float,
                allow_tf32: bool, /) -> None: ...
def cublaslt_matmul(device: int, stream: int, workspace: int, workspace_bytes: int, transa: bool, transb: bool,
                    m: int, n: int, k: int, A: int, lda: int, stride_a: int, B: int, ldb: int, stride_b: int,
                    D: int, ldd: int, stride_d: int, batch: int, dtype: str, allow_tf32: bool, bias: int,
                    act: str, /) -> None: ...
