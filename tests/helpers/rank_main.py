"""Entry point of one test rank: ``python -m tests.helpers.rank_main module:fn kwargs_json out``."""
from __future__ import annotations

import faulthandler
import importlib
import json
import signal
import sys
import time
import traceback

#: the runner sends this before killing a rank that outlived its timeout: every thread's stack
#: goes to the rank's log (SIGUSR1 is the library's flight-recorder dump)
STACKS_SIGNAL = signal.SIGUSR2
#: "1": the rank leaves through the interpreter's normal exit (for tests of what runs at exit)
EXIT_NORMALLY_ENV = "TC_RANK_EXIT_NORMALLY"


def run_target(target: str, kwargs_json: str, out_path: str) -> int:
    """Run ``module:fn(**kwargs)`` and write its value or exception as JSON to ``out_path``;
    returns the exit code the rank should leave with."""
    faulthandler.register(STACKS_SIGNAL, all_threads=True)
    module, _, fn_name = target.partition(":")
    t0 = time.monotonic()
    payload: dict = {}
    code = 0
    try:
        fn = getattr(importlib.import_module(module), fn_name)
        payload["value"] = fn(**json.loads(kwargs_json))
    except BaseException as e:  # noqa: BLE001 - report everything to the parent
        payload["error"] = {"type": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__],
                            "message": str(e), "traceback": traceback.format_exc()}
        code = 1
    payload["elapsed"] = time.monotonic() - t0
    with open(out_path + ".tmp", "w") as f:
        json.dump(payload, f)
    import os

    os.replace(out_path + ".tmp", out_path)
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def main() -> int:
    target, kwargs_json, out_path = sys.argv[1:4]
    code = run_target(target, kwargs_json, out_path)
    import os

    if os.environ.get(EXIT_NORMALLY_ENV) == "1":
        return code  # the interpreter's own exit: atexit handlers, thread joins, teardown
    os._exit(code)  # skip interpreter teardown: engines of broken comms may still be blocked


if __name__ == "__main__":
    sys.exit(main())
