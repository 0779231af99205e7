"""The fork server's frames and requests (:mod:`launcher.fork_server`): what the agent and the
server accept from each other over their socket pair, in-process."""
from __future__ import annotations

import os
import socket
import struct

import pytest

from launcher.fork_server import MAX_FRAME, check_request, read_frame, write_frame


def _request(**change: object) -> dict[str, object]:
    return {"mode": "path", "target": "train.py", "args": ["--lr", "1"], "env": {"RANK": "0"}, "cwd": os.getcwd(),
            **change}


def test_a_frame_carries_one_json_object_and_its_descriptors():
    a, b = socket.socketpair()
    r, w = os.pipe()
    try:
        write_frame(a, _request(), [r, w, w])
        message, fds = read_frame(b, max_fds=3)
        assert message == _request() and len(fds) == 3
        os.write(fds[1], b"x")  # the write end that came over
        assert os.read(r, 1) == b"x"
        for fd in fds:
            os.close(fd)
        a.close()
        assert read_frame(b) is None  # the end of the stream
    finally:
        for fd in (r, w):
            os.close(fd)
        b.close()


@pytest.mark.parametrize("raw, why", [
    (b"[1, 2]", "not a JSON object"),
    (b"{not json", "Expecting property name"),
    (None, f"at most {MAX_FRAME}"),
])
def test_a_malformed_frame_is_a_value_error_never_a_crash(raw, why):
    a, b = socket.socketpair()
    with a, b:
        a.sendall(struct.pack(">I", MAX_FRAME + 1) if raw is None else struct.pack(">I", len(raw)) + raw)
        with pytest.raises(ValueError, match=why):
            read_frame(b)


@pytest.mark.parametrize("change, fds, why", [
    ({}, 2, "needs 3 descriptors"),
    ({"mode": "exec"}, 3, "mode must be one of path, module, run_path, got 'exec'"),
    ({"target": ""}, 3, "target must be a non-empty string"),
    ({"args": ["a", 1]}, 3, "args must be a list of strings"),
    ({"env": {"RANK": 0}}, 3, "env must map strings to strings"),
    ({"cwd": "/nonexistent/folder"}, 3, "cwd must be an existing folder, got '/nonexistent/folder'"),
    ({"env": {"RANK": "0\0"}}, 3, "must hold no NUL character"),
    ({"args": ["a\0b"]}, 3, "must hold no NUL character"),
])
def test_a_request_is_checked_field_by_field(change, fds, why):
    assert check_request(_request(), [0, 1, 2]) is None
    assert why in (check_request(_request(**change), list(range(fds))) or "")


def test_a_forked_process_handle_waits_by_pid_as_popen_does():
    """The agent's handle on a worker the server forked (here: a child of the test's own)."""
    from launcher.forks import ForkedProcess

    pid = os.fork()
    if pid == 0:
        os.kill(os.getpid(), 15)
        os._exit(0)
    proc = ForkedProcess(pid, None, None)
    assert proc.wait() == -15 and proc.poll() == -15 and proc.returncode == -15  # killed by SIGTERM
    pid = os.fork()
    if pid == 0:
        os._exit(3)
    assert ForkedProcess(pid, None, None).wait(timeout=30) == 3
