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


def checkpointed_mlp(d=64, layers=3):
    """A model of pre-norm MLP blocks (LayerNorm, Linear, tanh GELU, Linear, residual), each block under
    torch.utils.checkpoint; parameters from seed 0."""
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = torch.nn.LayerNorm(d)
            self.fc1 = torch.nn.Linear(d, 4 * d)
            self.fc2 = torch.nn.Linear(4 * d, d)

        def forward(self, x):
            return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x)), approximate="tanh"))

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList(Block() for _ in range(layers))

        def forward(self, x):
            for b in self.blocks:
                x = checkpoint(b, x, use_reentrant=False)
            return x

    return Model()


def module_step(model, x):
    """step(jm): one training step of jm (model, jitted or not) on x, loss out.sum(); returns the
    output and every parameter's gradient, and clears the gradients."""
    def step(jm):
        out = jm(x)
        out.sum().backward()
        res = [out.detach()] + [p.grad.clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        return res

    return step
