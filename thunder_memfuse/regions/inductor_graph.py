"""A region's ATen graph compiled by Inductor's compile_fx_inner as torch.compile would hand it over
(regions/torchcompile.py builds the graph and calls compile_region): inside a tracing context, after the
joint-graph passes, with the inputs that die with the region as donated buffers."""
from __future__ import annotations


def compile_region(gm, args, donated=()):
    """NOTE [Inductor's graph cache]: Inductor keeps every compiled graph in its on-disk FX graph
    cache, keyed by the graph and its inputs, so that a later process (the next run of the same
    training script) skips lowering and code generation.  It looks a graph up only inside a tracing
    context whose fake mode has a shape environment (guards on symbolic sizes are part of an
    entry); called bare, compile_fx_inner bypasses the cache and every region of every run was
    generated anew, where torch.compile (through Dynamo and AOTAutograd) hits it.  So the graph is
    compiled as AOTAutograd hands it over: inside a TracingContext with make_fx's fake mode, on
    fake copies of the inputs."""
    from torch._guards import TracingContext, detect_fake_mode, tracing
    from torch._inductor.compile_fx import compile_fx_inner

    fake_mode = detect_fake_mode([n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"])
    if fake_mode is None or fake_mode.shape_env is None:
        return compile_fx_inner(gm, list(args))
    context = TracingContext(fake_mode)
    donation = _donation(context, donated)
    with tracing(context):
        with fake_mode:  # the passes trace their replacements on the graph's fake values
            gm = _inference_passes(gm, args)
        with donation:
            return compile_fx_inner(gm, [fake_mode.from_tensor(a) for a in args], is_backward=bool(donated))


def _donation(context, donated):
    """NOTE [donated inputs in Inductor]: Inductor writes over an input only in a backward graph whose
    tracing context lists it among the backward's donated buffers (AOTAutograd's saved activations
    that die in the backward), and its FX graph cache does not key on that list: the region is
    compiled as such a backward, with the list, and the cache's key tag says which inputs were
    donated, so no program that writes over its inputs is served where none may be written over,
    nor the reverse.  Without the tag (an Inductor that has none), nothing is donated."""
    import contextlib
    import types

    if not donated:
        return contextlib.nullcontext()
    import torch.compiler.config as cconfig

    if not hasattr(cconfig, "cache_key_tag") or not hasattr(cconfig, "patch"):
        return contextlib.nullcontext()
    context.fw_metadata = types.SimpleNamespace(bw_donated_idxs=list(donated), static_input_indices=[])
    tag = f"{cconfig.cache_key_tag}|thunder_memfuse donated {','.join(map(str, donated))}"
    return cconfig.patch(cache_key_tag=tag)


def joint_graph_passes():
    try:
        from torch._inductor.compile_fx import _recursive_joint_graph_passes
    except ImportError:  # an Inductor without them: its graphs go as they are
        return None
    return _recursive_joint_graph_passes


def _inference_passes(gm, args):
    """NOTE [Inductor's inference passes]: torch.compile hands Inductor an inference graph (grad mode
    off, as a region's) only after its joint-graph passes (compile_fx's forward path: no-op removal,
    uniform-value constant folding, pattern rewrites); compile_fx_inner does not run them.  Without
    them a region's program is not the one torch.compile would generate: a cross-entropy backward's
    [nll_loss_backward, log_softmax_backward] held two logits-sized buffers, where torch.compile's holds
    one (the scatter of a scalar into zeros rewritten into a pointwise select).  So they run here, as
    Inductor's own forward path calls them."""
    import inspect

    import torch

    passes = joint_graph_passes()
    if passes is None:
        return gm
    kw = {}
    if "input_device" in inspect.signature(passes).parameters:
        kw["input_device"] = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
    return passes(gm, **kw)
