"""``Hook``: times training steps from inside the job and sends them to the channel.

The per-step path does two clock reads (vDSO, no syscall), a few attribute updates and one
record into the channel's shared memory: no locks, no device syncs. Probes run every
``probe_every_steps`` steps or ``probe_every_seconds`` seconds, whichever comes first.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import platform
import statistics
import sys
import time
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from driftwatch.channel.env import RUN_ENV, rank_from
from driftwatch.channel.ring import ChannelWriter, NullWriter, open_writer
from driftwatch.channel.wire import RUNTIME_META, SERIES_META, RecordKind
from driftwatch.hook.probes import Reading, TensorflowProbes
from driftwatch.hook.trace import ProfilerTraces
from driftwatch.series import Labels
from driftwatch.series.training import MAX_NONFINITE_NAMES, nonfinite_role
from driftwatch.target.process import default_run_name

if TYPE_CHECKING:
    from driftwatch.export.http import TlsConfig

log = logging.getLogger(__name__)

INPUT_WAITS_KEPT = 128
"""Newest batches whose waits the hook keeps, for the median a probe sends (batches)."""
INPUT_START_STEPS = 2
"""Steps from when batches start being timed to the probe that starts input wait's first
window: past the step under way and the next (the first traces the train step)."""
FIRST_INPUT_READING_STEPS = 10
"""Steps from that probe to the one that sends input wait's first reading, where the regular
probe would come later (goodput splits the steps' time by the readings)."""


@functools.cache
def _process_writer(pid: int, channel_dir: str | None) -> ChannelWriter | NullWriter:
    """One channel per process, however many hooks it creates (keyed by pid: a forked child
    must not write into its parent's ring)."""
    import psutil

    return open_writer(pid, psutil.Process(pid).create_time(), channel_dir)


@functools.cache
def _process_traces(writer: ChannelWriter) -> ProfilerTraces:
    """One process's profiler traces, however many hooks share its channel."""
    return ProfilerTraces(writer)


def runtime_versions() -> dict[str, str]:
    """Python's version, and TensorFlow's and Keras's if the job has imported them (the
    hook never imports them itself: a custom loop may not use Keras)."""
    versions = {"python": platform.python_version()}
    for name in ("tensorflow", "keras"):
        version = getattr(sys.modules.get(name), "__version__", None)
        if isinstance(version, str):
            versions[name] = version
    return versions


class Hook:
    """Times the steps of a training loop: ``with hook.step(): train_step(batch)``.

    Works alone or with a daemon: records go to a per-process channel file that
    ``driftwatch attach``/``run``/``daemon`` read; with ``listen="127.0.0.1:PORT"`` the
    process also serves its own ``/metrics`` (over HTTPS with ``tls``). The run name is
    ``run``, else ``$DRIFTWATCH_RUN``, else the script's name; monitors label the run with it.
    """

    def __init__(
        self,
        *,
        run: str | None = None,
        probe_every_steps: int = 100,
        probe_every_seconds: float = 10.0,
        listen: str | None = None,
        tls: TlsConfig | None = None,
        channel_dir: str | None = None,
    ) -> None:
        if probe_every_steps < 1 or not probe_every_seconds > 0:
            raise ValueError("probe_every_steps must be >= 1 and probe_every_seconds > 0")
        self.run = (
            run
            or os.environ.get(RUN_ENV)
            or default_run_name([sys.executable, *sys.argv], "python")
        )
        self.probe_every_steps = probe_every_steps
        self.probe_every_seconds = probe_every_seconds
        self.global_step = 0
        self.nonfinite = 0
        self._nonfinite_by_name: dict[Labels, int] = {}  # by (name, role) labels
        self._probes: TensorflowProbes | None = TensorflowProbes()
        self._probe_checks: list[Callable[[Hook], None]] = []
        self._series: dict[tuple[str, Labels], int] = {}
        self._meta: dict[str, object] = {
            "run": self.run,
            "rank": rank_from(os.environ),
            "pid": os.getpid(),
            RUNTIME_META: runtime_versions(),
            SERIES_META: [],
        }
        # Wall time is derived from the monotonic clock: one clock read per event.
        self._perf0 = time.perf_counter()
        self._wall0 = time.time()
        self._period_start = math.nan  # NaN: no period open (start, or after a boundary)
        self._period_steps = 0
        self._periods_seconds = 0.0  # wall time of every closed period (input wait's base)
        # Seconds spent in, and calls of, the tf.data iterator's next outside the train step:
        # added by the iterator patches (``add_input_wait``); a probe sends their share of
        # the periods.
        self.input_wait_seconds = 0.0
        self.input_batches = 0
        self.input_waits = [0.0] * INPUT_WAITS_KEPT  # the newest batches' waits, a ring
        self._input_mark = (0.0, 0, 0.0)  # input_wait_seconds, input_batches, periods: last sent
        self._input_start_step = -1  # the step from which a probe starts the first window
        # Other waits timed in the step (a rank's collectives), by series: a reader of their
        # seconds so far, and (seconds, periods) at the previous probe, or the step from
        # which a probe takes the first of those (an int: the window has not started).
        self._waits: dict[str, tuple[Callable[[], float], tuple[float, float] | int]] = {}
        self._idle_since = math.nan
        self._next_probe_step = probe_every_steps
        self._next_probe_time = self._perf0 + probe_every_seconds
        self._writer = _process_writer(os.getpid(), channel_dir)
        self._writer.set_meta(self._meta)
        self._traces = (
            _process_traces(self._writer) if isinstance(self._writer, ChannelWriter) else None
        )
        _hooks.add(self)
        self._server: Any = None
        if listen is not None:
            from driftwatch.hook.serve import serve_in_process

            self._server = serve_in_process(self._writer, self.run, listen, tls)

    # -- the per-step path -------------------------------------------------------------

    def step(self) -> Hook:
        """The context manager around one training step (the hook itself: no allocation)."""
        return self

    def __enter__(self) -> Hook:
        self.step_started(time.perf_counter())
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.step_ended(time.perf_counter())

    def step_started(self, now: float, steps: int = 1) -> None:
        """A call of the train step that will run ``steps`` steps starts at ``now``.

        Closes the previous period (start to start) and writes its ``STEP`` record.
        """
        start = self._period_start
        if start == start:  # not NaN: a period is open
            idle = self._idle_since
            gap = now - idle if idle == idle else 0.0
            closed = self._period_steps
            self._periods_seconds += now - start
            self._writer.write(
                RecordKind.STEP,
                self.global_step,
                self._wall0 + (now - self._perf0),
                (now - start) / closed,
                gap / closed,
            )
        self._period_start = now
        self._period_steps = steps
        self.global_step += steps
        self._idle_since = math.nan

    def step_ended(self, now: float) -> None:
        """The train step's result is in hand at ``now``; host work outside it starts."""
        if self.global_step >= self._next_probe_step or now >= self._next_probe_time:
            self.probe()
            now = time.perf_counter()  # the probe's own cost is not the job's host work
        self._idle_since = now

    # -- less frequent events ----------------------------------------------------------

    def boundary(self) -> None:
        """Close the current period without a record: an epoch end or validation follows."""
        self._period_start = math.nan
        self._idle_since = math.nan

    def epoch_ended(self, epoch: int, seconds: float, validation_seconds: float) -> None:
        self._writer.write(RecordKind.EPOCH, epoch, self._wall(), seconds, validation_seconds)

    def check_finite(self, value: Any, name: str = "loss", role: str | None = None) -> bool:
        """Whether a host value (float, NumPy array) is all finite; counts and reports it.

        ``role``: ``loss``, ``weights`` or ``metric`` (default: told by ``name``). Only a
        non-finite value sends its name (the series table grows once per name).
        """
        try:
            finite = math.isfinite(value)
        except TypeError:
            import numpy as np

            finite = bool(np.isfinite(value).all())
        if not finite:
            self.nonfinite += 1
            if "first_nonfinite" not in self._meta:
                self._meta["first_nonfinite"] = {"step": self.global_step, "name": name}
                self._writer.set_meta(self._meta)
            role = role or nonfinite_role(name)
            labels = (("name", name), ("role", role))
            if labels not in self._nonfinite_by_name and len(self._nonfinite_by_name) >= (
                MAX_NONFINITE_NAMES
            ):
                labels = (("name", "(others)"), ("role", role))
            count = self._nonfinite_by_name[labels] = self._nonfinite_by_name.get(labels, 0) + 1
            self._send(
                [
                    ("hook_nonfinite_total", (), float(self.nonfinite)),
                    ("nonfinite_by_name_total", labels, float(count)),
                ]
            )
        return finite

    def watch_function(self, fn: object) -> None:
        """Count retracing of the ``tf.function`` behind ``fn`` (e.g. your train step)."""
        if self._probes is not None:
            self._probes.watch(fn)

    def check_at_probe(self, check: Callable[[Hook], None]) -> None:
        """Run ``check(hook)`` at every probe (e.g. NaN checks of values read then)."""
        self._probe_checks.append(check)

    def probe(self, final: bool = False) -> None:
        """Read the TensorFlow probes now and send their values; run the probe checks;
        handle profiler-trace requests. ``final``: training ends here (a trace stops)."""
        now = time.perf_counter()
        self._next_probe_step = self.global_step + self.probe_every_steps
        self._next_probe_time = now + self.probe_every_seconds
        if self._traces is not None:
            stop_at = self._traces.at_probe(self.global_step, now, self._meta, final)
            if stop_at is not None:
                self._next_probe_step = min(self._next_probe_step, stop_at)
        for check in list(self._probe_checks):
            try:
                check(self)
            except Exception as err:  # noqa: BLE001 - a check must never disturb training
                log.info("driftwatch: probe check %r failed, not run again: %r", check, err)
                self._probe_checks.remove(check)
        self._send_input_wait()
        self._send_waits()
        if self._probes is None:
            return
        try:
            readings = self._probes.read()
        except ImportError:
            log.info("driftwatch: TensorFlow is not importable: no allocator or tracing probes")
            self._probes = None
            return
        self._send(readings)

    def close(self) -> None:
        """Flush a last probe and stop serving; the process's channel stays open."""
        self.probe(final=True)
        if self._server is not None:
            self._server.close()
            self._server = None

    # -- helpers -----------------------------------------------------------------------

    def add_input_wait(self, seconds: float, batches: int = 1) -> None:
        """``batches`` batches fetched after ``seconds`` of waiting in all, each taken to
        have waited their mean (custom_loop's patch times one batch, fit_input's sampler the
        steps since its previous sample). A wait between two steps (a custom loop's
        ``next``) is input, not host work outside the step: the open gap is shortened by it,
        so that a custom loop's step, as fit's, holds its input wait."""
        idle = self._idle_since
        if idle == idle:  # not NaN: between two steps
            self._idle_since = idle + seconds
        first = self.input_batches
        each = seconds / batches
        for batch in range(max(first, first + batches - INPUT_WAITS_KEPT), first + batches):
            self.input_waits[batch % INPUT_WAITS_KEPT] = each
        self.input_wait_seconds += seconds
        self.input_batches = first + batches

    def expect_input_wait(self) -> None:
        """Batches are timed from now: a probe ``INPUT_START_STEPS`` on starts the first
        window (leaving the first, traced, step out of it), and one
        ``FIRST_INPUT_READING_STEPS`` after that sends the first reading, rather than a
        whole probe interval later (goodput holds step time for the readings to split)."""
        self._input_start_step = self.global_step + INPUT_START_STEPS
        self._next_probe_step = min(self._next_probe_step, self._input_start_step)

    def _start_input_window(self) -> None:
        """At a probe: the first window starts here once its step has come (none sent)."""
        if self.global_step >= self._input_start_step:
            self._input_start_step = -1
            self._input_mark = (self.input_wait_seconds, self.input_batches, self._periods_seconds)
            self._next_probe_step = min(
                self._next_probe_step, self.global_step + FIRST_INPUT_READING_STEPS
            )

    def _send_input_wait(self) -> None:
        """The share of the periods closed since the last reading spent waiting for input,
        and the median batch's wait, if batches were fetched in them (nothing when no
        fetch is timed, as under fit with several steps per execution)."""
        if self._input_start_step >= 0:
            self._start_input_window()
            return
        wait0, batches0, periods0 = self._input_mark
        periods = self._periods_seconds
        if self.input_batches == batches0 or periods <= periods0:
            return
        share = (self.input_wait_seconds - wait0) / (periods - periods0)
        batches = self.input_batches
        first = max(batches0, batches - INPUT_WAITS_KEPT)
        recent = [self.input_waits[i % INPUT_WAITS_KEPT] for i in range(first, batches)]
        self._input_mark = (self.input_wait_seconds, batches, periods)
        self._send(
            [
                ("input_wait_share", (), min(1.0, max(0.0, share))),
                ("input_wait_batch_seconds", (), statistics.median(recent)),
            ]
        )

    def watch_wait(self, series: str, waited: Callable[[], float]) -> None:
        """Send ``series`` at each probe: the share of step time since the previous probe by
        which ``waited()`` (seconds waited so far, e.g. at a rank's collectives) grew. As
        for input wait, a probe ``INPUT_START_STEPS`` on starts the first window and one
        ``FIRST_INPUT_READING_STEPS`` after that sends the first reading. A series watched
        already is left as it is."""
        if series not in self._waits:
            start = self.global_step + INPUT_START_STEPS
            self._waits[series] = (waited, start)
            self._next_probe_step = min(self._next_probe_step, start)

    def _send_waits(self) -> None:
        """Each watched wait's share of the periods closed since the previous probe; a wait
        that cannot be read is dropped, once, with a log line."""
        periods = self._periods_seconds
        readings: list[Reading] = []
        for series, (waited, mark) in list(self._waits.items()):
            if isinstance(mark, int) and self.global_step < mark:
                continue
            try:
                seconds = waited()
            except Exception as err:  # noqa: BLE001 - a probe must never disturb training
                log.info("driftwatch: %s not measured any more: %r", series, err)
                del self._waits[series]
                continue
            if isinstance(mark, int):  # the first window starts
                first = self.global_step + FIRST_INPUT_READING_STEPS
                self._next_probe_step = min(self._next_probe_step, first)
            elif periods > mark[1]:
                share = (seconds - mark[0]) / (periods - mark[1])
                readings.append((series, (), min(1.0, max(0.0, share))))
            self._waits[series] = (waited, (seconds, periods))
        if readings:
            self._send(readings)

    def _wall(self) -> float:
        return self._wall0 + (time.perf_counter() - self._perf0)

    def _send(self, readings: list[Reading]) -> None:
        t = self._wall()
        for series, labels, value in readings:
            key = self._series.get((series, labels))
            if key is None:
                key = self._series[(series, labels)] = len(self._series)
                series_list = self._meta[SERIES_META]
                assert isinstance(series_list, list)
                series_list.append([series, dict(labels)])
                self._writer.set_meta(self._meta)  # before any record refers to the key
            self._writer.write(RecordKind.VALUE, key, t, value)


_shared: Hook | None = None
_hooks: weakref.WeakSet[Hook] = weakref.WeakSet()  # every live Hook of this process


def user_hook_exists() -> bool:
    """Whether the job made a ``Hook`` of its own (it times its steps itself)."""
    return any(hook is not _shared for hook in _hooks)


def shared_hook(**config: Any) -> Hook:
    """The hook every ``DriftwatchCallback`` of this process uses, created by the first.

    ``fit`` is often called many times (one epoch each, or per hyperparameter trial): one
    hook keeps the step count and the ``/metrics`` server continuous across calls. Later
    callers' ``config`` is ignored.
    """
    global _shared
    if _shared is None:
        _shared = Hook(**config)
    elif config:
        log.debug("driftwatch: reusing this process's hook; ignoring %s", config)
    return _shared
