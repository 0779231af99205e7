"""Triton's CPU interpreter (``TRITON_INTERPRET=1``) with numpy 2.4 or later.

Triton 3.6's interpreter turns a one-element block into a Python int with ``int(array)``, which
numpy 2.4 refuses for arrays of one or more dimensions ("only 0-dimensional arrays can be
converted to Python scalars"): every kernel of this package then fails under the interpreter.
:func:`apply` gives the interpreter's tensors an ``__index__`` that reads the one element
instead; it changes nothing where the interpreter is off, numpy is older, or Triton's
interpreter has no such hook.
"""
from __future__ import annotations

import os
from typing import Any

_APPLIED = "_kernels_index_of_one_element"


def apply() -> bool:
    """Install the fix when the interpreter is on and needs it; whether it is installed now."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return False
    try:
        import numpy as np
        import triton.runtime.interpreter as interp
    except ImportError:
        return False
    if np.lib.NumpyVersion(np.__version__) < "2.4.0":
        return False
    original = getattr(interp, "_patch_lang_tensor", None)
    if original is None:
        return False
    if getattr(original, _APPLIED, False):
        return True

    def patch_lang_tensor(tensor: Any, scope: Any) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

    setattr(patch_lang_tensor, _APPLIED, True)
    interp._patch_lang_tensor = patch_lang_tensor
    return True
