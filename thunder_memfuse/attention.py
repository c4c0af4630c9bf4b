"""thunder_memfuse.attention: attention_summary(compile_data) (docs/API.md "Attention on CPU tensors").  A public
module of re-exports: the code is thunder_memfuse/integration/attention.py."""
from __future__ import annotations

from .integration.attention import attention_summary

__all__ = ["attention_summary"]
