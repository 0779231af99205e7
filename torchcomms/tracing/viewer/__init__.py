"""The offline viewer behind ``torchcomms-trace``: read per-rank flight-recorder dumps
(:mod:`.load`), align and check them (:mod:`.analyze`), export Perfetto JSON
(:mod:`.perfetto`) and render a self-contained HTML timeline (:mod:`.html_view`).

It depends on the dump format (:mod:`torchcomms.tracing.fr_format`) only, and nothing on the
library's import path loads it: a training process never imports the viewer.
"""
from __future__ import annotations

from torchcomms._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "TraceInputError": "torchcomms.tracing.viewer.load",
    "TraceSet": "torchcomms.tracing.viewer.load",
    "load_dumps": "torchcomms.tracing.viewer.load",
    "Report": "torchcomms.tracing.viewer.analyze",
    "analyze": "torchcomms.tracing.viewer.analyze",
    "to_perfetto": "torchcomms.tracing.viewer.perfetto",
    "render_html": "torchcomms.tracing.viewer.html_view",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports("torchcomms.tracing.viewer", _EXPORTS, globals())
