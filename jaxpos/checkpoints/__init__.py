"""Checkpoint import (Hugging Face BERT/ALBERT/DeBERTa-v2/ModernBERT: `huggingface`) and export (`export`: parameters
only, as an orbax checkpoint that `load_export` restores onto any mesh, or as a Hugging Face folder).

The names below come from `jaxpos.checkpoints.export` on first use, so that importing the package does not load
jax.
"""

from __future__ import annotations

_LAZY = ("export_run", "load_export", "read_export_config", "save_export", "save_huggingface")


def __getattr__(name: str):
    if name in _LAZY:
        from jaxpos.checkpoints import export as module  # lazy: it loads jax (~2 s); importing the package does not

        return getattr(module, name)
    raise AttributeError(f"module 'jaxpos.checkpoints' has no attribute {name!r}")

