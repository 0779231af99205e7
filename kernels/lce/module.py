"""``LinearCrossEntropyLoss``: a drop-in for ``torch.nn.LinearCrossEntropyLoss`` plus extras."""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from .config import IMPLEMENTATIONS, LossConfig, as_real
from .errors import LCETypeError, LCEValueError
from .function import linear_cross_entropy


class LinearCrossEntropyLoss(nn.Module):
    """Owns a ``Linear(in_features, num_classes * prod(out_features))`` and returns the
    cross-entropy of its output against the target, without materialising the logits.

    The constructor takes PyTorch 2.13's arguments in the same order (``options``, PyTorch's
    chunking knob, is accepted; its ``batch_chunk_size`` becomes ``chunk_size``) plus this
    package's extras: ``z_loss``, ``softcap``, ``return_z_loss``, ``chunk_size``,
    ``accum_dtype`` and ``implementation``. ``ignore_index=None`` means -100, as in PyTorch.
    For weight tying, assign the embedding's parameter: ``loss.linear.weight = emb.weight``.
    The loss comes back in float32 for bf16/fp16 inputs (PyTorch's module returns the input
    dtype); with ``return_z_loss=True`` the module returns ``(loss, z_loss)``.
    """

    def __init__(
        self,
        in_features: int,
        num_classes: int,
        *,
        out_features: tuple[int, ...] = (),
        bias: bool = False,
        device: Any = None,
        dtype: torch.dtype | None = None,
        reduction: str = "mean",
        weight: torch.Tensor | None = None,
        ignore_index: int | None = None,
        label_smoothing: float = 0.0,
        options: Any = None,
        z_loss: float = 0.0,
        softcap: float | None = None,
        return_z_loss: bool = False,
        chunk_size: int | None = None,
        accum_dtype: torch.dtype = torch.float32,
        implementation: str = "auto",
    ) -> None:
        super().__init__()
        if isinstance(in_features, bool) or not isinstance(in_features, int) or in_features < 1:
            raise LCEValueError(f"in_features must be a positive int, got {in_features!r}")
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise LCEValueError(f"num_classes must be a positive int, got {num_classes!r}")
        out_features = tuple(out_features)
        if any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in out_features):
            raise LCEValueError(f"out_features must be a tuple of positive ints, got {out_features!r}")
        if weight is not None and not isinstance(weight, torch.Tensor):
            raise LCETypeError(
                f"weight (the class weights) must be a torch.Tensor or None, got {type(weight).__name__}")
        if weight is not None and tuple(weight.shape) != (num_classes,):
            raise LCEValueError(f"expected weight shape to be {(num_classes,)}, got {tuple(weight.shape)}")
        if implementation not in IMPLEMENTATIONS:
            raise LCEValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
        ignore = -100 if ignore_index is None else ignore_index
        label_smoothing, z_loss = as_real("label_smoothing", label_smoothing), as_real("z_loss", z_loss)
        LossConfig(reduction, ignore, label_smoothing, z_loss, softcap)  # validates early
        if options is not None and chunk_size is None:
            chunk_size = getattr(options, "batch_chunk_size", None)
        if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int)
                                       or chunk_size < 1):
            raise LCEValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")
        if not isinstance(accum_dtype, torch.dtype):
            raise LCETypeError(f"accum_dtype must be a torch.dtype, got {type(accum_dtype).__name__}")
        self.num_classes = num_classes
        self.out_features = out_features
        self.reduction = reduction
        self.ignore_index = ignore
        self.label_smoothing = float(label_smoothing)
        self.z_loss = float(z_loss)
        self.softcap = softcap
        self.return_z_loss = return_z_loss
        self.chunk_size = chunk_size
        self.accum_dtype = accum_dtype
        self.implementation = implementation
        self.options = options
        self.register_buffer("weight", weight)
        self.linear = nn.Linear(in_features, math.prod(out_features, start=num_classes), bias=bias, device=device, dtype=dtype)

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Loss of ``input`` (``(N, in_features)`` or ``(..., in_features)``) against ``target``."""
        w = self.linear.weight
        b = self.linear.bias
        if self.out_features:
            w = w.reshape(self.num_classes, *self.out_features, self.linear.in_features)
            b = b.reshape(self.num_classes, *self.out_features) if b is not None else None
        return linear_cross_entropy(
            input,
            w,
            target,
            b,
            reduction=self.reduction,
            ignore_index=self.ignore_index,
            label_smoothing=self.label_smoothing,
            class_weight=self.weight,
            z_loss=self.z_loss,
            softcap=self.softcap,
            return_z_loss=self.return_z_loss,
            chunk_size=self.chunk_size,
            accum_dtype=self.accum_dtype,
            implementation=self.implementation,
        )

    def extra_repr(self) -> str:
        return (
            f"in_features={self.linear.in_features}, num_classes={self.num_classes}, "
            f"out_features={self.out_features}, bias={self.linear.bias is not None}, "
            f"reduction={self.reduction}, ignore_index={self.ignore_index}, "
            f"label_smoothing={self.label_smoothing}, z_loss={self.z_loss}, softcap={self.softcap}, "
            f"implementation={self.implementation}"
        )
