"""Loaded at interpreter start-up in jobs launched by ``driftwatch run``.

Installs the Keras autolog hook, then hands over to whatever ``sitecustomize`` the job
would have loaded without driftwatch, so the job's own start-up is unchanged.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _chain_to_next_sitecustomize() -> None:
    """Run the job's own ``sitecustomize``, if any, and leave it in ``sys.modules``.

    This module is still being imported: its ``sys.modules`` entry must stay until the
    import machinery has finished with it, so the next one is loaded by hand.
    """
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", sys.path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module  # what ``import sitecustomize`` gives afterwards
    spec.loader.exec_module(module)


try:
    from driftwatch.hook.autolog import install
except ImportError as err:  # a Python without driftwatch installed: run the job as it is
    print(f"driftwatch: hook not installed in this interpreter: {err}", file=sys.stderr)
else:
    install()
_chain_to_next_sitecustomize()
