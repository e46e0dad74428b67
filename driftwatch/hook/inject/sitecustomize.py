"""Loaded at interpreter start-up in jobs launched by ``driftwatch run``.

Installs the Keras autolog hook, then hands over to whatever ``sitecustomize`` the job
would have loaded without driftwatch, so the job's own start-up is unchanged.
"""

import importlib.util
import os
import sys


def _chain_to_next_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    del sys.modules["sitecustomize"]
    if importlib.util.find_spec("sitecustomize") is not None:
        import sitecustomize  # type: ignore[import-not-found]  # noqa: F401 - the job's own


try:
    from driftwatch.hook.autolog import install
except ImportError as err:  # a Python without driftwatch installed: run the job as it is
    print(f"driftwatch: hook not installed in this interpreter: {err}", file=sys.stderr)
else:
    install()
_chain_to_next_sitecustomize()
