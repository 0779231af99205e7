"""``torchcomms-run`` / ``python -m launcher``: parse the command line and run the agent."""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Sequence

from torchcomms.control.errors import ControlError

from .args import check_entrypoint, parse_args
from .exceptions import LauncherError
from .output import Console, ConsoleLogHandler

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the launcher; returns (and, as a console script, exits with) the job's exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    json_lines = "--json-logs" in args or "--json_logs" in args
    console = Console(json_lines=json_lines, host=socket.gethostname())
    library_log = logging.getLogger("torchcomms")  # the control plane's modules log under it
    handler = ConsoleLogHandler(console)
    library_log.addHandler(handler)
    try:
        cfg = parse_args(args, os.environ)
        check_entrypoint(cfg, os.environ)
        from .agent import Agent  # imported after parsing so that --help stays instant

        return Agent(cfg, console).run()
    except LauncherError as exc:
        console.event(f"error: {exc}", error=type(exc).__name__)
        return exc.exit_code
    except ControlError as exc:
        console.event(f"error: control plane: {exc}", error=type(exc).__name__)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        library_log.removeHandler(handler)


if __name__ == "__main__":
    sys.exit(main())
