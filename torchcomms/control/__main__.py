"""``python -m torchcomms.control``: run a control-plane server until SIGTERM/SIGINT.

Prints the address (``tcp://host:port``) on the first line of stdout, flushed, so that a
parent process can read it.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from .errors import ControlError
from .protocol import Limits
from .secrets import ENV_SECRET, ENV_SECRET_FILE, load_secret, new_secret, read_secret_file, \
    write_secret_file
from .server import DEFAULT_HEARTBEAT_LIMIT_S, StoreServer


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m torchcomms.control",
        description="Run a torchcomms control-plane store server until SIGTERM.")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to bind (default 0: any free)")
    parser.add_argument("--secret-file", help=f"file holding the hex job secret (else "
                                              f"${ENV_SECRET_FILE} / ${ENV_SECRET})")
    parser.add_argument("--new-secret-file", metavar="PATH",
                        help="draw a fresh secret and write it to PATH (mode 0600)")
    parser.add_argument("--heartbeat-limit", type=float, default=DEFAULT_HEARTBEAT_LIMIT_S,
                        help="seconds of heartbeat silence before a member is reported lost")
    parser.add_argument("--run-id", default=None, help="job id stamped into every event")
    parser.add_argument("--max-value-bytes", type=int, default=Limits().max_value_bytes,
                        help="largest value a client may store")
    parser.add_argument("--log-level", default="WARNING")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        if args.new_secret_file:
            secret = new_secret()
            write_secret_file(args.new_secret_file, secret)
        elif args.secret_file:
            secret = read_secret_file(args.secret_file, source="--secret-file")
        else:
            secret = load_secret()
        server = StoreServer(args.host, args.port, secret, heartbeat_limit=args.heartbeat_limit,
                             run_id=args.run_id,
                             limits=Limits(max_value_bytes=args.max_value_bytes))
        server.start()
    except (ControlError, OSError, ValueError) as exc:
        print(f"torchcomms.control: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    print(server.address, flush=True)
    try:
        while not stop.wait(1.0):
            pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
