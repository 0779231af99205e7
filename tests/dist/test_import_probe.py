"""torch's import-time probe of torchcomms (``import torch.distributed`` imports
``torchcomms._comms._BackendWrapper``, ``torchcomms.new_comm``, ``torchcomms.hooks``) succeeds
and loads neither the communicator core nor the C++ extension; the stand-in ``_BackendWrapper``
behaves as the C++ class once that is loaded."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers.paths import REPO, child_pythonpath

#: the modules torch's probe may load: the package roots and the light faces the probe names
PROBE_MODULES = {
    "torchcomms", "torchcomms._lazy", "torchcomms._comms", "torchcomms.csrc", "torchcomms.csrc.build",
    "torchcomms.setup", "torchcomms.setup.create", "torchcomms.core", "torchcomms.core.errors",
    "torchcomms.hooks", "torchcomms.guards", "torchcomms.guards.nan_check", "torchcomms.tracing",
    "torchcomms.tracing.fr_hook",
}

_PROBE = """
import json, sys
import torch.distributed
from torch.distributed import distributed_c10d as c10d
from torchcomms._comms import _BackendWrapper
print(json.dumps({
    "available": c10d._TORCHCOMM_AVAILABLE,
    "modules": sorted(m for m in sys.modules if m == "torchcomms" or m.startswith("torchcomms.")),
    "extension": sorted(m for m in sys.modules if m.startswith("torchcomms_c10d")),
    "isinstance_object": isinstance(object(), _BackendWrapper),
    "extension_after_isinstance": sorted(m for m in sys.modules if m.startswith("torchcomms_c10d")),
}))
"""


def _run(code: str, **env: str) -> dict:
    full = dict(os.environ, PYTHONPATH=child_pythonpath(), **env)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, cwd=REPO,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_probe_loads_only_the_light_faces(tmp_path: Path) -> None:
    # an empty extension cache: the probe must neither build nor need a build
    v = _run(_PROBE, TORCHCOMMS_EXTENSIONS_DIR=str(tmp_path))
    assert v["available"] is True
    assert set(v["modules"]) <= PROBE_MODULES, sorted(set(v["modules"]) - PROBE_MODULES)
    assert v["extension"] == [] and v["extension_after_isinstance"] == []
    assert v["isinstance_object"] is False
    assert list(tmp_path.iterdir()) == []


def test_torch_2_11s_probe_finds_new_comm_beside_the_wrapper(tmp_path: Path) -> None:
    # torch 2.11 imports both names from torchcomms._comms; without new_comm there its probe
    # failed, and the route stayed off on the GPU machine with TORCH_DISTRIBUTED_USE_TORCHCOMMS=1
    v = _run(_PROBE.replace("from torchcomms._comms import _BackendWrapper",
                            "from torchcomms._comms import _BackendWrapper, new_comm\n"
                            "import torchcomms\nassert new_comm is torchcomms.new_comm"),
             TORCHCOMMS_EXTENSIONS_DIR=str(tmp_path))
    assert set(v["modules"]) <= PROBE_MODULES, sorted(set(v["modules"]) - PROBE_MODULES)
    assert v["extension"] == []


def test_probe_with_the_route_requested_loads_nothing_either(tmp_path: Path) -> None:
    v = _run(_PROBE, TORCHCOMMS_EXTENSIONS_DIR=str(tmp_path), TORCH_DISTRIBUTED_USE_TORCHCOMMS="1")
    assert v["available"] is True
    assert set(v["modules"]) <= PROBE_MODULES, sorted(set(v["modules"]) - PROBE_MODULES)
    assert v["extension"] == []


_STAND_IN = """
import json, sys
import torch
import torchcomms
from torchcomms._comms import _BackendWrapper
from torchcomms.csrc import build
comm = torchcomms.new_comm("fake", "cpu", "stand-in", hints={"rank": "0", "size": "1"})
before = build.wrapper_class(loaded_only=True)
backend = _BackendWrapper(comm)
real = build.wrapper_class(loaded_only=True)
print(json.dumps({
    "before": before is not None,
    "type": type(backend).__name__,
    "is_real": type(backend) is real,
    "is_backend": isinstance(backend, torch._C._distributed_c10d.Backend),
    "isinstance": isinstance(backend, _BackendWrapper),
    "subclass": issubclass(real, _BackendWrapper),
    "other": isinstance(torch.ones(1), _BackendWrapper),
    "same_comm": backend.get_comm() is comm,
    "class_attr": _BackendWrapper.get_comm is real.get_comm,
}))
comm.finalize()
"""


def test_stand_in_constructs_and_recognises_the_cpp_class() -> None:
    v = _run(_STAND_IN)
    assert v == {"before": False, "type": "_BackendWrapper", "is_real": True, "is_backend": True,
                 "isinstance": True, "subclass": True, "other": False, "same_comm": True, "class_attr": True}
