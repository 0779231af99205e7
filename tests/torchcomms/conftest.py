"""The engine switch of the backend-neutral tests: a test that takes ``launch`` runs once per
engine (gloo, and mpi where mpi4py and mpiexec are installed), on real ranks of that engine."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.helpers.mpi_ranks import mpi_available, run_mpi_ranks
from tests.helpers.ranks import RankResult, run_ranks

ENGINES = ["gloo", "mpi"]

#: ``launch(n, target, kwargs=None, timeout=120.0)``: every rank's result (all succeeded)
Launch = Callable[..., list[RankResult]]


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    if request.param == "mpi" and not mpi_available():
        pytest.skip("mpi4py or mpiexec is not installed (bash scripts/setup.sh installs both)")
    return request.param


@pytest.fixture
def launch(engine: str) -> Launch:
    """Start ``n`` ranks of the engine under test running ``target`` (they read ``TC_BACKEND``)."""

    def run(n: int, target: str, kwargs: dict[str, Any] | None = None, timeout: float = 120.0) -> list[RankResult]:
        if engine == "mpi":
            return run_mpi_ranks(n, target, kwargs, timeout=timeout)
        return run_ranks(n, target, kwargs, timeout=timeout, env={"TC_BACKEND": engine})

    return run
