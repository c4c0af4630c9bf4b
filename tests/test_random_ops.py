"""Random ops keep their relative order (thunder_memfuse/_symbols.py NOTE [random ops]).

Under a fixed seed, a function jitted with memfuse gives the same numbers as plain
thunder.jit (and as eager where plain Thunder matches eager), forward and backward.
"""
import random

import pytest
import torch
import thunder

from thunder_memfuse import MemFuse
from thunder_memfuse._symbols import is_random


def _draws():
    # every random op Thunder 0.2.6 runs on CPU
    return {
        "rand": lambda x: torch.rand(8, 8),
        "rand_like": lambda x: torch.rand_like(x),
        "randn": lambda x: torch.randn(8, 8),
        "randn_like": lambda x: torch.randn_like(x),
        "randint": lambda x: torch.randint(0, 10, (8, 8)).float(),
        "randint_like": lambda x: torch.randint_like(x, 10),
        "bernoulli": lambda x: torch.bernoulli(torch.sigmoid(x)),
        "multinomial": lambda x: torch.multinomial(torch.sigmoid(x), 3, replacement=True).float().sum(1, keepdim=True),
        "dropout": lambda x: torch.nn.functional.dropout(x, 0.5),
        "exponential_": lambda x: torch.empty(8, 8).exponential_(),
        "poisson": lambda x: torch.poisson(x.abs()),
    }


def _run(fn, *args, seed=0):
    torch.manual_seed(seed)
    out = fn(*args)
    return out if isinstance(out, tuple) else (out,)


def _same(a, b):
    return len(a) == len(b) and all(torch.equal(u, v) for u, v in zip(a, b))


@pytest.mark.parametrize("name", sorted(_draws()))
def test_each_random_op_keeps_its_place(name):
    draw = _draws()[name]

    # The shape: a draw nobody else needs comes first; a second draw feeds
    # a chain. A memory planner would like to run the chain's draw first.
    def f(x):
        d = draw(x)
        y = (x + 1).sin() * 2
        return d, (y * draw(x)).cos()

    x = torch.randn(8, 8)
    eager = _run(f, x)
    plain = _run(thunder.jit(f), x)
    jm = thunder.jit(f, transforms=[MemFuse(strict=True, fuse=True)])
    ours = _run(jm, x)
    assert _same(ours, plain), f"{name}: memfuse changed the numbers under a fixed seed"
    if _same(plain, eager):
        assert _same(ours, eager)
    # the random ops are recognised as such in the trace memfuse returned
    final = thunder.last_traces(jm)[-1]
    assert sum(is_random(b) for b in final.bound_symbols) >= 2


def test_dropout_forward_and_backward_match_plain_thunder():
    torch.manual_seed(1)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Dropout(0.3),
        torch.nn.Linear(32, 32), torch.nn.Dropout(0.2), torch.nn.Linear(32, 4),
    )
    x = torch.randn(8, 16)

    def step(jm):
        torch.manual_seed(7)
        out = jm(x)
        out.square().sum().backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        return (out.detach(), *grads)

    plain = step(thunder.jit(model))
    ours = step(thunder.jit(model, transforms=[MemFuse(strict=True)]))
    assert _same(ours, plain)


_ORDINARY = [
    lambda a, b: a + b,
    lambda a, b: a * b,
    lambda a, b: (a - b).relu(),
    lambda a, b: a @ b,
    lambda a, b: a.sin(),
    lambda a, b: torch.tanh(a) + 1,
]
_RANDOM = [
    lambda a, b: torch.rand(8, 8),
    lambda a, b: torch.randn_like(a),
    lambda a, b: torch.nn.functional.dropout(a, 0.5),
    lambda a, b: torch.bernoulli(torch.sigmoid(a)),
    lambda a, b: torch.randint(0, 5, (8, 8)).float(),
]


def _straight_line(rng, n):
    """A random straight-line program over a pool of values; about a third of
    the steps draw random numbers. Every value is returned, so none is dead."""
    steps = []
    for i in range(n):
        kind = _RANDOM if rng.random() < 0.35 else _ORDINARY
        steps.append((rng.randrange(len(kind)), kind is _RANDOM, rng.randrange(i + 1), rng.randrange(i + 1)))

    def f(x):
        pool = [x]
        for k, is_rand, i, j in steps:
            op = (_RANDOM if is_rand else _ORDINARY)[k]
            pool.append(op(pool[i], pool[j]))
        return tuple(pool[1:])

    return f


@pytest.mark.parametrize("seed", range(6))
def test_random_straight_line_programs(seed):
    rng = random.Random(seed)
    f = _straight_line(rng, rng.randrange(5, 10))
    x = torch.randn(8, 8)
    plain = _run(thunder.jit(f), x)
    ours = _run(thunder.jit(f, transforms=[MemFuse(strict=True, fuse=True)]), x)
    assert _same(ours, plain)
    assert _same(plain, _run(f, x))


def test_random_ops_never_join_a_region():
    from thunder_memfuse import _C
    from thunder_memfuse.integration._records import records

    def f(x):
        return torch.nn.functional.dropout(x.sin(), 0.5).cos()

    jm = thunder.jit(f, transforms=[MemFuse(strict=True)])
    jm(torch.randn(8, 8))
    trace = thunder.last_traces(jm)[-1]
    rand = [b for b in trace.bound_symbols if is_random(b)]
    plain = [b for b in trace.bound_symbols if b.sym.name in ("sin", "cos")]
    assert rand and plain
    # even a compiler that would fuse anything is never asked about a random op: its record
    # is ordered and not fusible
    recs = records(trace.bound_symbols, fusible=lambda b: True, epilogue_role=lambda b: 0, recompute=False)
    by = dict(zip(map(id, trace.bound_symbols), recs))
    assert all(by[id(b)][1] & _C.EFF_ORDERED and not by[id(b)][2] for b in rand)
    assert all(by[id(b)][2] for b in plain)


def test_random_ops_in_a_torchcompile_compilation():
    # memfuse replaces the torchcompile executor here and compiles its regions with
    # Inductor, but the draws stay the torch calls plain Thunder (and eager) makes, in
    # their order: every random value is bit-equal to plain Thunder's, the rest agrees
    # up to Inductor's rounding.  (Thunder's own torchcompile executor compiles the
    # draws into Inductor's program, whose RNG does not give eager's numbers.)
    def f(x):
        d = torch.rand(8, 8)
        y = (x + 1).sin() * 2
        return d, (y * torch.nn.functional.dropout(x, 0.5)).cos() + torch.randn_like(x)

    x = torch.randn(8, 8)
    plain = _run(thunder.jit(f), x)
    assert _same(plain, _run(f, x))
    jm = thunder.jit(f, executors=["torchcompile"], transforms=[MemFuse(strict=True, kernels="torchcompile")])
    ours = _run(jm, x)
    assert torch.equal(ours[0], plain[0])
    torch.testing.assert_close(ours[1], plain[1], rtol=1e-5, atol=1e-5)
    import thunder_memfuse as tm

    assert tm.report(jm)["forward"]["kernels"] == "torchcompile"
