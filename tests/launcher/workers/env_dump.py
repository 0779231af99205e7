"""Writes its environment as JSON to $OUT_DIR/<RANK>.json, with what the interpreter gave it:
its parent's pid (``_PPID``), argv, working directory, ``sys.path[0]``, ``__file__``, whether it
leads its process group, whether torch was imported before its first line (a forked worker),
and a first draw of Python's and numpy's global generators."""
import json
import os
import random
import sys
from pathlib import Path

import numpy

facts = {"_PPID": str(os.getppid()), "_ARGV": sys.argv, "_CWD": os.getcwd(), "_PATH0": sys.path[0], "_FILE": __file__,
         "_GROUP_LEADER": os.getpgid(0) == os.getpid(), "_TORCH_PRELOADED": "torch" in sys.modules,
         "_RANDOM": random.random(), "_NUMPY_RANDOM": float(numpy.random.random())}
Path(os.environ["OUT_DIR"], os.environ["RANK"] + ".json").write_text(json.dumps({**os.environ, **facts}))
