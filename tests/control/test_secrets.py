from __future__ import annotations

import os
import stat

import pytest
import zmq

from torchcomms.control.errors import ControlArgumentError, ControlArgumentTypeError, \
    ControlAuthError
from torchcomms.control.secrets import (
    ENV_SECRET,
    ENV_SECRET_FILE,
    derive_keys,
    load_secret,
    new_secret,
    parse_secret,
    write_secret_file,
)


def test_derived_keys_are_deterministic_and_distinct_per_role() -> None:
    secret = bytes(range(32))
    a, b = derive_keys(secret), derive_keys(secret)
    assert a == b
    assert a.server_public != a.client_public
    assert len(a.server_public) == 40 and len(a.client_secret) == 40
    # the public keys belong to the secret keys
    assert zmq.curve_public(a.server_secret) == a.server_public
    assert zmq.curve_public(a.client_secret) == a.client_public


def test_different_secrets_give_different_keys() -> None:
    assert derive_keys(new_secret()).client_public != derive_keys(new_secret()).client_public


def test_repr_hides_secret_keys() -> None:
    keys = derive_keys(new_secret())
    assert keys.server_secret.decode() not in repr(keys)
    assert keys.client_secret.decode() not in repr(keys)


def test_new_secret_is_32_random_bytes() -> None:
    a, b = new_secret(), new_secret()
    assert len(a) == 32 and a != b


def test_short_secret_rejected() -> None:
    with pytest.raises(ControlArgumentError, match="at least 16"):
        derive_keys(b"short")


def test_non_bytes_secret_rejected() -> None:
    with pytest.raises(ControlArgumentTypeError, match="must be bytes"):
        derive_keys("ab" * 32)  # type: ignore[arg-type]


def test_load_secret_file_wins_over_env(tmp_path) -> None:
    from_file, from_env = new_secret(), new_secret()
    path = write_secret_file(tmp_path / "secret", from_file)
    env = {ENV_SECRET_FILE: str(path), ENV_SECRET: from_env.hex()}
    assert load_secret(env) == from_file
    assert load_secret({ENV_SECRET: from_env.hex()}) == from_env


def test_secret_file_is_owner_only(tmp_path) -> None:
    path = write_secret_file(tmp_path / "secret", new_secret())
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert len(path.read_text().strip()) == 64


def test_load_secret_missing() -> None:
    with pytest.raises(ControlAuthError, match=ENV_SECRET_FILE):
        load_secret({})
    assert load_secret({}, required=False) is None


def test_load_secret_unreadable_file(tmp_path) -> None:
    with pytest.raises(ControlAuthError, match="cannot read"):
        load_secret({ENV_SECRET_FILE: str(tmp_path / "absent")})


def test_parse_secret_rejects_bad_hex_and_short() -> None:
    with pytest.raises(ControlAuthError, match="not valid hex"):
        parse_secret("zz" * 32)
    with pytest.raises(ControlAuthError, match="at least 16"):
        parse_secret("abcd")
    assert parse_secret("  " + "ab" * 16 + "\n") == bytes([0xAB]) * 16


def test_secret_file_replaces_a_link_at_its_path_instead_of_writing_through_it(tmp_path) -> None:
    precious = tmp_path / "precious"
    precious.write_text("keep me\n")
    precious.chmod(0o644)
    (tmp_path / "via-symlink").symlink_to(precious)
    os.link(precious, tmp_path / "via-hardlink")
    for name in ("via-symlink", "via-hardlink"):
        secret = new_secret()
        path = write_secret_file(tmp_path / name, secret)
        assert not path.is_symlink() and os.stat(path).st_ino != os.stat(precious).st_ino
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert path.read_text() == secret.hex() + "\n"
    assert precious.read_text() == "keep me\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precious", "via-hardlink", "via-symlink"]


def test_a_secret_file_open_to_other_users_is_used_with_a_warning(tmp_path, caplog) -> None:
    import logging

    secret = new_secret()
    path = write_secret_file(tmp_path / "secret", secret)
    with caplog.at_level(logging.WARNING, logger="torchcomms.control.secrets"):
        assert load_secret({ENV_SECRET_FILE: str(path)}) == secret
        assert not caplog.records  # 0600: nothing to say
        path.chmod(0o644)
        assert load_secret({ENV_SECRET_FILE: str(path)}) == secret
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and str(path) in lines[0] and "mode 0644" in lines[0] and "chmod 600" in lines[0]
    assert secret.hex() not in lines[0]


def test_a_secret_file_of_megabytes_is_refused_unread(tmp_path) -> None:
    from torchcomms.control.errors import ControlAuthError

    path = tmp_path / "secret"
    path.write_text("ab" * (1 << 20))  # valid hex: a 1 MiB "secret"
    path.chmod(0o600)
    with pytest.raises(ControlAuthError, match=r"holds more than 65536 bytes: not a hex secret"):
        load_secret({ENV_SECRET_FILE: str(path)})
