"""Set-up: ``new_comm`` (``create``) and the discovery of rank, size, device and store
(``bootstrap``); the environment is read through :mod:`torchcomms.config`."""
