"""What torchcomms adds to ``import torch.distributed`` (c10d's import-time probe).

    python3 benchmarks/import_bench.py                 # 9 rounds
    python3 benchmarks/import_bench.py --rounds 15 --json out.json

``torch.distributed.distributed_c10d`` (torch 2.13) imports ``torchcomms._comms._BackendWrapper``,
``torchcomms.new_comm`` and ``torchcomms.hooks.FlightRecorderHook`` while it is itself imported,
and ``import torch`` imports ``torch.distributed``: so whatever that probe loads, every
``import torch`` on a machine with torchcomms installed pays. Each round runs fresh interpreters,
alternating the order:

- ``probe``: torch imported with torchcomms hidden (``sys.modules['torchcomms'] = None``), then
  the probe's three imports timed alone (wall and CPU time) -- the figure that matters;
- ``import torch.distributed`` whole, with torchcomms hidden (the anchor) and visible.

The probe figure is measured inside one process, so machine load inflates it far less than the
whole-import figures (which include reading torch itself from disk). Reports medians.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

_PROBE = """
import sys, time
sys.modules['torchcomms'] = None
import torch.distributed
del sys.modules['torchcomms']
w, c = time.perf_counter(), time.process_time()
from torchcomms._comms import _BackendWrapper
from torchcomms import new_comm
from torchcomms.hooks import FlightRecorderHook
print(time.perf_counter() - w, time.process_time() - c,
      sum(m == 'torchcomms' or m.startswith('torchcomms.') for m in sys.modules))
"""

_WHOLE = """
import sys, time
{hide}
w, c = time.perf_counter(), time.process_time()
import torch.distributed
print(time.perf_counter() - w, time.process_time() - c)
"""

CASES = {
    "probe": _PROBE,
    "import (torchcomms hidden)": _WHOLE.format(hide="sys.modules['torchcomms'] = None"),
    "import (torchcomms visible)": _WHOLE.format(hide=""),
}


def _run(code: str) -> list[float]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1]).stdout
    return [float(x) for x in out.split()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--json", type=str, default=None)
    args = p.parse_args()
    samples: dict[str, list[list[float]]] = {k: [] for k in CASES}
    for r in range(args.rounds):
        order = list(CASES) if r % 2 == 0 else list(reversed(CASES))
        for k in order:
            samples[k].append(_run(CASES[k]))
    result = {}
    for k, rows in samples.items():
        cols = list(zip(*rows))
        result[k] = {"wall_s": statistics.median(cols[0]), "cpu_s": statistics.median(cols[1])}
        if len(cols) > 2:
            result[k]["torchcomms_modules"] = int(statistics.median(cols[2]))
    for k, v in result.items():
        extra = f"  ({v['torchcomms_modules']} torchcomms modules loaded)" if "torchcomms_modules" in v else ""
        print(f"{k:30s} wall {v['wall_s'] * 1e3:8.1f} ms   cpu {v['cpu_s'] * 1e3:8.1f} ms{extra}")
    hidden, visible = result["import (torchcomms hidden)"], result["import (torchcomms visible)"]
    print(f"whole import, visible / hidden: wall {visible['wall_s'] / hidden['wall_s']:.3f}  "
          f"cpu {visible['cpu_s'] / hidden['cpu_s']:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
