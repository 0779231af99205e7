"""Writes its environment (and its parent's pid, as ``_PPID``) as JSON to $OUT_DIR/<RANK>.json."""
import json
import os
from pathlib import Path

Path(os.environ["OUT_DIR"], os.environ["RANK"] + ".json").write_text(json.dumps({**os.environ, "_PPID": str(os.getppid())}))
