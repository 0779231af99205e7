"""An abandoned gloo engine never takes its process down when a peer dies later.

Three real processes share a gloo engine. Rank 1 stops itself (SIGSTOP), so the op that
ranks 0 and 2 start on that engine stays pending. The survivors build a new engine over
themselves, abandon the old one (``GlooBackend.abort``), run an op on the new one and exit.
The test SIGKILLs rank 1 only while both survivors are inside interpreter finalization:
before the fix, the old engine's pending op then failed on a gloo thread that needed the GIL
to run the op's Python callback, and the survivor aborted (``terminate called after throwing
an instance of 'gloo::IoException'``).

Run as a script, this file is one rank of that job.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

from tests.helpers.paths import REPO, child_pythonpath
STOPPED = 1


def _wait_for(paths: list[Path], procs: list[subprocess.Popen], deadline: float) -> None:
    while not all(p.exists() for p in paths):
        exited = {i: p.returncode for i, p in enumerate(procs) if p.poll() is not None}
        if exited:
            logs = {i: procs[i].stdout.read().decode(errors="replace")[-3000:] for i in exited}  # type: ignore[union-attr]
            raise AssertionError(f"a rank exited early: {exited}\n{logs}")
        assert time.monotonic() < deadline, f"ranks never wrote {[str(p) for p in paths if not p.exists()]}"
        time.sleep(0.05)


def test_abandoned_engine_survives_a_peer_dying_at_interpreter_exit(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=child_pythonpath())
    procs = [
        subprocess.Popen([sys.executable, __file__, str(rank), str(tmp_path)], cwd=REPO, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for rank in range(3)
    ]
    survivors = [r for r in range(3) if r != STOPPED]
    try:
        _wait_for([tmp_path / f"finalizing{r}" for r in survivors], procs, time.monotonic() + 240)
        os.kill(procs[STOPPED].pid, signal.SIGKILL)
        (tmp_path / "killed").touch()
        codes = {r: procs[r].wait(120) for r in survivors}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    logs = {r: procs[r].stdout.read().decode(errors="replace") for r in survivors}  # type: ignore[union-attr]
    assert codes == {r: 0 for r in survivors}, f"survivor exit codes {codes}\n{logs}"
    for r in survivors:
        res = json.loads((tmp_path / f"result{r}.json").read_text())
        # abort() failed the pending op at once and delivered its error before returning
        assert res["delivered_before_abort_returned"], res
        assert res["error_kind"] == "peer", res
        # the new engine is untouched by the old one's teardown
        assert res["new_sum"] == 3.0, res


# ---------------------------------------------------------------------------- one rank


class _ExitProbe:
    """Lives in ``__main__``; its finalizer runs during interpreter finalization, where it
    tells the test, then keeps the interpreter finalizing until the stopped peer was killed.

    Everything the finalizer calls is bound when the probe is made: by the time ``__main__``'s
    globals are cleared, other modules' dicts may already be, and a finalizer that looked up
    ``Path.touch`` or ``time.sleep`` then could fail, be ignored, and let the rank exit 0
    without ever telling the test. Its failure is written to stderr so the test can show it."""

    def __init__(self, out: Path, rank: int) -> None:
        self._finalizing = str(out / f"finalizing{rank}")
        self._killed = str(out / "killed")
        self._open, self._close, self._access, self._write = os.open, os.close, os.access, os.write
        self._sleep, self._monotonic = time.sleep, time.monotonic
        self._create = os.O_CREAT | os.O_WRONLY

    def __del__(self) -> None:
        try:
            self._close(self._open(self._finalizing, self._create, 0o644))
            while not self._access(self._killed, 0):
                self._sleep(0.02)
            self._sleep(2.0)  # the old engine's connection to the dead peer resets meanwhile
        except BaseException as e:  # noqa: BLE001 - a finalizer's exception would be ignored
            self._write(2, f"exit probe failed: {e!r}\n".encode())
            raise


def _rank_main(rank: int, out: Path) -> int:
    import torch
    import torch.distributed as dist

    from torchcomms.backends.base import BackendContext
    from torchcomms.backends.gloo import GlooBackend
    from torchcomms.core.types import ReduceOp

    store = dist.FileStore(str(out / "store"), 3)

    def engine(prefix: str, rank: int, size: int) -> GlooBackend:
        ctx = BackendContext(name="abandon", rank=rank, size=size, device=torch.device("cpu"), store=store,
                             store_prefix=prefix, timeout=timedelta(seconds=120),
                             hints={"gloo.hostname": "127.0.0.1"})
        backend = GlooBackend(ctx)
        backend.init()
        return backend

    old = engine("e0", rank, 3)
    if rank == STOPPED:
        os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(3600)
    delivered: list[BaseException | None] = []
    out_buf, in_buf = torch.empty(3 * 256), torch.full((256,), float(rank))
    old.all_gather_single(out_buf, in_buf).on_done(delivered.append)  # pending: rank 1 is stopped
    new_rank = 0 if rank == 0 else 1
    new = old.split(BackendContext(name="abandon", rank=new_rank, size=2, device=torch.device("cpu"),
                                   store=store, store_prefix="e1", timeout=timedelta(seconds=120),
                                   hints={"gloo.hostname": "127.0.0.1"}))
    recorded = len(old._sockets.fds)  # what abort() can shut down: shown if the assertion fails
    t0 = time.monotonic()
    old.abort()
    result = {"delivered_before_abort_returned": bool(delivered) and delivered[0] is not None,
              "connections_recorded": recorded, "abort_s": round(time.monotonic() - t0, 3),
              "delivered_at_all": None}
    result["error_kind"] = old.classify_error(delivered[0]) if delivered and delivered[0] is not None else None
    t = torch.tensor([float(new_rank + 1)])
    done: list[BaseException | None] = []
    new.all_reduce(t, ReduceOp.SUM).on_done(done.append)
    while not done:
        time.sleep(0.01)
    result["new_sum"] = t.item() if done[0] is None else repr(done[0])
    result["delivered_at_all"] = repr(delivered[0]) if delivered else None
    (out / f"result{rank}.json").write_text(json.dumps(result))
    new.finalize()
    globals()["_probe"] = _ExitProbe(out, rank)
    return 0


if __name__ == "__main__":
    sys.exit(_rank_main(int(sys.argv[1]), Path(sys.argv[2])))
