"""``python -m launcher`` is ``torchcomms-run``."""

import sys

from .cli import main

sys.exit(main())
