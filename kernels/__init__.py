"""Fused training kernels: linear + cross-entropy loss, FlexAttention masks, a small Llama model.

Never imports torchcomms. Names resolve lazily so that one kernel's import cost (Triton,
torch.compile) is paid only by code that uses it.
"""
from __future__ import annotations

import importlib
from typing import Any

from . import interpreter_compat

interpreter_compat.apply()  # before any kernel runs under TRITON_INTERPRET=1 (imports Triton only then)

_EXPORTS: dict[str, str] = {
    "linear_cross_entropy": "kernels.lce",
    "LinearCrossEntropyLoss": "kernels.lce",
    "attention": "kernels.attention",
    "masks": "kernels.attention.masks",
    "LlamaConfig": "kernels.model",
    "Llama": "kernels.model",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kernels' has no attribute {name!r}")
    mod = importlib.import_module(module)
    value = mod if module.endswith("." + name) else getattr(mod, name)
    globals()[name] = value
    return value
