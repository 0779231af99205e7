"""The MPI backend (mpi4py); ``new_comm("mpi", torch.device("cpu"), name)`` under ``mpiexec``."""
from torchcomms.backends.mpi.backend import MpiBackend

__all__ = ["MpiBackend"]
