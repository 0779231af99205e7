"""The error hierarchy's public module (``torchcomms.errors.CommError``); defined in
:mod:`torchcomms.core.errors`."""
from torchcomms.core.errors import *  # noqa: F401,F403
from torchcomms.core.errors import __all__, format_ranks  # noqa: F401
