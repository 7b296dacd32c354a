"""gpufrag's Python start-up hook (the entry point): `gpufrag run` puts this file's directory first
on PYTHONPATH, so every Python process it traces imports it at start-up; it starts the hook (the
_gpufrag package beside it, whose __init__ says what it does), then imports the sitecustomize the
program had, if any. Any error of the hook is swallowed: the traced program comes first."""

import os
import sys


def _gpufrag_chain():
    """Imports the sitecustomize this one shadows, if there is one."""
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    for p in sys.path:
        if not p or os.path.abspath(p) == here:
            continue
        cand = os.path.join(p, "sitecustomize.py")
        if os.path.isfile(cand):
            spec = importlib.util.spec_from_file_location("_gpufrag_next_sitecustomize", cand)
            if spec and spec.loader:
                mod = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(mod)
            return


try:
    import _gpufrag

    _gpufrag.start()
except Exception:
    pass
_gpufrag_chain()
