"""``DriftwatchCallback``: the hook for ``model.fit``.

It times each call of the model's train function by wrapping ``model.train_function`` for
the duration of ``fit`` (exact even with ``steps_per_execution > 1``), and declares itself
``async_safe`` so Keras 3 keeps dispatching batch-end callbacks asynchronously. Its
``on_train_batch_end`` only reads the logs Keras has already turned into Python floats.
With the TensorFlow backend and one step per execution, the fetch of a sample of the batches
is timed (``driftwatch.hook.fit_input``): the input wait, told apart from the step's compute.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

import keras

from driftwatch.export.http import TlsConfig
from driftwatch.hook import fit_input
from driftwatch.hook.core import shared_hook


class DriftwatchCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """Watch ``model.fit`` from inside: step timing, TF memory, retracing, NaNs, overhead.

    All callbacks of one process share one hook (see ``shared_hook``), so the options of the
    first one created apply.

    ``check_weights_every``: every N steps, check the weights for non-finite values. Off by
    default: reading weights to the host costs a device sync.
    """

    async_safe = True

    def __init__(
        self,
        *,
        run: str | None = None,
        probe_every_steps: int = 100,
        probe_every_seconds: float = 10.0,
        check_weights_every: int = 0,
        listen: str | None = None,
        tls: TlsConfig | None = None,
        channel_dir: str | None = None,
    ) -> None:
        super().__init__()
        self.hook = shared_hook(
            run=run,
            probe_every_steps=probe_every_steps,
            probe_every_seconds=probe_every_seconds,
            listen=listen,
            tls=tls,
            channel_dir=channel_dir,
        )
        self.check_weights_every = check_weights_every
        self._unwrapped: Callable[..., Any] | None = None
        self._train_thread = 0
        self._epoch_start = math.nan
        self._validation_start = math.nan
        self._validation_seconds = 0.0
        self._next_weights_check = check_weights_every

    # -- fit boundaries ------------------------------------------------------------------

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._train_thread = threading.get_ident()
        original = self.model.train_function
        self.hook.watch_function(original)
        steps = max(1, int(getattr(self.model, "steps_per_execution", 1) or 1))
        hook = self.hook
        clock = time.perf_counter
        sampler = self._input_sampler(steps)

        def timed_train_function(iterator: Any) -> Any:
            hook.step_started(clock(), steps)
            if hook.global_step < sampler.next_step:
                outputs = original(iterator)
            else:  # this step's batch is fetched, and its wait timed, by the sampler
                outputs = sampler.train(original, iterator)
            hook.step_ended(clock())
            return outputs

        self._unwrapped = original
        self.model.train_function = timed_train_function

    def _input_sampler(self, steps: int) -> fit_input.Sampler:
        """``fit_input``'s sampler where it can time this fit's fetches (the TensorFlow
        backend, a traced train function, one step per execution: see that module), else
        one that never samples."""
        eager = getattr(self.model, "run_eagerly", False)
        if steps != 1 or eager or keras.backend.backend() != "tensorflow":
            return fit_input.NEVER
        import tensorflow as tf

        return fit_input.sampler(tf, self.hook)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self._unwrapped is not None:
            self.model.train_function = self._unwrapped
            self._unwrapped = None
        self.hook.boundary()
        self.hook.probe(final=True)

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch_start = time.perf_counter()
        self._validation_seconds = 0.0

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.hook.boundary()
        self.hook.epoch_ended(
            epoch, time.perf_counter() - self._epoch_start, self._validation_seconds
        )
        for name, value in (logs or {}).items():
            if isinstance(value, float):
                self.hook.check_finite(value, name)

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        self.hook.boundary()  # validation inside fit is not part of any step period
        self._validation_start = time.perf_counter()

    def on_test_end(self, logs: dict[str, Any] | None = None) -> None:
        self._validation_seconds += time.perf_counter() - self._validation_start

    # -- per batch ---------------------------------------------------------------------

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        """Check the logs Keras materialised; mark where host work outside the step starts.

        The train function returning already marked it. Run synchronously, this comes right
        after Keras waited for the step's results, so the mark moves here: waiting for the
        device is part of the step, other callbacks and host work are not. Dispatched
        asynchronously (another thread), the training thread never waited: the mark stays.
        """
        hook = self.hook
        if threading.get_ident() == self._train_thread:
            hook.step_ended(time.perf_counter())
        if logs:
            for name, value in logs.items():
                if isinstance(value, float) and not math.isfinite(value):
                    hook.check_finite(value, name)
        if self.check_weights_every and hook.global_step >= self._next_weights_check:
            self._next_weights_check = hook.global_step + self.check_weights_every
            for weight in self.model.weights:
                hook.check_finite(keras.ops.convert_to_numpy(weight), weight.path, "weights")
