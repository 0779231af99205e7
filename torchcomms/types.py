"""The value types' public module (``torchcomms.types.ReduceOp``); defined in
:mod:`torchcomms.core.types`."""
from torchcomms.core.types import *  # noqa: F401,F403
from torchcomms.core.types import __all__  # noqa: F401
