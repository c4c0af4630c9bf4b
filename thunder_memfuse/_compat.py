"""Alias of the top-level _thunder_memfuse_boot module (the torch/Thunder shims)."""
from _thunder_memfuse_boot import apply  # noqa: F401
