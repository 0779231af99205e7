"""The GPU tests' "never makes the host wait" check must tell a waiting call from one that
does not (its first version passed on a call that waited: the stream stayed busy with the
call's own later kernels)."""
from __future__ import annotations

import pytest
import torch

from tests.helpers.cuda import returns_while_the_gpu_is_busy

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _queue_work_after(wait: bool, pageable_copy: bool = False) -> None:
    a = torch.randn(2048, 2048, device="cuda")
    if wait:
        torch.cuda.current_stream().synchronize()
    if pageable_copy:
        a += torch.tensor(2.0, device="cuda")  # a blocking copy from pageable host memory
    for _ in range(20):  # later work that keeps the stream busy after any wait
        a = a @ a * 1e-3


def test_an_asynchronous_call_is_seen_as_not_waiting() -> None:
    assert returns_while_the_gpu_is_busy(lambda: _queue_work_after(wait=False))


def test_a_stream_synchronisation_is_seen_as_waiting() -> None:
    assert not returns_while_the_gpu_is_busy(lambda: _queue_work_after(wait=True))


def test_a_blocking_host_to_device_copy_is_seen_as_waiting() -> None:
    assert not returns_while_the_gpu_is_busy(lambda: _queue_work_after(wait=False, pageable_copy=True))
