"""``DriftwatchCallback``: the hook for ``model.fit``, and for ``evaluate`` and ``predict``
where they are the job.

It times each call of the model's step function (``train_function``; ``test_function`` or
``predict_function`` when ``evaluate`` or ``predict`` runs on its own) by wrapping it for the
duration of the loop (exact even with ``steps_per_execution > 1``), and declares itself
``async_safe`` so Keras 3 keeps dispatching batch-end callbacks asynchronously. Its
``on_train_batch_end`` only reads the logs Keras has already turned into Python floats.
With the TensorFlow backend and one step per execution, the fetch of a sample of the batches
is timed (``driftwatch.hook.fit_input``): the input wait, told apart from the step's compute.
``predict`` fetches its batches in Python before each call: the time from the batch's begin
callback to the call is its input wait.
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
    """Watch ``model.fit`` from inside (and ``evaluate`` or ``predict`` run on their own):
    step timing, input wait, TF memory, retracing, NaNs, overhead.

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
        self._timed: str | None = None  # the model's step function timed now, by name
        self._unwrapped: Callable[..., Any] | None = None  # that function as Keras made it
        self._loop_thread = 0  # the thread that runs the loop
        self._batch_begin = math.nan  # when predict asked for its current batch
        self._epoch_start = math.nan
        self._validation_start = math.nan
        self._validation_seconds = 0.0
        self._next_weights_check = check_weights_every

    # -- loop boundaries -----------------------------------------------------------------

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._time_steps("train_function")

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self._end_steps()

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        if self._timed is not None:  # validation inside fit: not part of any step period
            self.hook.boundary()
            self._validation_start = time.perf_counter()
        else:  # evaluate is the job: its steps are timed as fit's are
            self._time_steps("test_function")

    def on_test_end(self, logs: dict[str, Any] | None = None) -> None:
        if self._timed == "test_function":
            self._end_steps()
        else:
            self._validation_seconds += time.perf_counter() - self._validation_start

    def on_predict_begin(self, logs: dict[str, Any] | None = None) -> None:
        if self._timed is None:
            self._time_predictions()

    def on_predict_end(self, logs: dict[str, Any] | None = None) -> None:
        if self._timed == "predict_function":
            self._end_steps()

    def _time_steps(self, attribute: str) -> None:
        """Time each call of the model's ``attribute`` (``train_function``, or
        ``test_function`` where evaluate is the job) as a step, its input fetch sampled."""
        self._loop_thread = threading.get_ident()
        original = getattr(self.model, attribute)
        self.hook.watch_function(original)
        steps = max(1, int(getattr(self.model, "steps_per_execution", 1) or 1))
        hook = self.hook
        clock = time.perf_counter
        sampler = self._input_sampler(steps)

        def timed_step_function(iterator: Any) -> Any:
            hook.step_started(clock(), steps)
            if hook.global_step < sampler.next_step:
                outputs = original(iterator)
            else:  # this step's batch is fetched, and its wait timed, by the sampler
                outputs = sampler.train(original, iterator)
            hook.step_ended(clock())
            return outputs

        self._replace(attribute, original, timed_step_function)

    def _time_predictions(self) -> None:
        """Time each call of ``predict_function`` as a step whose period starts when its
        batch is asked for: predict fetches it in Python first (``next`` of its iterator,
        between the batch's begin callback and the call), which is its input wait."""
        self._loop_thread = threading.get_ident()
        original = self.model.predict_function
        self.hook.watch_function(original)
        steps = max(1, int(getattr(self.model, "steps_per_execution", 1) or 1))
        hook = self.hook
        clock = time.perf_counter

        def timed_predict_function(data: Any) -> Any:
            asked, fetched = self._batch_begin, clock()
            hook.step_started(asked if asked == asked else fetched, steps)
            if asked == asked:
                hook.add_input_wait(fetched - asked, steps)
            outputs = original(data)
            hook.step_ended(clock())
            return outputs

        self._replace("predict_function", original, timed_predict_function)

    def _replace(self, attribute: str, original: Any, timed: Callable[[Any], Any]) -> None:
        self._timed, self._unwrapped = attribute, original
        setattr(self.model, attribute, timed)

    def _end_steps(self) -> None:
        """Give the model its own step function back; close the period; a last probe."""
        if self._timed is not None:
            setattr(self.model, self._timed, self._unwrapped)
            self._timed = self._unwrapped = None
        self.hook.boundary()
        self.hook.probe(final=True)

    def _input_sampler(self, steps: int) -> fit_input.Sampler:
        """``fit_input``'s sampler where it can time this loop's fetches (the TensorFlow
        backend, a traced step function, one step per execution: see that module), else
        one that never samples."""
        eager = getattr(self.model, "run_eagerly", False)
        if steps != 1 or eager or keras.backend.backend() != "tensorflow":
            return fit_input.NEVER
        import tensorflow as tf

        return fit_input.sampler(tf, self.hook)

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

    # -- per batch ---------------------------------------------------------------------

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        """Check the logs Keras materialised; mark where host work outside the step starts.

        The train function returning already marked it. Run synchronously, this comes right
        after Keras waited for the step's results, so the mark moves here: waiting for the
        device is part of the step, other callbacks and host work are not. Dispatched
        asynchronously (another thread), the training thread never waited: the mark stays.
        """
        hook = self.hook
        if threading.get_ident() == self._loop_thread:
            hook.step_ended(time.perf_counter())
        if logs:
            for name, value in logs.items():
                if isinstance(value, float) and not math.isfinite(value):
                    hook.check_finite(value, name)
        if self.check_weights_every and hook.global_step >= self._next_weights_check:
            self._next_weights_check = hook.global_step + self.check_weights_every
            for weight in self.model.weights:
                hook.check_finite(keras.ops.convert_to_numpy(weight), weight.path, "weights")

    def on_test_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        """Where evaluate is the job: as ``on_train_batch_end``, the mark after the sync."""
        if self._timed == "test_function" and threading.get_ident() == self._loop_thread:
            self.hook.step_ended(time.perf_counter())

    def on_predict_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._batch_begin = time.perf_counter()

    def on_predict_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self._timed == "predict_function" and threading.get_ident() == self._loop_thread:
            self.hook.step_ended(time.perf_counter())
