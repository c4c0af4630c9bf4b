"""compare() counts memfuse's Inductor regions by the buffers their compiled programs allocate
(regions/inductor_buffers.py NOTE [Inductor's buffer plan], _compare.py NOTE [regions in compare])."""
import pytest
import torch
import thunder

import thunder_memfuse as tm
from thunder_memfuse import MemFuse
from thunder_memfuse.measure import compare
from thunder_memfuse.regions import torchcompile as tc
from thunder_memfuse.regions.inductor_buffers import buffer_peak

from models import checkpointed_mlp

needs_compiler = pytest.mark.skipif(not tc.available(False), reason="torch.compile cannot build here (no C++ compiler)")


def _program(*body):
    return "\n".join(["class Runner:", "    def call(self, args):", "        a, = args"]
                     + ["        " + ln for ln in body] + ["", "runner = Runner()"])


def test_the_reader_follows_allocations_reuses_and_frees():
    src = _program(
        "buf0 = empty_strided_cpu((4, 8), (8, 1), torch.float32)",  # 128 bytes
        "buf1 = empty_strided_cpu((2, 8), (8, 1), torch.float64)",  # 128
        "kernel(a, buf0, buf1)",
        "buf2 = reinterpret_tensor(buf0, (32, ), (1, ), 0); del buf0  # reuse",
        "del buf1",
        "buf3 = empty_strided_cpu((8, 4), (1, 8), torch.float16)",  # 64
        "return (buf2, buf3, reinterpret_tensor(a, (4, ), (1, ), 0), )",
    )
    assert buffer_peak(src) == 256
    # a strided buffer spans its last element: (2, 3) with strides (1, 4) holds 1 + 1 + 8 elements
    assert buffer_peak(_program("buf0 = empty_strided_cpu((2, 3), (1, 4), torch.float32)", "return (buf0, )")) == 40


@pytest.mark.parametrize("line", [
    "buf0 = torch.ops.aten.nonzero.default(a)",  # a fallback kernel's own result: not sized here
    "buf0 = empty_strided_cpu((s0, 8), (8, 1), torch.float32)",  # a symbolic size
])
def test_the_reader_says_unknown_rather_than_guess(line):
    assert buffer_peak(_program(line, "return (buf0, )")) is None
    assert buffer_peak(None) is None and buffer_peak("def f():\n    pass") is None


@needs_compiler
def test_a_compiled_region_counts_the_copy_of_an_operand_a_gemm_cannot_take():
    def fn(a, b):
        return (torch.matmul(a, b) * 0.35,)

    out_bytes = 4 * 4 * 64 * 128 * 4
    b = torch.randn(4, 4, 128, 128)
    plain = tc.InductorRegion(fn, dynamo=None)
    plain(torch.randn(4, 4, 64, 128), b)
    assert plain.buffer_peak() == out_bytes  # the scaling is written over the GEMM's result
    # heads taken from a (batch, seq, heads, dim) layout and transposed: bmm needs a copy of a
    odd = tc.InductorRegion(fn, dynamo=None)
    odd(torch.randn(4, 128, 4, 64).permute(0, 2, 3, 1), b)
    assert odd.buffer_peak() == 2 * out_bytes


@needs_compiler
def test_compare_models_a_torchcompile_step_by_its_regions_programs():
    model = checkpointed_mlp(d=32, layers=2)
    x = torch.randn(64, 32)
    jm = thunder.jit(model, executors=["torchcompile"], transforms=[MemFuse(strict=True)])
    jm(x).sum().backward()
    c = compare(jm, x)
    assert set(c.traces) == {"forward", "backward"}
    for kind, t in c.traces.items():
        regions = sum(1 for r in t.steps if r["op"].startswith("MemFuse"))
        assert t.model == "plan" and regions > 0 and t.buffer_plans == regions, (kind, c.summary())
        # what Inductor allocates is counted; what a library GEMM allocates inside (a copy of a
        # transposed operand) is not, and stays below one tensor
        assert not t.flagged and t.within_one_tensor, c.table(all_steps=True)
        assert all(abs(r["diff"]) < t.largest_tensor for r in t.steps), c.table(all_steps=True)
        # report() gives the same figure, in its own terms (from the trace's start)
        rep = tm.report(jm)[kind]
        assert rep["compiled_peak_bytes"] == t.simulated_peak + t.start_simulated
        assert f"{rep['compiled_peak_bytes'] / 2**20:.2f} MiB with the buffers" in tm.format_report(jm)
    model.zero_grad(set_to_none=True)


def test_regions_that_inductor_did_not_compile_have_no_compiled_peak():
    model = checkpointed_mlp(d=16, layers=1)
    x = torch.randn(8, 16)
    jm = thunder.jit(model, transforms=[MemFuse(strict=True)])  # no compiled regions on a CPU
    jm(x).sum().backward()
    rep = tm.report(jm)
    assert all(r["compiled_peak_bytes"] is None for r in rep.values())
    assert compare(jm, x)["backward"].model == "plan"
    model.zero_grad(set_to_none=True)


def test_without_memfuse_compare_reads_the_trace_from_outside():
    jf = thunder.jit(lambda x: (x.sin() * 2).cos())
    x = torch.randn(64, requires_grad=True)
    c = compare(jf, x)
    assert {t.model for t in c.traces.values()} == {"trace"}
    assert all(t.buffer_plans == 0 for t in c.traces.values())
