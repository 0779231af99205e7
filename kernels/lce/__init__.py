"""Fused linear + cross-entropy loss that never materialises the full logits.

``linear_cross_entropy`` (functional) and ``LinearCrossEntropyLoss`` (a drop-in for
``torch.nn.LinearCrossEntropyLoss``) route between three implementations: ``reference``
(plain PyTorch on full logits), ``chunked`` (any device) and ``triton`` (CUDA). Targets are
class indices, or class probabilities (reference and chunked implementations).
"""
from __future__ import annotations

from .config import IMPLEMENTATIONS, REDUCTIONS, LossConfig
from .errors import (
    BackwardTwiceError,
    LCEDeviceError,
    LCETypeError,
    LCEValueError,
    LinearCrossEntropyError,
    UnsupportedFeatureError,
)
from .function import Route, linear_cross_entropy, select_implementation
from .module import LinearCrossEntropyLoss
from .reference import reference_linear_cross_entropy

__all__ = [
    "IMPLEMENTATIONS",
    "REDUCTIONS",
    "BackwardTwiceError",
    "LCEDeviceError",
    "LCETypeError",
    "LCEValueError",
    "LinearCrossEntropyError",
    "LinearCrossEntropyLoss",
    "LossConfig",
    "Route",
    "UnsupportedFeatureError",
    "linear_cross_entropy",
    "reference_linear_cross_entropy",
    "select_implementation",
]
