"""Small functions and inputs shared by the Thunder tests."""
import torch
from torch.utils.checkpoint import checkpoint


def seed_inputs(n=10, size=256):
    torch.manual_seed(0)
    return [torch.randn(size, size) for _ in range(n)], torch.randn(size, size)


def block(x, w):
    return torch.nn.functional.gelu(x @ w).sin().cos()


def checkpointed(x, w):
    return checkpoint(block, x, w, use_reentrant=False).sum()


def grads_of(fn, x, w):
    """(output, grad x, grad w) of one forward+backward; leaves .grad cleared."""
    x.grad = w.grad = None
    y = fn(x, w)
    y.backward()
    out = (y.detach(), x.grad.clone(), w.grad.clone())
    x.grad = w.grad = None
    return out
