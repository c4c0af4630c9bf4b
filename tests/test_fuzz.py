"""The differential fuzzer (tests/fuzz_programs.py) as part of the test command: seeded programs with
in-place ops on intermediates, inputs and views, may-alias ops, matmuls and random draws, with and
without autograd.  Wherever plain Thunder agrees with eager, memfuse must agree with plain Thunder
(bit for bit with plain thunder.jit, within tolerance where its regions are compiled) and must have
planned every trace.  The time bound is a guard against a hung run, not the test's size: the test
fails if it stops before its programs are done.  `python tests/fuzz_programs.py --help` runs longer."""
import os

import pytest

import fuzz_programs as fp
from thunder_memfuse.regions import torchcompile as tc

PROGRAMS = int(os.environ.get("MEMFUSE_FUZZ_PROGRAMS", "320"))
SECONDS = float(os.environ.get("MEMFUSE_FUZZ_SECONDS", "1500"))


def _check(res, n, least_ok=2):
    bad = {k: v for k, v in res.items() if k not in ("ok", "skip")}
    assert not bad, f"memfuse differs from the reference: {bad}"
    done = sum(len(v) for v in res.values())
    assert done == n, f"only {done} of {n} programs ran within {SECONDS} s"
    # most programs say something about memfuse (the reference is right on them)
    assert len(res.get("ok", ())) >= n // least_ok, {k: len(v) for k, v in res.items()}


def test_random_programs_match_plain_thunder():
    res = fp.fuzz(range(PROGRAMS), seconds=SECONDS)
    _check(res, PROGRAMS)


@pytest.mark.skipif(not tc.available(False), reason="torch.compile cannot build here (no C++ compiler)")
def test_random_programs_match_plain_thunder_with_torchcompile():
    n = max(PROGRAMS // 16, 8)
    res = fp.fuzz(range(10_000, 10_000 + n), seconds=SECONDS, executors=["torchcompile"])
    _check(res, n)


def test_the_fuzzer_sees_a_pass_that_does_nothing(monkeypatch):
    """A memfuse that silently returned every trace unchanged would be reported as unplanned."""
    from thunder_memfuse.integration import transform

    p = next(p for p in map(fp.make_program, range(100)) if fp.check(p).status == "ok")
    monkeypatch.setattr(transform.MemFuse, "_transform", lambda self, trace: trace)
    assert fp.check(p).status == "unplanned"


@pytest.mark.skipif(not tc.available(False), reason="torch.compile cannot build here (no C++ compiler)")
@pytest.mark.parametrize("seed", [45, 294])
def test_programs_whose_compiled_regions_wrote_into_their_inputs(seed):
    # regions/torchcompile.py NOTE [functional region programs]: the backward's copy_with_setitem (a
    # clone, then an assignment into it) was compiled as a write into the incoming gradient, which a
    # view made by an earlier region still read; these two programs found it
    assert fp.check(fp.make_program(seed), ["torchcompile"]).status == "ok"


EXECUTORS = [None, pytest.param(["torchcompile"], marks=pytest.mark.skipif(
    not tc.available(False), reason="torch.compile cannot build here (no C++ compiler)"))]


# NOTE [stateful programs] (tests/fuzz_stateful.py): training steps of modules that update buffers and
# parameters in place, under each executor configuration
@pytest.mark.parametrize("executors", EXECUTORS, ids=["thunder", "torchcompile"])
def test_stateful_training_steps_match(executors):
    n = max(PROGRAMS // 16, 8) if executors else max(PROGRAMS // 8, 16)
    res = fp.fuzz(range(20_000, 20_000 + n), seconds=SECONDS, executors=executors, family="stateful")
    _check(res, n, least_ok=3)


# NOTE [recompute next to writes]: recomputation must copy ops in some of these programs, never one that
# reads or makes a storage written in place
@pytest.mark.parametrize("executors", EXECUTORS, ids=["thunder", "torchcompile"])
def test_recomputation_next_to_in_place_writes(executors):
    import fuzz_stateful

    n = max(PROGRAMS // 20, 8) if executors else max(PROGRAMS // 8, 24)
    res = fp.fuzz(range(30_000, 30_000 + n), seconds=SECONDS, executors=executors, family="recompute")
    _check(res, n)
    assert fuzz_stateful.copied_next_to_writes(res) >= 2, res.get("ok")


# integration/_saved_set.py NOTE [the saved set]: under a memory budget no plan fits, memfuse's fusion
# pass rebuilds saved tensors in the backward; the programs (in-place writes on inputs and buffers,
# views, random draws) must still match plain Thunder, and some must really have rebuilt something
@pytest.mark.skipif(not tc.available(False), reason="torch.compile cannot build here (no C++ compiler)")
def test_programs_with_saved_tensors_rebuilt_under_a_tight_memory_budget():
    n = max(PROGRAMS // 20, 8)
    rebuilt = 0
    for family, first in (("plain", 10_000), ("stateful", 20_000)):
        res = fp.fuzz(range(first, first + n), seconds=SECONDS, executors=["torchcompile"], family=family,
                      memory_budget=1)
        _check(res, n, least_ok=3)
        rebuilt += sum(1 for _, d in res["ok"] if d.startswith("rebuilt"))
    assert rebuilt >= 2, "no program rebuilt a saved tensor: the test says nothing about the saved set"


# NOTE [attention programs]: scaled_dot_product_attention and the chains memfuse rewrites into it, with
# masks and biases the program made (their gradients), on views whose rows may be strided
@pytest.mark.parametrize("executors", EXECUTORS, ids=["thunder", "torchcompile"])
def test_programs_with_attention_match_plain_thunder(executors):
    n = max(PROGRAMS // 20, 8) if executors else max(PROGRAMS // 8, 24)
    res = fp.fuzz(range(40_000, 40_000 + n), seconds=SECONDS, executors=executors, family="attention")
    _check(res, n)
