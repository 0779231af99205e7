"""Per-job secret → deterministic CURVE key pairs for the control plane.

The launcher draws one random secret per job (:func:`new_secret`) and hands it to its workers
(a file named by ``TORCHCOMM_CONTROL_SECRET_FILE``, or ``TORCHCOMM_CONTROL_SECRET``). Server
and clients derive the same two CURVE key pairs from it (:func:`derive_keys`), so nothing
but the secret has to be distributed: the client knows the server's public key, and the
server admits only the client key derived from the same secret.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import zmq
from zmq.utils import z85

from torchcomms.config import settings
from .errors import ControlArgumentError, ControlArgumentTypeError, ControlAuthError

__all__ = [
    "CurveKeys",
    "SECRET_BYTES",
    "MIN_SECRET_BYTES",
    "new_secret",
    "derive_keys",
    "parse_secret",
    "load_secret",
    "read_secret_file",
    "write_secret_file",
    "ENV_SECRET",
    "ENV_SECRET_FILE",
]

SECRET_BYTES = 32
MIN_SECRET_BYTES = 16
#: a secret file is read up to this size (a 32-byte secret is 65 bytes of hex and a newline)
MAX_SECRET_FILE_BYTES = 64 * 1024
ENV_SECRET = "TORCHCOMM_CONTROL_SECRET"
ENV_SECRET_FILE = "TORCHCOMM_CONTROL_SECRET_FILE"

_log = logging.getLogger("torchcomms.control.secrets")

_SERVER_LABEL = b"torchcomms/control/curve/server/v1"
_CLIENT_LABEL = b"torchcomms/control/curve/client/v1"


@dataclass(frozen=True)
class CurveKeys:
    """The two CURVE key pairs of a job, Z85-encoded (40 ASCII bytes each)."""

    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes

    def __repr__(self) -> str:  # never print secret keys
        return (
            f"CurveKeys(server_public={self.server_public!r}, "
            f"client_public={self.client_public!r})"
        )


def new_secret() -> bytes:
    """Return a fresh random job secret (32 bytes)."""
    return os.urandom(SECRET_BYTES)


def _check_secret(secret: object) -> bytes:
    if not isinstance(secret, (bytes, bytearray, memoryview)):
        raise ControlArgumentTypeError(
            f"job secret must be bytes, got {type(secret).__name__} "
            "(use parse_secret() for a hex string)"
        )
    raw = bytes(secret)
    if len(raw) < MIN_SECRET_BYTES:
        raise ControlArgumentError(
            f"job secret is {len(raw)} bytes; at least {MIN_SECRET_BYTES} are required"
        )
    return raw


def _keypair(secret: bytes, label: bytes) -> tuple[bytes, bytes]:
    curve_secret = hmac.new(secret, label, hashlib.sha256).digest()
    secret_z85 = z85.encode(curve_secret)
    return zmq.curve_public(secret_z85), secret_z85


def derive_keys(secret: bytes) -> CurveKeys:
    """Derive the job's server and client CURVE key pairs from ``secret``.

    Each curve secret key is HMAC-SHA256(secret, label) with a distinct label per role.
    """
    raw = _check_secret(secret)
    server_public, server_secret = _keypair(raw, _SERVER_LABEL)
    client_public, client_secret = _keypair(raw, _CLIENT_LABEL)
    return CurveKeys(server_public, server_secret, client_public, client_secret)


def parse_secret(text: str | bytes, *, source: str = "secret") -> bytes:
    """Decode a hex-encoded secret (surrounding whitespace ignored)."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("ascii")
        except UnicodeDecodeError:
            raise ControlAuthError(f"{source} is not ASCII hex") from None
    if not isinstance(text, str):
        raise ControlArgumentTypeError(
            f"{source} must be a hex string, got {type(text).__name__}"
        )
    stripped = text.strip()
    try:
        raw = bytes.fromhex(stripped)
    except ValueError:
        raise ControlAuthError(f"{source} is not valid hex ({len(stripped)} characters)") from None
    if len(raw) < MIN_SECRET_BYTES:
        raise ControlAuthError(
            f"{source} decodes to {len(raw)} bytes; at least {MIN_SECRET_BYTES} are required"
        )
    return raw


def load_secret(env: Mapping[str, str] | None = None, *, required: bool = True) -> bytes | None:
    """Read the job secret from the environment.

    ``TORCHCOMM_CONTROL_SECRET_FILE`` (a file holding the hex secret) wins over
    ``TORCHCOMM_CONTROL_SECRET`` (the hex secret itself). Returns ``None`` when neither is
    set and ``required`` is false; raises :class:`ControlAuthError` otherwise.
    """
    conf = settings(env)
    path = conf.control_secret_file
    if path:
        return read_secret_file(path, source=ENV_SECRET_FILE)
    value = conf.control_secret
    if value:
        return parse_secret(value, source=ENV_SECRET)
    if required:
        raise ControlAuthError(
            f"no job secret: set {ENV_SECRET_FILE} (a file with the hex secret) or {ENV_SECRET}"
        )
    return None


def read_secret_file(path: str | os.PathLike[str], *, source: str = "secret file") -> bytes:
    """Read the hex secret in ``path`` (``source`` names where the path came from, for the
    errors). A file that other users may read or write is used, with a warning: whoever reads
    it can join the job's control plane."""
    try:
        with open(path, "rb") as fh:
            mode = os.fstat(fh.fileno()).st_mode
            data = fh.read(MAX_SECRET_FILE_BYTES + 1)
    except OSError as exc:
        raise ControlAuthError(f"cannot read the job secret file {str(path)!r} ({source}): {exc}") from exc
    if len(data) > MAX_SECRET_FILE_BYTES:
        raise ControlAuthError(f"job secret file {str(path)!r} ({source}) holds more than "
                               f"{MAX_SECRET_FILE_BYTES} bytes: not a hex secret")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        _log.warning("the job secret file %r (%s) is open to other users (mode %04o): whoever "
                     "reads it can join this job's control plane; make it readable by its owner "
                     "only (chmod 600)", str(path), source, stat.S_IMODE(mode))
    return parse_secret(data, source=f"job secret file {str(path)!r}")


def write_secret_file(path: str | os.PathLike[str], secret: bytes) -> Path:
    """Write ``secret`` as hex to ``path``, readable by the owner only (mode 0600).

    The file is made new (a 0600 temporary file beside it, renamed over ``path``): a symlink or
    a hard link already at ``path`` is replaced, never followed, so no other file is truncated
    or handed the secret."""
    raw = _check_secret(secret)
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, stat.S_IRUSR | stat.S_IWUSR)
        os.write(fd, raw.hex().encode("ascii") + b"\n")
        os.close(fd)
        fd = -1
        os.replace(tmp, target)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return target
