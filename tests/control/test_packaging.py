"""Import rules and the standalone server entry point."""

from __future__ import annotations

import signal
import subprocess
import sys

from torchcomms.control.client import ControlClient
from torchcomms.control.secrets import new_secret, write_secret_file

from .conftest import python_env, stop_process

NO_TORCH = """
import sys
import torchcomms.control
import torchcomms.control.client, torchcomms.control.server, torchcomms.control.protocol
import torchcomms.control.auth, torchcomms.control.events, torchcomms.control.secrets
import torchcomms.control.errors, torchcomms.control.__main__
from torchcomms.control import ControlClient, StoreServer, derive_keys
assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch.'))[:5]
print('ok')
"""


def test_control_never_imports_torch() -> None:
    out = subprocess.run([sys.executable, "-c", NO_TORCH], env=python_env(),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_python_dash_m_serves_until_sigterm(tmp_path) -> None:
    secret = new_secret()
    path = write_secret_file(tmp_path / "secret", secret)
    proc = subprocess.Popen([sys.executable, "-m", "torchcomms.control", "--host", "127.0.0.1",
                             "--port", "0", "--secret-file", str(path)],
                            env=python_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None
        address = proc.stdout.readline().strip()
        assert address.startswith("tcp://127.0.0.1:")
        with ControlClient(address, secret, timeout=10) as c:
            c.set("standalone", b"yes")
            assert c.get("standalone") == b"yes"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        stop_process(proc)


def test_python_dash_m_without_secret_fails_clearly(tmp_path) -> None:
    env = {k: v for k, v in python_env().items() if not k.startswith("TORCHCOMM_CONTROL")}
    out = subprocess.run([sys.executable, "-m", "torchcomms.control"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "no job secret" in out.stderr


def test_lazy_exports() -> None:
    import torchcomms.control as control
    assert control.ControlClient is ControlClient
    assert "StoreServer" in dir(control)
    try:
        control.Nope  # noqa: B018
    except AttributeError as exc:
        assert "Nope" in str(exc)
    else:
        raise AssertionError("missing attribute did not raise")




def test_python_dash_m_can_draw_the_secret(tmp_path) -> None:
    from torchcomms.control.secrets import load_secret
    path = tmp_path / "new-secret"
    proc = subprocess.Popen([sys.executable, "-m", "torchcomms.control",
                             "--new-secret-file", str(path)],
                            env=python_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        address = proc.stdout.readline().strip()
        secret = load_secret({"TORCHCOMM_CONTROL_SECRET_FILE": str(path)})
        assert secret is not None
        with ControlClient(address, secret, timeout=10) as c:
            assert c.hello()["version"] == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        stop_process(proc)
