"""Engines behind ``TorchComm``: one module per engine, plus the registry."""
