"""What the installed torch offers that tests depend on (torch 2.13 on CI, 2.11 on the GPU machine;
docs/INTERNALS.md, "Torch versions")."""
from __future__ import annotations

import torch

#: torch's major and minor version (a pre-release of 2.13 counts as 2.13)
TORCH_MINOR = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
#: torch 2.13 or later: c10d's gloo has a list all-to-all, the torch.distributed route makes
#: subgroups by split and can run DDP
TORCH_2_13 = TORCH_MINOR >= (2, 13)
