"""The pinned stack works: Thunder on this torch runs the seed and checkpointing on CPU."""
import torch
import thunder
from torch.utils.checkpoint import checkpoint

from thunder_memfuse.seed import memory_peak_efficient_func, memory_peak_inefficient_func


def _seed_inputs(n=10, size=64):
    torch.manual_seed(0)
    return [torch.randn(size, size) for _ in range(n)], torch.randn(size, size)


def test_seed_functions_forward():
    t0s, a = _seed_inputs()
    for fn in (memory_peak_efficient_func, memory_peak_inefficient_func):
        torch.testing.assert_close(thunder.jit(fn)(list(t0s), a), fn(list(t0s), a))


def _blk(x, w):
    return torch.nn.functional.gelu(x @ w).sin().cos()


def _ckpt(x, w):
    return checkpoint(_blk, x, w, use_reentrant=False).sum()


def test_checkpoint_forward_backward():
    torch.manual_seed(0)
    x = torch.randn(16, 16, requires_grad=True)
    w = torch.randn(16, 16, requires_grad=True)
    jf = thunder.jit(_ckpt)
    y = jf(x, w)
    y.backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    y_ref = _ckpt(x, w)
    y_ref.backward()
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(gx, x.grad)
    torch.testing.assert_close(gw, w.grad)
    # the backward really recomputes the checkpointed block
    bw = thunder.last_backward_traces(jf)[-1]
    assert any(b.sym.name == "erf" for b in bw.bound_symbols)
