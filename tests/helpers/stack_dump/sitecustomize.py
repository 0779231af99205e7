"""Imported at start-up by every Python process of a test job whose ``PYTHONPATH`` begins with
this folder: with ``TC_STACKS_DIR`` set, ``SIGUSR2`` writes every thread's stack to
``$TC_STACKS_DIR/<pid>.txt``, so that a job the test has to kill shows where each process
was waiting (``tests/helpers/launcher_job.py``)."""
import faulthandler
import os
import signal

_stacks_dir = os.environ.get("TC_STACKS_DIR")
if _stacks_dir:
    try:
        _stacks_file = open(os.path.join(_stacks_dir, f"{os.getpid()}.txt"), "w")  # noqa: SIM115 - open for life
        faulthandler.register(signal.SIGUSR2, file=_stacks_file, all_threads=True)
    except OSError:
        pass
