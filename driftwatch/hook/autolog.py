"""Zero-code injection: add ``DriftwatchCallback`` to every ``keras.Model.fit`` (and
``evaluate`` and ``predict``), and time the train step of custom training loops.

``driftwatch run`` puts ``driftwatch/hook/inject`` on the child's ``PYTHONPATH``; its
``sitecustomize`` calls ``install()``, which waits for the job to import Keras and TensorFlow
(meta-path finders, so a job that never uses them pays nothing) and then wraps ``Model.fit``,
as MLflow's autolog does, and lets ``custom_loop`` watch every ``tf.function`` call. A ``fit``
that already has a ``DriftwatchCallback`` is left alone.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import inspect
import logging
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from driftwatch.channel.env import DISABLE_ENV

log = logging.getLogger(__name__)

_PATCHED = "__driftwatch_patched__"


LOOPS = ("fit", "evaluate", "predict")
"""The ``keras.Model`` methods that run a loop of steps, each given a ``DriftwatchCallback``."""


def patch_loops(model_class: Any) -> None:
    """Wrap ``model_class.fit``, ``evaluate`` and ``predict`` so they always run with a
    ``DriftwatchCallback`` first."""
    for name in LOOPS:
        patch_loop(model_class, name)


def patch_loop(model_class: Any, name: str) -> None:
    """Wrap ``model_class``'s loop method ``name`` so it runs with a ``DriftwatchCallback``
    first (a loop called with Keras's own callback list, as fit calls evaluate for
    validation, keeps it: the callback is in it already)."""
    original = getattr(model_class, name)
    if getattr(original, _PATCHED, False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def loop(*args: Any, **kwargs: Any) -> Any:
        from driftwatch.hook import custom_loop
        from driftwatch.hook.keras import DriftwatchCallback

        bound = signature.bind(*args, **kwargs)
        given = bound.arguments.get("callbacks")
        if given is None or isinstance(given, list | tuple):
            callbacks = list(given or [])
            if not any(isinstance(c, DriftwatchCallback) for c in callbacks):
                # First: its batch-end then runs right after Keras syncs the step's results.
                callbacks.insert(0, DriftwatchCallback())
            bound.arguments["callbacks"] = callbacks
        # The callback times this loop: the custom-loop recognizer must not count it again.
        was_busy = custom_loop.fit_started()
        try:
            return original(*bound.args, **bound.kwargs)
        finally:
            custom_loop.fit_ended(was_busy)

    setattr(loop, _PATCHED, True)
    setattr(model_class, name, loop)


class _PatchAfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Lets module ``name`` import normally, then patches it; removes itself afterwards."""

    def __init__(self, name: str, patch: Callable[[ModuleType], None]) -> None:
        self._name = name
        self._patch = patch
        self._loader: importlib.abc.Loader | None = None

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self._name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        self._loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        assert self._loader is not None
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        assert self._loader is not None
        self._loader.exec_module(module)
        sys.meta_path.remove(self)
        _guarded(lambda: self._patch(module))


def _patch_keras(keras: ModuleType) -> None:
    patch_loops(keras.Model)


def _patch_tensorflow(tf: ModuleType) -> None:
    from driftwatch.hook import custom_loop

    custom_loop.install(tf)


def _guarded(action: Callable[[], None]) -> None:
    """Run ``action``; a failure disables driftwatch's hook, never the job."""
    try:
        action()
    except Exception as err:  # noqa: BLE001 - the job must start even if the hook cannot
        print(f"driftwatch: hook not installed: {err!r}", file=sys.stderr)


def install() -> None:
    """Arrange for ``keras.Model.fit`` and TensorFlow's ``tf.function`` calls to be patched,
    now or when the job imports Keras and TensorFlow."""
    if os.environ.get(DISABLE_ENV) == "0":
        return
    for name, patch in (("keras", _patch_keras), ("tensorflow", _patch_tensorflow)):
        module = sys.modules.get(name)
        if module is not None:
            _guarded(lambda: patch(module))  # noqa: B023 - called before the loop moves on
        else:
            sys.meta_path.insert(0, _PatchAfterImport(name, patch))
