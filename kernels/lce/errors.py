"""Typed errors raised by the linear + cross-entropy loss."""
from __future__ import annotations


class LinearCrossEntropyError(Exception):
    """Base class of every error this package raises on purpose."""


class LCEValueError(LinearCrossEntropyError, ValueError):
    """An argument has the right type but an invalid value or shape."""


class LCETypeError(LinearCrossEntropyError, TypeError):
    """An argument has the wrong type or dtype."""


class LCEDeviceError(LCEValueError):
    """Tensors live on different devices, or on one an implementation cannot use."""


class UnsupportedFeatureError(LinearCrossEntropyError, NotImplementedError):
    """The implementation that was asked for cannot compute what was asked of it."""


class BackwardTwiceError(LinearCrossEntropyError, RuntimeError):
    """A scalar-reduced loss was backpropagated a second time (its gradients were consumed)."""
