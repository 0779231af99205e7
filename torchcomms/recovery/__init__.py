"""Recovery: shrink, reconfigure and split rebuild engines from one ``BackendContext`` factory
(``engines``); survivors agree through the store (``agreement``); the failure monitor routes
the control plane's failure events; the collective check catches mismatched calls."""
