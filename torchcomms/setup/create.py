"""``new_comm``: a communicator's creation. Its arguments are checked here; the creation itself
(store, engine rendezvous, failure monitor, default tracing) is
:func:`torchcomms.setup.assemble.assemble_comm`, imported on the first call: torch imports
``torchcomms.new_comm`` on every ``import torch`` (its torchcomms probe), which must stay cheap."""
from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from torchcomms.core.errors import CommTypeError, CommValueError

if TYPE_CHECKING:
    import torch

    from torchcomms.core.comm import TorchComm


def new_comm(
    backend: str,
    device: torch.device | str,
    name: str,
    abort_process_on_timeout_or_error: bool | None = None,
    timeout: timedelta | None = None,
    is_high_priority_stream: bool | None = None,
    store: Any = None,
    enable_reconfigure: bool = False,
    hints: dict[str, str] | None = None,
) -> TorchComm:
    """Create a communicator over every rank of the job (rank/size from the environment).

    ``backend`` names a registered engine (``gloo``, ``nccl``, ``mpi``, ``fake``; see
    ``built_backends()``); ``name`` must be unique in the process. Rank and size come from
    ``TORCHCOMM_RANK``/``TORCHCOMM_SIZE``, else Open MPI's ``OMPI_COMM_WORLD_*``, ``PMI_*``,
    torchrun's ``RANK``/``WORLD_SIZE`` or Slurm's ``SLURM_PROCID``/``SLURM_NTASKS``
    (``TORCHCOMM_BOOTSTRAP_RANKSIZE_QUERY_METHOD`` forces one). The store: ``store``, else the
    launcher's control plane, else a TCPStore at ``MASTER_ADDR``/``MASTER_PORT``.
    ``timeout`` (default ``TORCHCOMM_TIMEOUT_SECONDS``) bounds the creation and is every op's
    default; ``is_high_priority_stream`` is the hint ``nccl.high_priority_stream``.
    """
    if not isinstance(backend, str) or not backend:
        raise CommTypeError(f"backend must be a non-empty str, got {backend!r}")
    if not isinstance(name, str) or not name:
        raise CommValueError(f"name must be a non-empty str, got {name!r}")
    if hints is not None and (
        not isinstance(hints, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in hints.items())
    ):
        raise CommTypeError(f"hints must be a dict[str, str], got {hints!r}")
    if timeout is not None and not isinstance(timeout, timedelta):
        raise CommTypeError(f"timeout must be a datetime.timedelta, got {type(timeout).__name__}")
    if timeout is not None and timeout.total_seconds() <= 0:
        raise CommValueError(f"timeout must be positive, got {timeout}")
    from torchcomms.setup.assemble import assemble_comm

    return assemble_comm(backend, device, name, abort_process_on_timeout_or_error, timeout,
                         is_high_priority_stream, store, enable_reconfigure, hints)
