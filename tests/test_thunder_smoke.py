"""The pinned stack works: Thunder on this torch runs the seed and checkpointing on CPU."""
import torch
import thunder

from models import checkpointed, grads_of, seed_inputs
from benchmarks.seed import memory_peak_efficient_func, memory_peak_inefficient_func


def test_seed_functions_forward():
    t0s, a = seed_inputs(size=64)
    for fn in (memory_peak_efficient_func, memory_peak_inefficient_func):
        torch.testing.assert_close(thunder.jit(fn)(list(t0s), a), fn(list(t0s), a))


def test_checkpoint_forward_backward():
    torch.manual_seed(0)
    x = torch.randn(16, 16, requires_grad=True)
    w = torch.randn(16, 16, requires_grad=True)
    jf = thunder.jit(checkpointed)
    for got, want in zip(grads_of(jf, x, w), grads_of(checkpointed, x, w)):
        torch.testing.assert_close(got, want)
    # the backward really recomputes the checkpointed block
    bw = thunder.last_backward_traces(jf)[-1]
    assert any(b.sym.name == "erf" for b in bw.bound_symbols)
