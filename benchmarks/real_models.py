"""Real Hugging Face and LitGPT architectures, one training step each, with and without memfuse (CPU).

    python benchmarks/real_models.py [--only gpt2,llama|sweep] [--modes thunder,memfuse] [--configs plain,ckpt]
                                     [--seq 64] [--batch 2] [--compare]

Models are built from configs (no weights): transformers GPT2LMHeadModel, LlamaForCausalLM,
MistralForCausalLM, Qwen2ForCausalLM, FalconForCausalLM (loss computed inside the model from labels), an encoder
(BertModel with a token head) and a vision transformer (ViTModel on 32x32 images of 4x4 patches, 64
patches whatever --seq, with a class-token head; loss in a wrapper), gpt2 with dropout on
(random ops), and litgpt.GPT for a Pythia-style and a Llama-3-style Config (loss in a wrapper module,
so it is inside the jitted function).  `--only sweep` runs the architectures of benchmarks/hf_architectures.py
instead (thirteen more decoders, two encoders, five vision models; any of them can be named alone).  Sizes: --layers (2) x --hidden (128), 4 heads, vocab 1000, fp32;
positions up to max(128, --seq).

Configs: plain, ckpt (activation checkpointing: HF gradient_checkpointing_enable(use_reentrant=False);
litgpt: torch.utils.checkpoint around each block).
Modes: eager; compile = torch.compile(m); compile-amb0.5 = the same with
torch._functorch.config.activation_memory_budget = 0.5; thunder = thunder.jit(m); memfuse = thunder.jit(m,
transforms=[memfuse]);
tc = thunder.jit(m, executors=["torchcompile"]); tc+memfuse = the same with transforms=[memfuse];
tc+memfuse-min = the same with MemFuse(memory_budget=1): no plan fits, so each trace gets the lowest plan
memfuse finds and the forward saves fewer activations where that plans lower (its "no plan fits"
warning is expected and not counted).

Each row runs in a process of its own (--same-process: all in this one, quicker, but a later row's
peak can then see what earlier rows left behind).
Per row: status (ok / MemFuseWarning / exception / mismatch), max |grad diff| relative to the grad's
max (and loss diff) against Thunder with the same executors (thunder for eager, memfuse;
tc for tc+memfuse; dropout rows compare under one seed), the measured peak of the second step
(torch.profiler allocations above what is live at the call) and, for memfuse rows, the peak of the
same jit without memfuse beside it, and the bytes of the parameters' gradients (the step returns them, so
no mode's peak can be below them).  Skips cleanly without transformers / litgpt.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
import traceback
import warnings

import hf_architectures
import torch
import torch.nn.functional as F

MIB = float(1 << 20)
SIZE = {"layers": 2, "hidden": 128, "positions": 128}  # main() sets them from --layers, --hidden, --seq
MODES = ("eager", "compile", "compile-amb0.5", "thunder", "memfuse", "tc", "tc+memfuse")
BASE = {"compile": "eager", "compile-amb0.5": "eager", "thunder": "eager", "memfuse": "thunder", "tc": "eager",
        "tc+memfuse": "tc", "tc+memfuse-min": "tc"}
RTOL = {"compile": 1e-3, "compile-amb0.5": 1e-3, "thunder": 1e-4, "memfuse": 1e-5, "tc": 1e-3, "tc+memfuse": 1e-3,
        "tc+memfuse-min": 1e-3}
OVER_BUDGET = "MemFuse(memory_budget="  # tc+memfuse-min's expected warning


# ---------------------------------------------------------------- models
def _hf(kind, ckpt, vocab, dropout=False):
    import transformers as T
    common = dict(vocab_size=vocab, use_cache=False, tie_word_embeddings=False)
    if kind in ("bert", "vit"):
        return _encoder(kind, ckpt, vocab)
    if kind == "gpt2":
        p = 0.1 if dropout else 0.0
        cfg = T.GPT2Config(n_layer=SIZE["layers"], n_embd=SIZE["hidden"], n_head=4, n_positions=SIZE["positions"],
                           resid_pdrop=p, embd_pdrop=p,
                           attn_pdrop=p, **common)
        m = T.GPT2LMHeadModel(cfg)
    elif kind == "falcon":  # multi-query attention (one key/value head), attention and MLP in parallel
        m = T.FalconForCausalLM(T.FalconConfig(hidden_size=SIZE["hidden"], num_hidden_layers=SIZE["layers"],
                                               num_attention_heads=4, max_position_embeddings=SIZE["positions"],
                                               **common))
    else:
        cls = {"llama": (T.LlamaConfig, T.LlamaForCausalLM), "mistral": (T.MistralConfig, T.MistralForCausalLM),
               "qwen2": (T.Qwen2Config, T.Qwen2ForCausalLM)}[kind]
        cfg = cls[0](hidden_size=SIZE["hidden"], intermediate_size=2 * SIZE["hidden"], num_hidden_layers=SIZE["layers"],
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SIZE["positions"], **common)
        m = cls[1](cfg)
    m.train()  # HF checkpointing only runs in training mode; dropout is 0 unless asked for
    if ckpt:
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    class HFStep(torch.nn.Module):  # loss inside the jitted function (HF's own loss from labels)
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, idx, tgt):
            return self.m(input_ids=idx, labels=tgt).loss

    return HFStep(m)


def _encoder(kind, ckpt, vocab):
    """An encoder (BertModel: bidirectional attention, a masked-LM-style head over every token) or a
    vision transformer (ViTModel: 4x4 patches of a 32x32 image and a class token, 10 classes), the
    head and the loss in the wrapper: thunder.jit cannot trace their HF task heads here (Thunder's
    interpreter fails on the attribute writes they make in forward)."""
    import transformers as T
    common = dict(hidden_size=SIZE["hidden"], num_hidden_layers=SIZE["layers"], num_attention_heads=4,
                  intermediate_size=4 * SIZE["hidden"],
                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    if kind == "bert":
        m, classes = T.BertModel(T.BertConfig(max_position_embeddings=SIZE["positions"], vocab_size=vocab, **common),
                                 add_pooling_layer=False), vocab
    else:
        m, classes = T.ViTModel(T.ViTConfig(image_size=32, patch_size=4, **common), add_pooling_layer=False), 10
    m.train()
    if ckpt:
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    class EncoderStep(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m, self.head = m, torch.nn.Linear(SIZE["hidden"], classes)

        def forward(self, x, tgt):
            if kind == "vit":
                h = self.m(pixel_values=x).last_hidden_state[:, 0]  # the class token
            else:
                h = self.m(input_ids=x).last_hidden_state
            logits = self.head(h)
            return F.cross_entropy(logits.reshape(-1, classes), tgt.reshape(-1))

    return EncoderStep(m)


class _Ckpt(torch.nn.Module):
    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, *args):
        return torch.utils.checkpoint.checkpoint(self.block, *args, use_reentrant=False)


def _litgpt(name, ckpt, vocab, **over):
    from litgpt import GPT, Config
    cfg = Config.from_name(name, n_layer=SIZE["layers"], n_embd=SIZE["hidden"], n_head=4, padded_vocab_size=vocab,
                           vocab_size=vocab, block_size=SIZE["positions"], **over)
    m = GPT(cfg)
    if ckpt:
        m.transformer.h = torch.nn.ModuleList(_Ckpt(b) for b in m.transformer.h)

    class LitStep(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, idx, tgt):
            logits = self.m(idx)
            return F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1))

    return LitStep(m)


MODELS = {
    "bert": ("transformers", lambda c, v: _hf("bert", c, v)),
    "vit": ("transformers", lambda c, v: _hf("vit", c, v)),
    "gpt2": ("transformers", lambda c, v: _hf("gpt2", c, v)),
    "gpt2-dropout": ("transformers", lambda c, v: _hf("gpt2", c, v, dropout=True)),
    "llama": ("transformers", lambda c, v: _hf("llama", c, v)),
    "mistral": ("transformers", lambda c, v: _hf("mistral", c, v)),
    "qwen2": ("transformers", lambda c, v: _hf("qwen2", c, v)),
    "falcon": ("transformers", lambda c, v: _hf("falcon", c, v)),
    "litgpt-pythia": ("litgpt", lambda c, v: _litgpt("pythia-14m", c, v)),
    "litgpt-llama3": ("litgpt", lambda c, v: _litgpt("Llama-3.2-1B", c, v, n_query_groups=2,
                                                      intermediate_size=2 * SIZE["hidden"])),
}
CORE = tuple(MODELS)  # --only's default
SWEEP = hf_architectures.register(MODELS, SIZE)
IMAGES = ("vit",) + hf_architectures.VISION  # 32x32 images in, one label per image


# ---------------------------------------------------------------- running
_SDPA_MASK = []


def _hf_executors():
    """transformers >= 4.55 builds its causal mask with vmap, which thunder.jit cannot trace: Thunder's
    HF recipe (thunder.recipes.hf_transformers.SDPAMaskTransform) brings an executor whose lookaside
    runs it as one opaque op.  [] for other versions."""
    import transformers
    from looseversion import LooseVersion
    if LooseVersion(transformers.__version__) < LooseVersion("4.55"):
        return []
    if not _SDPA_MASK:
        from thunder.recipes.hf_transformers import SDPAMaskTransform
        _SDPA_MASK.append(SDPAMaskTransform().get_executor())
    return _SDPA_MASK[:]


def _jit(model, mode, pkg):
    if mode == "eager":
        return model
    if mode.startswith("compile"):  # its activation budget is set around the run (run_one)
        torch._dynamo.reset()
        return torch.compile(model)
    import thunder
    from thunder_memfuse import MemFuse, memfuse
    extra = _hf_executors() if pkg == "transformers" else []
    kw = {"executors": extra + (["torchcompile"] if mode.startswith("tc") else list(thunder.get_default_executors()))}
    if mode.endswith("memfuse"):
        kw["transforms"] = [memfuse]
    elif mode == "tc+memfuse-min":
        kw["transforms"] = [MemFuse(memory_budget=1)]
    return thunder.jit(model, **kw)


class _LogCatcher(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.msgs = []

    def emit(self, rec):
        self.msgs.append(rec.getMessage())


def run_one(name, ckpt, mode, batch, seq, vocab, do_compare=False):
    """{status, loss, grads, peak, first_s, warnings, logs, error}: one compile + two measured-free steps."""
    from thunder_memfuse import MemFuseWarning
    from thunder_memfuse.measure import cpu_peak_bytes
    torch.manual_seed(0)
    try:
        model = MODELS[name][1](ckpt, vocab)
    except Exception as e:  # noqa: BLE001 - a model this config cannot build (ConvNeXt has no checkpointing)
        return {"warnings": [], "logs": [], "error": f"building the model: {type(e).__name__}: {e}"[:300], "peak": None,
                "loss": None, "grads": None, "cmp": None}
    g = torch.Generator().manual_seed(1)
    if name in IMAGES:  # their configs' 32x32 images (ViT: 64 patches whatever --seq says), one label per image
        idx = torch.randn(batch, 3, 32, 32, generator=g)
        tgt = torch.randint(0, 10, (batch,), generator=g)
    else:
        idx = torch.randint(0, vocab, (batch, seq), generator=g)
        tgt = torch.randint(0, vocab, (batch, seq), generator=g)
    params = [p for p in model.parameters() if p.requires_grad]
    res = {"warnings": [], "logs": [], "error": None, "peak": None, "loss": None, "grads": None, "cmp": None,
           # the parameters' gradients, which every step holds at its end: no peer's peak is below them
           "grad_mib": sum(p.numel() * p.element_size() for p in params) / MIB}
    log = _LogCatcher()
    logging.getLogger("thunder_memfuse").addHandler(log)

    def step():
        for p in params:
            p.grad = None
        torch.manual_seed(1234)  # the same dropout masks where the RNG is drawn in the same order
        loss = jm(idx, tgt)
        loss.backward()
        return loss.detach()

    import contextlib
    from torch._functorch import config as functorch_config
    amb = float(mode[len("compile-amb"):]) if mode.startswith("compile-amb") else None
    try:
        with warnings.catch_warnings(record=True) as ws, (
                functorch_config.patch(activation_memory_budget=amb) if amb is not None else contextlib.nullcontext()):
            warnings.simplefilter("always")
            t0 = time.perf_counter()
            jm = _jit(model, mode, MODELS[name][0])
            step()
            res["first_s"] = time.perf_counter() - t0
            peak, loss = cpu_peak_bytes(step)
            res.update(peak=peak, loss=loss.item(),  # a parameter the loss does not reach has no gradient
                       grads=[p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params])
            if do_compare and mode.endswith("memfuse"):
                from thunder_memfuse.measure import compare
                for p in params:
                    p.grad = None
                res["cmp"] = compare(jm, idx, tgt).summary()
        res["warnings"] = [f"{w.category.__name__}: {w.message}" for w in ws if issubclass(w.category, MemFuseWarning)
                           and not (mode == "tc+memfuse-min" and str(w.message).startswith(OVER_BUDGET))]
    except Exception as e:  # noqa: BLE001 - a row per failure
        res["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        res["tb"] = traceback.format_exc()
    finally:
        logging.getLogger("thunder_memfuse").removeHandler(log)
    res["logs"] = [m for m in log.msgs if not (mode == "tc+memfuse-min" and m.startswith(OVER_BUDGET))]
    return res


def _diff(a, b):
    """(loss rel diff, max over params of max|ga-gb| / max|gb|).  A gradient that is zero in exact
    arithmetic (an attention key's bias: softmax does not see it) is rounding noise in both, so each
    parameter's scale is at least 1e-3 of the largest gradient of the model."""
    if a["grads"] is None or b is None or b["grads"] is None:
        return None, None
    ld = abs(a["loss"] - b["loss"]) / max(abs(b["loss"]), 1e-12)
    floor = max(max(y.abs().max().item() for y in b["grads"]) * 1e-3, 1e-12)
    gd = max(((x - y).abs().max() / y.abs().max().clamp_min(floor)).item() for x, y in zip(a["grads"], b["grads"]))
    return ld, gd


def _in_process_of_its_own(argv):
    """run_one's stand-in that runs each row in a fresh process (this script with --one, own_process.py), so
    no row's peak or first call depends on what ran before it in the same interpreter.  The row's
    tensors (its gradients) go through a file the child saves; its emitted result names it."""
    import os
    import tempfile

    import own_process

    def run(name, ckpt, mode, batch, seq, vocab, do_compare=False):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "row.pt")
            r, why = own_process.run(__file__, [*argv, "--one", name, "ckpt" if ckpt else "plain", mode, out])
            if r is not None:
                return torch.load(r["saved"], weights_only=False)
        return {"warnings": [], "logs": [], "error": f"row process failed: {why}", "peak": None, "loss": None,
                "grads": None, "cmp": None}

    return run


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(CORE), help="models, comma-separated; 'sweep' for hf_architectures.py's")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--configs", default="plain,ckpt")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=1000)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=128, help="hidden width (4 heads; MLPs 2x or 4x it)")
    ap.add_argument("--compare", action="store_true", help="also print measure.compare() for memfuse rows")
    ap.add_argument("--traceback", action="store_true")
    ap.add_argument("--same-process", action="store_true",
                    help="run every row in this process (quicker; later rows' peaks can see earlier rows' state)")
    ap.add_argument("--one", nargs=4, metavar=("MODEL", "CONFIG", "MODE", "OUT"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    SIZE.update(layers=a.layers, hidden=a.hidden, positions=max(128, a.seq))
    if a.one:
        n, cfg, mode, out = a.one
        torch.save(run_one(n, cfg == "ckpt", mode, a.batch, a.seq, a.vocab, a.compare), out)
        import own_process

        own_process.emit({"saved": out})
        return 0
    run = run_one if a.same_process else _in_process_of_its_own(argv if argv is not None else sys.argv[1:])
    modes = a.modes.split(",")
    for m in modes:  # a memfuse row needs its baseline
        for need in (BASE.get(m),):
            if need and need not in modes:
                modes.insert(modes.index(m), need)
    names = []
    for n in [m for x in a.only.split(",") for m in (SWEEP if x == "sweep" else (x,))]:
        pkg = MODELS[n][0]
        try:
            __import__(pkg)
        except Exception as e:  # noqa: BLE001
            print(f"skip {n}: {pkg} not importable ({type(e).__name__}: {e})")
            continue
        names.append(n)
    if not names:
        print("nothing to run: install transformers and/or litgpt")
        return 0
    import thunder
    vers = [f"torch {torch.__version__}", f"thunder {thunder.__version__}"]
    for pkg in ("transformers", "litgpt"):
        try:
            from importlib.metadata import version
            vers.append(f"{pkg} {version(pkg)}")
        except Exception:  # noqa: BLE001
            pass
    print(", ".join(vers), f"| {a.layers} layers x {a.hidden}, batch {a.batch}, seq {a.seq}, vocab {a.vocab}, fp32 CPU")
    hdr = f"{'model':14} {'config':5} {'mode':11} {'status':10} {'loss d':>8} {'grad d':>8} {'peak MiB':>9} {'w/o MiB':>8} {'grads MiB':>9} {'first s':>7}"
    print(hdr + "\n" + "-" * len(hdr), flush=True)
    failures, rows = [], []
    for n in names:
        for cfg in a.configs.split(","):
            got = {}
            for mode in modes:
                r = got[mode] = run(n, cfg == "ckpt", mode, a.batch, a.seq, a.vocab, a.compare)
                base = got.get(BASE.get(mode))
                if base is not None and base["grads"] is None:  # baseline failed: against eager instead
                    base = got.get("eager")
                ld, gd = _diff(r, base)
                status = "ok"
                if r["error"]:
                    status = "EXC"
                elif r["warnings"]:
                    status = "MFWARN"
                elif gd is not None and (gd > RTOL[mode] or ld > RTOL[mode]) and n != "gpt2-dropout":
                    status = "MISMATCH"
                elif gd is not None and (gd > RTOL[mode] or ld > RTOL[mode]):
                    status = "rng-diff"
                without = got.get(BASE.get(mode)) if "memfuse" in mode else None
                wo = without["peak"] / MIB if without and without["peak"] is not None else None
                pk = r["peak"] / MIB if r["peak"] is not None else None
                above = pk is not None and wo is not None and pk > wo * 1.001
                f = lambda v, s: "-" if v is None else format(v, s)  # noqa: E731
                print(f"{n:14} {cfg:5} {mode:11} {status + ('↑' if above else ''):10} {f(ld, '8.1e'):>8} {f(gd, '8.1e'):>8} "
                      f"{f(pk, '9.2f'):>9} {f(wo, '8.2f'):>8} {f(r.get('grad_mib'), '9.2f'):>9} {f(r.get('first_s'), '7.1f'):>7}", flush=True)
                rows.append((n, cfg, mode, status, ld, gd, pk, wo))
                if status not in ("ok", "rng-diff") or r["logs"]:
                    failures.append((n, cfg, mode, status, r, ld, gd))
                if r["cmp"]:
                    print("    compare: " + r["cmp"].replace("\n", "\n    "))
    if failures:
        print("\nfailures / warnings:")
        for n, cfg, mode, status, r, ld, gd in failures:
            print(f"- {n} {cfg} {mode}: {status}")
            for w in r["warnings"]:
                print(f"    warning: {w}")
            for m in r["logs"]:
                print(f"    log: {m}")
            if r["error"]:
                print(f"    error: {r['error']}")
                if a.traceback:
                    print("    " + r.get("tb", "").replace("\n", "\n    "))
            if status == "MISMATCH":
                print(f"    loss rel diff {ld:.2e}, grad rel diff {gd:.2e} (tolerance {RTOL[mode]:g})")
    up = [r for r in rows if r[6] is not None and r[7] is not None and r[6] > r[7] * 1.001]
    print(f"\nmemfuse above the same jit without it: {len(up)} of "
          f"{sum(1 for r in rows if r[2].endswith('memfuse'))} rows" + ("" if not up else ": " + ", ".join(
              f"{r[0]}/{r[1]}/{r[2]} {r[6]:.2f} vs {r[7]:.2f} MiB" for r in up)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
