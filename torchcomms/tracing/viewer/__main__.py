"""``python -m torchcomms.tracing.viewer`` runs ``torchcomms-trace``."""
from torchcomms.tracing.viewer.cli import main

main()
