"""More Hugging Face architectures for benchmarks/real_models.py (its `--only sweep`): decoders, encoders and
vision models this project was not tuned for, built from configs (no weights) at real_models' --layers x
--hidden, 4 heads.

Decoders go through AutoModelForCausalLM with the loss computed inside from labels; those whose config takes
key/value heads get 2 (grouped-query attention).  Encoders get a token head and the loss in a wrapper, as
real_models' BERT; vision models a class head on the pooled output (or the first token) of 32x32 images, as
its ViT.  Swin and ConvNeXt have fixed small stage layouts of their own (their widths do not follow --hidden).

Architectures left out because Thunder itself does not run them as configured here, with or without memfuse:
OPT (a data-dependent branch in its attention mask), Mixtral (data-dependent expert routing), GPT-J and CodeGen
(their rotary code), ALBERT (no gradient checkpointing to compare), DistilBERT (fails under the torchcompile
executor).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

DECODERS = ("phi", "phi3", "gemma", "gemma2", "gpt_neox", "bloom", "stablelm", "olmo", "qwen3", "starcoder2",
            "granite", "cohere", "gpt_bigcode")
ENCODERS = ("roberta", "electra")
VISION = ("deit", "swin", "convnext", "clip_vision_model", "beit")
_NO_KV_HEADS = ("bloom", "gpt_neox", "gpt_bigcode", "phi")  # configs without num_key_value_heads


def _no_dropout(cfg):
    """Every dropout probability of the config set to 0 (GPTBigCode, Phi and others default to 0.1), so
    rows compare gradients, not random draws."""
    for k, v in cfg.to_dict().items():
        if isinstance(v, float) and ("dropout" in k or "pdrop" in k or k.endswith("drop_path_rate")):
            setattr(cfg, k, 0.0)
    return cfg


def _train(m, ckpt):
    m.train()  # HF checkpointing only runs in training mode
    if ckpt:
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return m


def decoder(kind, ckpt, vocab, size):
    import transformers as T
    h = size["hidden"]
    kw = dict(pad_token_id=0, vocab_size=vocab, use_cache=False, tie_word_embeddings=False, hidden_size=h,
              intermediate_size=2 * h, num_hidden_layers=size["layers"], num_attention_heads=4,
              max_position_embeddings=size["positions"])
    if kind not in _NO_KV_HEADS:
        kw["num_key_value_heads"] = 2
    if kind in ("gemma", "gemma2"):  # their default head_dim is fixed, not hidden / heads
        kw["head_dim"] = h // 4
    m = _train(T.AutoModelForCausalLM.from_config(_no_dropout(T.AutoConfig.for_model(kind, **kw))), ckpt)

    class DecoderStep(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, idx, tgt):
            return self.m(input_ids=idx, labels=tgt).loss

    return DecoderStep(m)


def encoder(kind, ckpt, vocab, size):
    import transformers as T
    h = size["hidden"]
    cfg = T.AutoConfig.for_model(kind, vocab_size=vocab, hidden_size=h, num_hidden_layers=size["layers"],
                                 num_attention_heads=4, intermediate_size=4 * h, hidden_dropout_prob=0.0,
                                 attention_probs_dropout_prob=0.0, embedding_size=h,
                                 max_position_embeddings=size["positions"] + 2)  # RoBERTa offsets by the pad id
    try:  # no pooler: the token head does not read it (its parameters would get no gradient)
        m = T.AutoModel.from_config(_no_dropout(cfg), add_pooling_layer=False)
    except TypeError:
        m = T.AutoModel.from_config(_no_dropout(cfg))
    m = _train(m, ckpt)

    class EncoderStep(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m, self.head = m, torch.nn.Linear(h, vocab)

        def forward(self, x, tgt):
            logits = self.head(self.m(input_ids=x).last_hidden_state)
            return F.cross_entropy(logits.reshape(-1, vocab), tgt.reshape(-1))

    return EncoderStep(m)


def vision(kind, ckpt, vocab, size, classes=10):
    import transformers as T
    h = size["hidden"]
    if kind == "swin":
        cfg = T.SwinConfig(image_size=32, patch_size=2, embed_dim=32, depths=[2, 2], num_heads=[2, 4], window_size=4,
                           hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, drop_path_rate=0.0)
    elif kind == "convnext":
        cfg = T.ConvNextConfig(image_size=32, num_stages=2, hidden_sizes=[32, 64], depths=[2, 2], num_channels=3,
                               drop_path_rate=0.0)
    elif kind == "clip_vision_model":
        cfg = T.CLIPVisionConfig(image_size=32, patch_size=4, hidden_size=h, intermediate_size=4 * h,
                                 num_hidden_layers=size["layers"], num_attention_heads=4)
    else:
        cfg = T.AutoConfig.for_model(kind, image_size=32, patch_size=4, hidden_size=h, num_hidden_layers=size["layers"],
                                     num_attention_heads=4, intermediate_size=4 * h, hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0)
    m = _train(T.AutoModel.from_config(_no_dropout(cfg)), ckpt)
    with torch.no_grad():  # the head's width is the pooled output's, whatever the model's layout
        o = m(pixel_values=torch.zeros(1, 3, 32, 32))
        pooled = o.pooler_output if getattr(o, "pooler_output", None) is not None else o.last_hidden_state[:, 0]
        width = pooled.reshape(1, -1).shape[1]

    class VisionStep(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m, self.head = m, torch.nn.Linear(width, classes)

        def forward(self, x, tgt):
            o = self.m(pixel_values=x)
            p = o.pooler_output if getattr(o, "pooler_output", None) is not None else o.last_hidden_state[:, 0]
            return F.cross_entropy(self.head(p.reshape(p.shape[0], -1)), tgt)

    return VisionStep(m)


def register(models, size):
    """Adds every architecture above to real_models' MODELS table, each building at `size` when called."""
    for k in DECODERS:
        models[k] = ("transformers", lambda c, v, k=k: decoder(k, c, v, size))
    for k in ENCODERS:
        models[k] = ("transformers", lambda c, v, k=k: encoder(k, c, v, size))
    for k in VISION:
        models[k] = ("transformers", lambda c, v, k=k: vision(k, c, v, size))
    return DECODERS + ENCODERS + VISION
