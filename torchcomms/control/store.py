"""``ControlStore``: the control-plane client as a ``torch.distributed.Store``.

Engines that rendezvous through a torch store (gloo, NCCL's id exchange, ``PrefixStore``)
use it unchanged. It is the only control module that imports torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from torchcomms.config import settings
from .client import ControlClient
from .errors import (
    ControlArgumentError,
    ControlArgumentTypeError,
    ControlError,
    ControlNoReplyError,
    ControlTimeoutError,
    ControlUnavailableError,
)
from .secrets import load_secret

__all__ = ["ControlStore", "ControlStoreTimeoutError", "ControlStoreUnavailableError",
           "ControlStoreNoReplyError",
           "ENV_CONTROL_ADDR", "DEFAULT_STORE_TIMEOUT"]

ENV_CONTROL_ADDR = "TORCHCOMM_CONTROL_ADDR"
DEFAULT_STORE_TIMEOUT = timedelta(seconds=300)


class ControlStoreTimeoutError(ControlTimeoutError, dist.DistStoreError):
    """A store wait timed out: both a control-plane and a torch ``DistStoreError``."""


class ControlStoreUnavailableError(ControlUnavailableError, dist.DistNetworkError):
    """The control server is unreachable: both a control-plane and a ``DistNetworkError``."""


class ControlStoreNoReplyError(ControlNoReplyError, ControlStoreUnavailableError):
    """The control server did not answer in time over a connection that stood (stopped, hung
    or starved): a :class:`ControlStoreUnavailableError` that a caller may retry."""


class ControlStoreQueueEmptyError(ControlTimeoutError, dist.QueueEmptyError):
    """``queue_pop`` found the queue empty (or it stayed empty until the timeout)."""


def _as_bytes(value: Any, name: str) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        if not all(0 <= v <= 255 for v in value):
            raise ControlArgumentError(f"{name} as a list of ints must hold bytes (0..255)")
        return bytes(value)
    raise ControlArgumentTypeError(f"{name} must be bytes or str, got {type(value).__name__}")


def _translate(exc: ControlError) -> ControlError:
    if isinstance(exc, ControlTimeoutError) and not isinstance(exc, dist.DistStoreError):
        return ControlStoreTimeoutError(str(exc), exc.keys)
    if isinstance(exc, ControlNoReplyError) and not isinstance(exc, dist.DistError):
        return ControlStoreNoReplyError(str(exc))
    if isinstance(exc, ControlUnavailableError) and not isinstance(exc, dist.DistError):
        return ControlStoreUnavailableError(str(exc))
    return exc


class ControlStore(dist.Store):
    """A ``torch.distributed.Store`` backed by the job's control-plane server.

    Wraps a :class:`~torchcomms.control.client.ControlClient` (shared, thread-safe). Waits
    (``get``, ``wait``, ``multi_get``, ``queue_pop``) honour the store's ``timeout``; a
    timeout raises :class:`ControlStoreTimeoutError`, which is a ``DistStoreError``.
    """

    def __init__(self, client: ControlClient, *, timeout: timedelta = DEFAULT_STORE_TIMEOUT,
                 owns_client: bool = False) -> None:
        super().__init__()
        if not isinstance(client, ControlClient):
            raise ControlArgumentTypeError(
                f"client must be a ControlClient, got {type(client).__name__}")
        if not isinstance(timeout, timedelta):
            raise ControlArgumentTypeError(
                f"timeout must be a timedelta, got {type(timeout).__name__}")
        self._client = client
        self._owns_client = owns_client
        self.set_timeout(timeout)

    @classmethod
    def connect(cls, addr: str, secret: bytes, *,
                timeout: timedelta = DEFAULT_STORE_TIMEOUT) -> ControlStore:
        """Open a client to ``addr`` and wrap it (the store owns and closes the client)."""
        client = ControlClient(addr, secret, timeout=max(timeout.total_seconds(), 1.0))
        return cls(client, timeout=timeout, owns_client=True)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *,
                 timeout: timedelta = DEFAULT_STORE_TIMEOUT) -> ControlStore | None:
        """The store the launcher advertises (``TORCHCOMM_CONTROL_ADDR`` + the job secret),
        or ``None`` when no control-plane address is set."""
        addr = settings(env).control_addr
        if not addr:
            return None
        secret = load_secret(env)
        assert secret is not None
        return cls.connect(addr, secret, timeout=timeout)

    @property
    def client(self) -> ControlClient:
        """The underlying control-plane client."""
        return self._client

    def close(self) -> None:
        """Close the client if this store owns it."""
        if self._owns_client:
            self._client.close()

    def _wait_s(self, timeout: timedelta | None = None) -> float:
        chosen = self.timeout if timeout is None else timeout
        return max(chosen.total_seconds(), 0.0)

    def _run(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except ControlError as exc:
            translated = _translate(exc)
            if translated is exc:
                raise
            raise translated from exc

    # -- the Store interface, as torch's Python-store trampoline calls it ------------------

    def set(self, key: str, value: bytes | str) -> None:
        self._run(self._client.set, key, _as_bytes(value, "value"))

    def get(self, key: str) -> bytes:
        return self._run(self._client.get, key, self._wait_s())

    def add(self, key: str, value: int) -> int:
        return self._run(self._client.add, key, value)

    def compare_set(self, key: str, expected_value: bytes | str,
                    desired_value: bytes | str) -> bytes:
        return self._run(self._client.compare_set, key, _as_bytes(expected_value, "expected"),
                         _as_bytes(desired_value, "desired"))

    def delete_key(self, key: str) -> bool:
        return self._run(self._client.delete, key)

    def num_keys(self) -> int:
        return self._run(self._client.num_keys)

    def check(self, keys: Sequence[str]) -> bool:
        return self._run(self._client.check, list(keys))

    def wait(self, keys: Sequence[str], timeout: timedelta | None = None) -> None:
        self._run(self._client.wait, list(keys), self._wait_s(timeout))

    def has_extended_api(self) -> bool:
        return True

    def append(self, key: str, value: bytes | str) -> None:
        self._run(self._client.append, key, _as_bytes(value, "value"))

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        return self._run(self._client.multi_get, list(keys), self._wait_s())

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes | str]) -> None:
        self._run(self._client.multi_set, list(keys),
                  [_as_bytes(v, f"values[{i}]") for i, v in enumerate(values)])

    def list_keys(self) -> list[str]:
        return self._run(self._client.keys, "")

    def queue_push(self, key: str, value: bytes | str) -> None:
        self._run(self._client.queue_push, key, _as_bytes(value, "value"))

    def queue_pop(self, key: str, block: bool = True) -> bytes:
        try:
            return self._client.queue_pop(key, block, self._wait_s())
        except ControlTimeoutError as exc:
            raise ControlStoreQueueEmptyError(str(exc), exc.keys) from exc
        except ControlError as exc:
            raise _translate(exc) from exc

    def queue_len(self, key: str) -> int:
        return self._run(self._client.queue_len, key)

    def clone(self) -> ControlStore:
        """A second handle on the same server (the client is shared and thread-safe)."""
        return ControlStore(self._client, timeout=self.timeout)

    def __repr__(self) -> str:
        return f"ControlStore({self._client.address!r}, timeout={self.timeout})"

    def __reduce__(self) -> Any:
        raise TypeError("ControlStore cannot be pickled (it holds live sockets): in the child "
                        "process use ControlStore.from_env() or ControlStore.connect(addr, secret)")
