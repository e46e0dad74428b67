"""Labeled synthetic traces of TensorFlow training runs for the detection benchmark.

A :class:`TraceSpec` describes one simulated run: how its steps behave, how its memory and
its logs grow, what (if anything) goes wrong and when, and which findings that should
produce. :class:`Trace` turns a spec into ``driftwatch.series.Sample``\\ s in time order,
deterministically from the spec's seed, batched per monitoring tick the way the monitor
delivers them (every sample with ``t <= T``, then the tick's own samples stamped ``T``).

Sampling model (what driftwatch's sources emit):

* the in-process hook: one ``step_seconds`` (start-to-start period of a step) and one
  ``step_gap_seconds`` (time outside the train step) per step, stamped at the end of the
  period; validation is excluded (the hook closes the period at the epoch boundary) but the
  first step after it is slow; ``epoch_seconds`` and ``validation_seconds`` at each epoch's
  end (after validation); per tick, ``train_step`` and ``step_timestamp`` when steps were
  seen since the previous tick, and the probes ``tf_allocator_current_bytes{device}`` and
  ``tracing_count``;
* the process source, per tick: ``rss_bytes``, ``memory_limit_bytes`` and
  ``nondisk_write_bytes`` (series no detector reads, such as ``cpu_seconds``, are left out
  to save time);
* NVML, per tick: ``gpu_process_memory_bytes{gpu}`` and ``gpu_memory_total_bytes{gpu}``;
* the event-file source, per tick: ``event_files``, ``event_file_bytes``,
  ``event_file_largest_bytes`` and ``nonfinite_total``.

Noise model of a step: ``base * exp(wander + ar + injected)`` where ``ar`` is a stationary
AR(1) process in log space (lognormal, autocorrelated), ``wander`` a slow Ornstein-Uhlenbeck
level (mean-reverting random walk), times ``1 + scale * Pareto(alpha)`` on a few steps
(heavy-tailed hiccups); checkpoints add seconds every N steps (to the step and to its gap);
the first step of an epoch is slower. RSS: a warm-up ramp (exponential, ~99 % done after
``warmup_seconds``, or linear), a GC sawtooth with jittered period and amplitude, optional
allocator levels that come and go (a bounded Markov chain, not a leak), white noise. TF
allocator memory: flat with noise and the odd probe that lands mid-step. Event files grow
with the steps (plus summaries at each epoch's end) and may rotate; uploads and progress
bars make the non-disk writes grow with the steps too.

Every random draw comes from numpy generators seeded with the scenario's name and seed, so
a trace is reproducible and scenarios that share a model are still independent.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from driftwatch.commands.options import DEFAULT_INTERVAL
from driftwatch.series import Labels, Sample

T0 = 1_700_000_000.0
"""Unix time at which every simulated run starts."""

MIB = float(1 << 20)
GIB = float(1 << 30)
HOUR = 3600.0
DAY = 86400.0

SLOWDOWN_KINDS = frozenset({"abrupt_slowdown", "gradual_slowdown"})

MAX_SPIKE = 40.0
"""Hiccups are capped at ``1 + spike_scale * 40`` times a step: a longer one is a real stall."""

HOOK_AND_STEP_SERIES = frozenset(
    {
        "step_seconds",
        "step_gap_seconds",
        "train_step",
        "step_timestamp",
        "epoch_seconds",
        "validation_seconds",
        "tf_allocator_current_bytes",
        "tracing_count",
    }
)
"""What a run with no step signal lacks: the hook's series and the event files' steps."""

GPU: Labels = (("gpu", "0"),)
DEVICE: Labels = (("device", "GPU:0"),)


# -- models ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StepModel:
    """How long steps take, and the regular events that interrupt them."""

    seconds: float = 1.0
    """Median step time at the baseline."""
    sigma: float = 0.06
    """Stationary standard deviation of the log step time (the AR(1) part)."""
    phi: float = 0.6
    """AR(1) coefficient of the log step time, step to step."""
    spike_prob: float = 0.002
    """Chance that a step is a heavy-tailed hiccup (GC pause, slow batch, I/O)."""
    spike_alpha: float = 1.5
    """Pareto shape of hiccups (smaller: heavier tail)."""
    spike_scale: float = 0.5
    """A hiccup multiplies the step by ``1 + spike_scale * min(Pareto + 1, MAX_SPIKE)``."""
    wander_sd: float = 0.01
    """Stationary standard deviation of the slow log-level wander (Ornstein-Uhlenbeck)."""
    wander_tau: float = 2 * HOUR
    """Time constant of the wander's mean reversion, seconds."""
    gap_share: float = 0.05
    """Host work outside the train step, as a share of the baseline step."""
    checkpoint_every: int = 0
    """Steps between checkpoints (0: none)."""
    checkpoint_seconds: float = 5.0
    """Median extra seconds a checkpoint adds to its step."""
    steps_per_epoch: int = 0
    """Steps per epoch (0: a single endless epoch, no validation)."""
    validation_seconds: float = 30.0
    """Median validation time at each epoch's end (lognormal, sigma 0.2)."""
    first_step_factor: float = 3.0
    """How much slower the first step of an epoch is (iterator re-creation)."""


@dataclass(frozen=True, slots=True)
class MemoryModel:
    """Host, TensorFlow and GPU memory of a healthy run."""

    rss_start: float = 7 * GIB
    """Where the warm-up starts. The exponential warm-up's first minutes rise at
    ``(rss_base - rss_start) * 4.6 / warmup_seconds``: 18 GiB/h here, so it would not reach
    the 32 GiB limit within the hour even at that rate. A steeper one (3 -> 10 GiB in 45 min
    starts at 43 GiB/h) would reach it within the hour: growth to report even during
    warm-up."""
    rss_base: float = 10 * GIB
    warmup_seconds: float = 45 * 60.0
    """How long the warm-up ramp from ``rss_start`` to ``rss_base`` takes."""
    warmup_shape: Literal["exp", "linear", "import"] = "exp"
    """``exp``: exponential approach, ~99 % done after ``warmup_seconds`` (tau = that / 4.6;
    allocator pools and caches that fill fast, then slower); ``linear``: a straight ramp
    (a dataset cache filled during the first epoch); ``import``: a real TensorFlow
    program's start-up (``tests/data/startup/``): ``rss_start`` from the first reading (the
    interpreter and TensorFlow's shared libraries), a lumpy climb to ``rss_base`` over
    ``warmup_seconds`` (imports, model building, tracing: increments lognormal, sigma 0.8,
    per 0.5 s) and then a creep of ``creep_bytes`` that slows with time constant
    ``creep_seconds``. An ``import`` start-up also has the process's loading signals, as
    recorded with ``--fields`` (``tests/data/startup/fields/``): bytes read (imports) rise
    steadily for the first ``IMPORT_SHARE`` of the climb and then stay flat; file-backed
    memory (``RssFile``) starts at ``FILE_START`` of ``rss_start``, creeps by
    ``FILE_IMPORT_BYTES`` while importing and then climbs ``FILE_CLIMB_BYTES`` with the rest
    of the climb (model building, tracing: code run for the first time), flat once the
    climb has ended; the creep and any leak after it are anonymous memory."""
    creep_bytes: float = 0.0
    creep_seconds: float = 15.0
    gc_period: float = 240.0
    """Median seconds between two drops of the GC sawtooth."""
    gc_jitter: float = 0.3
    """Lognormal sigma of the sawtooth's period and amplitude."""
    gc_amplitude: float = 150 * MIB
    noise: float = 4 * MIB
    alloc_step: float = 0.0
    """Size of one allocator level (0: none); levels come and go, bounded by alloc_levels."""
    alloc_levels: int = 3
    alloc_changes_per_hour: float = 0.3
    limit: float = 32 * GIB
    tf_base: float = 6 * GIB
    tf_noise: float = 8 * MIB
    tf_mid_step_prob: float = 0.1
    """Chance that a probe lands mid-step and sees activations on top."""
    tf_mid_step_bytes: float = 256 * MIB
    tracing_count: float = 3.0
    gpu: bool = True
    gpu_total: float = 80 * GIB
    gpu_used: float = 76 * GIB
    """What TensorFlow's BFC allocator reserved at start: flat for the whole run."""


@dataclass(frozen=True, slots=True)
class LogModel:
    """TensorBoard event files and uploads (non-disk writes)."""

    event_bytes_per_step: float = 300.0
    """Scalars logged each step (update_freq="batch")."""
    epoch_summary_bytes: float = 2 * MIB
    """Histograms and images written at each epoch's end."""
    rotation_seconds: float = 0.0
    """A new event file every this many seconds (0: one file for the whole run)."""
    stdout_bytes_per_step: float = 120.0
    """Progress bar written to a pipe each step."""
    upload_bytes_per_step: float = 200.0
    """Metrics an experiment tracker uploads, per step, in bursts."""
    upload_every: float = 30.0
    """Median seconds between two upload bursts."""


# -- injected problems -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Slowdown:
    """Steps get ``factor`` times slower from ``onset`` (seconds into the run), at once or
    linearly over ``ramp_steps`` steps."""

    onset: float
    factor: float
    ramp_steps: int = 0


@dataclass(frozen=True, slots=True)
class Leak:
    """RSS grows by ``per_hour`` bytes an hour from ``onset``; ``tf_share`` of it is also in
    TensorFlow's allocator (tensors kept alive); ``traces_per_hour`` retracings."""

    onset: float
    per_hour: float
    tf_share: float = 0.0
    traces_per_hour: float = 0.0


@dataclass(frozen=True, slots=True)
class MemoryJump:
    """RSS steps up by ``size`` bytes at ``at`` and stays there (a one-off allocation)."""

    at: float
    size: float


@dataclass(frozen=True, slots=True)
class EventFileGrowth:
    """The current event file grows by ``per_hour`` more bytes an hour from ``onset``."""

    onset: float
    per_hour: float


@dataclass(frozen=True, slots=True)
class NonFinite:
    """Training diverges at ``at``: every logged scalar is non-finite from then on."""

    at: float
    scalars_per_step: int = 3


Injection = Slowdown | Leak | MemoryJump | EventFileGrowth | NonFinite


# -- labels and specs --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Goal:
    """One of the issue's goals this scenario measures: detection within ``max_delay``
    seconds (or ``max_steps`` steps) of the onset, or (``silent``) no expected-kind
    finding at all."""

    name: str
    max_delay: float = math.inf
    max_steps: float = math.inf
    silent: frozenset[str] = frozenset()
    """Kinds that must never be reported at warning or critical (e.g. a jump is no leak)."""


@dataclass(frozen=True, slots=True)
class Label:
    """What was injected, when, and what driftwatch should say about it."""

    injected: str
    onset: float | None = None
    """Unix time of the onset (None for healthy runs)."""
    expected: frozenset[str] = frozenset()
    """Kinds any of which, at warning or critical after the onset, is a detection."""
    ideal: str | None = None
    """The most precise kind (e.g. ``abrupt_slowdown`` rather than ``gradual_slowdown``)."""
    tolerated: frozenset[str] = frozenset()
    """Kinds that are true after the onset too (a consequence of the injection)."""
    evidence: tuple[tuple[str, str], ...] = ()
    """Evidence the detecting finding should carry, e.g. ``(("leak_class", "retracing"),)``."""
    goal: Goal | None = None


@dataclass(frozen=True, slots=True)
class TraceSpec:
    name: str
    seconds: float
    """Length of the run."""
    seed: int = 0
    tick: float = 10.0
    """Monitoring interval: process, NVML, event-file and probe samples."""
    steps: StepModel = field(default_factory=StepModel)
    memory: MemoryModel = field(default_factory=MemoryModel)
    logs: LogModel = field(default_factory=LogModel)
    injections: tuple[Injection, ...] = ()
    label: Label = field(default_factory=lambda: Label("nothing (healthy)"))
    healthy: bool = False
    step_signal: bool = True
    """False: no step, epoch or hook series at all (a custom loop without TensorBoard,
    watched from outside): only the process and event-file series."""

    def with_run(self, seed: int, seconds: float | None = None) -> TraceSpec:
        """The same scenario with another seed (and length)."""
        return replace(self, seed=seed, seconds=self.seconds if seconds is None else seconds)


# -- generation --------------------------------------------------------------------------

Tick = tuple[float, list[Sample]]
"""A monitoring tick: its time and the samples delivered at it, in time order."""

_CHUNK = 4096


class _Randoms:
    """Per-step random numbers drawn in chunks (numpy is slow one number at a time)."""

    def __init__(self, rng: np.random.Generator, spike_alpha: float) -> None:
        self._rng = rng
        self._alpha = spike_alpha
        self._i = _CHUNK
        self.normal: list[float] = []
        self.normal2: list[float] = []
        self.normal3: list[float] = []
        self.uniform: list[float] = []
        self.pareto: list[float] = []

    def next(self) -> int:
        """Index of the next set of numbers, refilling when needed."""
        if self._i >= _CHUNK:
            rng = self._rng
            self.normal = rng.standard_normal(_CHUNK).tolist()
            self.normal2 = rng.standard_normal(_CHUNK).tolist()
            self.normal3 = rng.standard_normal(_CHUNK).tolist()
            self.uniform = rng.random(_CHUNK).tolist()
            self.pareto = rng.pareto(self._alpha, _CHUNK).tolist()
            self._i = 0
        i = self._i
        self._i += 1
        return i


class Trace:
    """One simulated run: iterate :meth:`ticks` (or :meth:`samples`) once.

    While it runs it records ``onset_step`` (the steps done at the label's onset) and
    ``steps`` (the steps done so far), so the benchmark can state delays in steps.
    """

    def __init__(self, spec: TraceSpec) -> None:
        self.spec = spec
        self.label = spec.label
        self.onset_step: int | None = None
        self.steps = 0
        self.samples_emitted = 0
        self.step_samples = 0

    def samples(self) -> Iterator[Sample]:
        for _, batch in self.ticks():
            yield from batch

    def ticks(self) -> Iterator[Tick]:
        if self.spec.step_signal:
            yield from self._ticks()
            return
        for at, batch in self._ticks():
            yield at, [sample for sample in batch if sample.series not in HOOK_AND_STEP_SERIES]

    def _ticks(self) -> Iterator[Tick]:
        """Every series' ticks, from a fresh simulation (set up at the first tick)."""
        yield from _Simulation(self).ticks()

    def _count(self, batch: list[Sample]) -> None:
        self.samples_emitted += len(batch)


class _Simulation:
    """The state of one trace while it is generated: the simulated clock, the steps, the
    step-time noise, the pending batch. Its steps draw their random numbers in one fixed
    order (a trace is its seed's), so helpers must not reorder them."""

    __slots__ = (
        "ar",
        "ar_sd",
        "batch",
        "end",
        "epoch_start",
        "first_of_epoch",
        "gap_base",
        "last_step_t",
        "memory",
        "next_tick",
        "nonfinite",
        "nonfinite_from",
        "onset",
        "randoms",
        "rng",
        "slow_onset_step",
        "slowdowns",
        "sm",
        "spec",
        "step",
        "steps_at_last_tick",
        "t",
        "trace",
        "wander",
    )

    def __init__(self, trace: Trace) -> None:
        spec = trace.spec
        sm = spec.steps
        self.trace = trace
        self.spec = spec
        self.sm = sm
        # Seeded by scenario name and seed: scenarios that share a model stay independent.
        name_key = zlib.crc32(spec.name.encode())
        self.rng = np.random.default_rng([name_key, spec.seed, 0])
        self.randoms = _Randoms(self.rng, sm.spike_alpha)
        self.memory = _MemoryState(spec, np.random.default_rng([name_key, spec.seed, 1]))
        self.slowdowns = [i for i in spec.injections if isinstance(i, Slowdown)]
        self.nonfinite = [i for i in spec.injections if isinstance(i, NonFinite)]
        self.onset = spec.label.onset
        self.end = T0 + spec.seconds
        self.next_tick = T0 + spec.tick
        self.t = T0
        self.step = 0
        self.ar = 0.0
        self.ar_sd = sm.sigma * math.sqrt(1 - sm.phi * sm.phi)
        self.wander = 0.0
        self.gap_base = sm.seconds * sm.gap_share
        self.first_of_epoch = False
        self.epoch_start = T0
        self.slow_onset_step: list[int | None] = [None] * len(self.slowdowns)
        self.steps_at_last_tick = 0
        self.last_step_t = math.nan
        self.nonfinite_from: int | None = None
        self.batch: list[Sample] = []

    def ticks(self) -> Iterator[Tick]:
        """Step after step (and validation at each epoch's end) until the run's end, with
        the monitoring ticks that fall due on the way."""
        end = self.end
        while self.t < end:
            self._note_onset()
            seconds, gap = self._next_step()
            t_end = self.t + seconds
            if self.next_tick <= t_end:  # most steps end between two ticks: no generator
                yield from self._ticks_until(t_end)
            if t_end > end:
                break
            self._record_step(t_end, seconds, gap)
            if self._epoch_ended():
                validation = self._validation_seconds()
                t_val = self.t + validation
                yield from self._ticks_until(t_val)
                if t_val > end:
                    break
                self._record_epoch(t_val, validation)
        yield from self._ticks_until(end)  # the ticks left (a run that ended in validation)

    def _note_onset(self) -> None:
        """Record the steps done when the label's onset is reached (delays in steps)."""
        onset = self.onset
        if onset is not None and self.trace.onset_step is None and self.t >= onset:
            self.trace.onset_step = self.step

    def _next_step(self) -> tuple[float, float]:
        """The next step's period and its gap (outside the train step), in seconds:
        noise, slowdowns, a hiccup, the epoch's slow first step, a checkpoint."""
        sm = self.sm
        randoms = self.randoms
        i = randoms.next()
        self.ar = sm.phi * self.ar + self.ar_sd * randoms.normal[i]
        log_factor = self._slowed(self.wander + self.ar)
        seconds = sm.seconds * math.exp(log_factor)
        if randoms.uniform[i] < sm.spike_prob:
            seconds *= 1 + sm.spike_scale * min(randoms.pareto[i] + 1, MAX_SPIKE)
        gap = self.gap_base * math.exp(0.3 * randoms.normal2[i])
        if self.first_of_epoch:
            seconds *= sm.first_step_factor
            self.first_of_epoch = False
        if sm.checkpoint_every and (self.step + 1) % sm.checkpoint_every == 0:
            extra = sm.checkpoint_seconds * math.exp(0.15 * float(self.rng.standard_normal()))
            seconds += extra
            gap += extra
        seconds = max(seconds, gap * 1.01)
        self._wander_on(seconds, randoms.normal3[i])
        return seconds, gap

    def _slowed(self, log_factor: float) -> float:
        """``log_factor`` plus each slowdown in effect by now (a ramp: its share so far)."""
        for k, sd in enumerate(self.slowdowns):
            if self.t >= T0 + sd.onset:
                began = self.slow_onset_step[k]
                if began is None:
                    began = self.slow_onset_step[k] = self.step
                done = self.step - began
                if sd.ramp_steps > 0 and done < sd.ramp_steps:
                    log_factor += math.log1p((sd.factor - 1) * done / sd.ramp_steps)
                else:
                    log_factor += math.log(sd.factor)
        return log_factor

    def _wander_on(self, seconds: float, normal: float) -> None:
        """Move the slow log-level wander (Ornstein-Uhlenbeck) over a step of ``seconds``."""
        sm = self.sm
        if sm.wander_sd > 0:
            decay = math.exp(-seconds / sm.wander_tau)
            spread = sm.wander_sd * math.sqrt(1 - decay * decay)
            self.wander = self.wander * decay + spread * normal

    def _ticks_until(self, limit: float) -> Iterator[Tick]:
        """The ticks due by ``limit`` (none past the run's end), each delivering the samples
        batched since the previous one and its own."""
        tick = self.spec.tick
        while self.next_tick <= limit and self.next_tick <= self.end:
            at = self.next_tick
            batch = self.batch
            batch.extend(self._tick_samples(at))
            yield at, batch
            self.trace._count(batch)
            self.batch = []
            self.next_tick = at + tick

    def _tick_samples(self, at: float) -> list[Sample]:
        """What a tick at ``at`` reads itself: memory, logs, the step count, non-finites."""
        step = self.step
        new_steps = step - self.steps_at_last_tick
        self.steps_at_last_tick = step
        out = self.memory.samples(at, new_steps)
        if new_steps:
            out.append(Sample("train_step", float(step), at))
            out.append(Sample("step_timestamp", self.last_step_t, at))
        out.append(Sample("nonfinite_total", self._nonfinite_count(at), at))
        return out

    def _nonfinite_count(self, at: float) -> float:
        """Non-finite scalars logged by ``at``: every scalar of every step since divergence."""
        count = 0.0
        for nf in self.nonfinite:
            if at >= T0 + nf.at:
                if self.nonfinite_from is None:
                    self.nonfinite_from = self.step
                count += float((self.step - self.nonfinite_from + 1) * nf.scalars_per_step)
        return count

    def _record_step(self, t_end: float, seconds: float, gap: float) -> None:
        """A step that ended at ``t_end``: the hook's two samples, stamped at its end."""
        self.step += 1
        self.batch.append(Sample("step_seconds", seconds, t_end))
        self.batch.append(Sample("step_gap_seconds", gap, t_end))
        self.trace.step_samples += 1
        self.t = t_end
        self.last_step_t = t_end
        self.trace.steps = self.step

    def _epoch_ended(self) -> bool:
        """Whether the step just recorded was the last of an epoch."""
        per_epoch = self.sm.steps_per_epoch
        return bool(per_epoch) and self.step % per_epoch == 0

    def _validation_seconds(self) -> float:
        """How long this epoch's validation takes (lognormal around the model's median)."""
        sm = self.sm
        return sm.validation_seconds * math.exp(0.2 * float(self.rng.standard_normal()))

    def _record_epoch(self, t_val: float, validation: float) -> None:
        """An epoch whose validation ended at ``t_val``: its records, its summaries."""
        self.t = t_val
        self.batch.append(Sample("epoch_seconds", t_val - self.epoch_start, t_val))
        self.batch.append(Sample("validation_seconds", validation, t_val))
        self.memory.epoch_ended(self.spec.logs.epoch_summary_bytes)
        self.epoch_start = t_val
        self.first_of_epoch = True


class _MemoryState:
    """Per-tick series: RSS, TF allocator, GPU, event files, non-disk writes, tracing."""

    def __init__(self, spec: TraceSpec, rng: np.random.Generator) -> None:
        self.spec = spec
        self.rng = rng
        mm = spec.memory
        self.tau = mm.warmup_seconds / 4.6
        # an ``import`` start-up's climb: its share done after each 0.5 s, lumpy (its own
        # generator: the other scenarios' draws stay as they were)
        self.climb = np.zeros(1)
        self.import_share = 0.0
        if mm.warmup_shape == "import":
            climb_rng = np.random.default_rng([zlib.crc32(spec.name.encode()), spec.seed, 2])
            lumps = np.exp(0.8 * climb_rng.standard_normal(max(1, round(mm.warmup_seconds / 0.5))))
            self.climb = np.concatenate([[0.0], np.cumsum(lumps) / lumps.sum()])
            # its own generator: the climb's draws stay as they were
            loading_rng = np.random.default_rng([zlib.crc32(spec.name.encode()), spec.seed, 4])
            self.import_share = float(loading_rng.uniform(*IMPORT_SHARE))
        self.leaks = [i for i in spec.injections if isinstance(i, Leak)]
        self.jumps = [i for i in spec.injections if isinstance(i, MemoryJump)]
        self.event_growth = [i for i in spec.injections if isinstance(i, EventFileGrowth)]
        # GC sawtooth
        self.cycle_start = T0
        self.cycle_len, self.cycle_amp = self._new_cycle()
        # allocator levels
        self.alloc_level = 0
        # event files: sizes of all files, the current one last
        self.files: list[float] = [0.0]
        self.file_started = T0
        self.pending_summary = 0.0
        # uploads
        self.nondisk = 0.0
        self.upload_pending = 0.0
        self.next_upload = T0 + spec.logs.upload_every
        self.last_t = T0

    def _new_cycle(self) -> tuple[float, float]:
        mm = self.spec.memory
        jitter = np.exp(mm.gc_jitter * self.rng.standard_normal(2))
        return float(mm.gc_period * jitter[0]), float(mm.gc_amplitude * jitter[1])

    def _loading(self, elapsed: float, at: float) -> list[Sample]:
        """Bytes read and file-backed memory of an ``import`` start-up (none otherwise)."""
        mm = self.spec.memory
        if mm.warmup_shape != "import":
            return []
        importing = self.import_share * mm.warmup_seconds
        imported = min(1.0, elapsed / importing)
        done = float(np.interp(elapsed / 0.5, np.arange(len(self.climb)), self.climb))
        done_then = float(np.interp(importing / 0.5, np.arange(len(self.climb)), self.climb))
        # code run for the first time: file-backed memory follows the climb after the imports
        building = max(0.0, done - done_then) / max(1e-9, 1.0 - done_then)
        file = FILE_START * mm.rss_start + FILE_IMPORT_BYTES * imported
        file += FILE_CLIMB_BYTES * (1.0 if elapsed >= mm.warmup_seconds else building)
        return [
            Sample("cpu_seconds", CPU_SHARE * elapsed, at),
            Sample("read_syscall_bytes", READ_START_BYTES + IMPORT_READ_BYTES * imported, at),
            Sample("rss_file_bytes", file, at),
        ]

    def epoch_ended(self, summary_bytes: float) -> None:
        self.pending_summary += summary_bytes

    def samples(self, at: float, new_steps: int) -> list[Sample]:
        """Every per-tick series at ``at``, ``new_steps`` steps after the previous tick."""
        mm = self.spec.memory
        elapsed = at - T0
        dt = at - self.last_t
        self.last_t = at
        # -- host RSS --
        rss = self._rss_level(elapsed) + self._sawtooth(at)
        # drawn after the sawtooth's new cycles (which draw from the same generator)
        normals = self.rng.standard_normal(3)
        uniforms = self.rng.random(3)
        self._move_allocator_level(float(uniforms[0]), float(uniforms[1]), dt)
        rss += self.alloc_level * mm.alloc_step + mm.noise * float(normals[0])
        tf = mm.tf_base + mm.tf_noise * float(normals[1])
        if uniforms[2] < mm.tf_mid_step_prob:
            tf += mm.tf_mid_step_bytes
        rss, tf, tracing = self._injected(elapsed, rss, tf)
        out = [
            Sample("rss_bytes", rss, at),
            *self._loading(elapsed, at),
            Sample("memory_limit_bytes", mm.limit, at),
            Sample("tf_allocator_current_bytes", tf, at, DEVICE),
            Sample("tracing_count", tracing, at),
        ]
        if mm.gpu:
            out.append(Sample("gpu_process_memory_bytes", mm.gpu_used, at, GPU))
            out.append(Sample("gpu_memory_total_bytes", mm.gpu_total, at, GPU))
        out.extend(self._event_file_samples(at, elapsed, dt, new_steps))
        out.append(self._nondisk_sample(at, new_steps, float(normals[2])))
        return out

    def _rss_level(self, elapsed: float) -> float:
        """Host RSS without its sawtooth, noise and injections: the warm-up ramp's shape,
        then any creep."""
        mm = self.spec.memory
        if mm.warmup_shape == "linear":
            done = min(1.0, elapsed / mm.warmup_seconds)
        elif mm.warmup_shape == "import":
            done = float(np.interp(elapsed / 0.5, np.arange(len(self.climb)), self.climb))
        else:
            done = -math.expm1(-elapsed / self.tau)
        rss = mm.rss_start + (mm.rss_base - mm.rss_start) * done
        if mm.creep_bytes and elapsed > mm.warmup_seconds:
            rss -= mm.creep_bytes * math.expm1(-(elapsed - mm.warmup_seconds) / mm.creep_seconds)
        return rss

    def _sawtooth(self, at: float) -> float:
        """The GC sawtooth's height at ``at``, starting the cycles (jittered) passed by then."""
        while at >= self.cycle_start + self.cycle_len:
            self.cycle_start += self.cycle_len
            self.cycle_len, self.cycle_amp = self._new_cycle()
        return self.cycle_amp * (at - self.cycle_start) / self.cycle_len

    def _move_allocator_level(self, change: float, direction: float, dt: float) -> None:
        """Perhaps move the allocator one level up or down (bounded), given two uniforms."""
        mm = self.spec.memory
        if mm.alloc_step > 0 and change < mm.alloc_changes_per_hour * dt / HOUR:
            move = 1 if direction < 0.5 else -1
            self.alloc_level = min(max(self.alloc_level + move, 0), mm.alloc_levels)

    def _injected(self, elapsed: float, rss: float, tf: float) -> tuple[float, float, float]:
        """RSS and TF allocator bytes with the leaks and jumps added, and the tracing count."""
        tracing = self.spec.memory.tracing_count
        for leak in self.leaks:
            hours = max(0.0, elapsed - leak.onset) / HOUR
            rss += leak.per_hour * hours
            tf += leak.tf_share * leak.per_hour * hours
            tracing += math.floor(leak.traces_per_hour * hours)
        for jump in self.jumps:
            if elapsed >= jump.at:
                rss += jump.size
        return rss, tf, tracing

    def _event_file_samples(
        self, at: float, elapsed: float, dt: float, new_steps: int
    ) -> list[Sample]:
        """The event files' count and sizes, after rotating and writing what came since the
        previous tick (the steps' scalars, pending summaries, injected growth)."""
        lm = self.spec.logs
        if lm.rotation_seconds and at - self.file_started >= lm.rotation_seconds:
            self.files.append(0.0)
            self.file_started = at
        written = new_steps * lm.event_bytes_per_step + self.pending_summary
        self.pending_summary = 0.0
        for growth in self.event_growth:
            if elapsed > growth.onset:
                written += growth.per_hour * min(dt, elapsed - growth.onset) / HOUR
        self.files[-1] += written
        return [
            Sample("event_files", float(len(self.files)), at),
            Sample("event_file_bytes", float(sum(self.files)), at),
            Sample("event_file_largest_bytes", max(self.files), at),
        ]

    def _nondisk_sample(self, at: float, new_steps: int, normal: float) -> Sample:
        """Non-disk writes so far: the progress bar continuously, tracker uploads in bursts
        (``normal`` jitters the time to the next burst)."""
        lm = self.spec.logs
        self.nondisk += new_steps * lm.stdout_bytes_per_step
        self.upload_pending += new_steps * lm.upload_bytes_per_step
        if at >= self.next_upload:
            self.nondisk += self.upload_pending
            self.upload_pending = 0.0
            self.next_upload = at + lm.upload_every * math.exp(0.3 * normal)
        return Sample("nondisk_write_bytes", self.nondisk, at)


# -- scenarios ---------------------------------------------------------------------------


def _slow(
    name: str,
    seconds: float,
    onset: float,
    factor: float,
    ramp_steps: int,
    step: StepModel,
    goal: Goal | None = None,
) -> TraceSpec:
    ideal = "gradual_slowdown" if ramp_steps else "abrupt_slowdown"
    what = f"steps x{factor:g}" + (f" over {ramp_steps} steps" if ramp_steps else " at once")
    return TraceSpec(
        name,
        seconds,
        tick=DEFAULT_INTERVAL,  # goals counted in steps: the monitor's own cadence at defaults
        steps=step,
        injections=(Slowdown(onset, factor, ramp_steps),),
        label=Label(what, T0 + onset, SLOWDOWN_KINDS, ideal, goal=goal),
    )


FAST_STEPS = StepModel(
    seconds=0.05,
    sigma=0.08,
    phi=0.8,
    spike_prob=0.002,
    checkpoint_every=5000,
    checkpoint_seconds=6.0,
    steps_per_epoch=20_000,
    validation_seconds=60.0,
)
"""A realistic 20 Hz GPU job: 50 ms steps, checkpoints every ~4 min, epochs of ~17 min."""

HALF_SECOND_STEPS = replace(
    FAST_STEPS, seconds=0.5, checkpoint_every=1000, steps_per_epoch=4000, validation_seconds=60
)

SHORT_STEPS = StepModel(
    seconds=0.01, sigma=0.1, phi=0.5, spike_prob=0.005, wander_sd=0.0, gap_share=0.1
)
SHORT_MEMORY = MemoryModel(
    rss_start=0.4 * GIB,
    rss_base=1.5 * GIB,
    warmup_seconds=5.0,
    gc_period=3.0,
    gc_amplitude=20 * MIB,
    noise=2 * MIB,
    limit=16 * GIB,
    tf_base=200 * MIB,
    tf_noise=2 * MIB,
    tf_mid_step_bytes=16 * MIB,
    gpu=False,
)
SHORT_LOGS = LogModel(epoch_summary_bytes=0.0, upload_every=5.0)


def healthy_plain(seed: int = 0, seconds: float = DAY) -> TraceSpec:
    """1 s steps, mild noise, a checkpoint every 30 min, hourly epochs with 30 s validation;
    a dataset cache fills RSS linearly during the first 45 minutes."""
    return TraceSpec(
        "healthy_plain",
        seconds,
        seed,
        steps=StepModel(checkpoint_every=1800, checkpoint_seconds=4.0, steps_per_epoch=3600),
        memory=MemoryModel(warmup_shape="linear"),
        healthy=True,
    )


def healthy_heavy(seed: int = 0, seconds: float = 2 * DAY) -> TraceSpec:
    """Heavy-tailed, strongly autocorrelated steps, 8 s checkpoints every 10 min, 40-min
    epochs whose validation takes ~100 s (sometimes over 2 min) and a slow first step."""
    return TraceSpec(
        "healthy_heavy",
        seconds,
        seed,
        steps=StepModel(
            sigma=0.10,
            phi=0.8,
            spike_prob=0.01,
            spike_alpha=1.3,
            spike_scale=1.0,
            checkpoint_every=600,
            checkpoint_seconds=8.0,
            steps_per_epoch=2400,
            validation_seconds=100.0,
            first_step_factor=5.0,
        ),
        memory=MemoryModel(warmup_seconds=60 * 60.0, gc_amplitude=250 * MIB),
        healthy=True,
    )


def healthy_wander(seed: int = 0, seconds: float = 3 * DAY) -> TraceSpec:
    """2 s steps whose level wanders slowly (2 % standard deviation, 3 h mean reversion)."""
    return TraceSpec(
        "healthy_wander",
        seconds,
        seed,
        steps=StepModel(
            seconds=2.0,
            sigma=0.06,
            phi=0.7,
            wander_sd=0.02,
            wander_tau=3 * HOUR,
            checkpoint_every=900,
            checkpoint_seconds=6.0,
            steps_per_epoch=1800,
            validation_seconds=40.0,
        ),
        healthy=True,
    )


def healthy_gc(seed: int = 0, seconds: float = 2 * DAY) -> TraceSpec:
    """A large GC sawtooth (400 MiB every 3-6 min), allocator levels of 128 MiB that come
    and go, noisy TF allocator readings."""
    return TraceSpec(
        "healthy_gc",
        seconds,
        seed,
        steps=StepModel(
            seconds=2.0, checkpoint_every=900, steps_per_epoch=1800, validation_seconds=40.0
        ),
        memory=MemoryModel(
            gc_period=270.0,
            gc_amplitude=400 * MIB,
            gc_jitter=0.4,
            noise=16 * MIB,
            alloc_step=128 * MIB,
            tf_noise=64 * MIB,
            tf_mid_step_prob=0.3,
            tf_mid_step_bytes=512 * MIB,
        ),
        healthy=True,
    )


def healthy_rotation(seed: int = 0, seconds: float = 3 * DAY) -> TraceSpec:
    """Heavier per-step logging (2 KiB/step) rotated into a new event file every 6 h."""
    return TraceSpec(
        "healthy_rotation",
        seconds,
        seed,
        steps=StepModel(
            seconds=2.0, checkpoint_every=900, steps_per_epoch=1800, validation_seconds=40.0
        ),
        memory=MemoryModel(warmup_shape="linear", warmup_seconds=30 * 60.0),
        logs=LogModel(
            event_bytes_per_step=2048.0, epoch_summary_bytes=8 * MIB, rotation_seconds=6 * HOUR
        ),
        healthy=True,
    )


def healthy_fast(seed: int = 0, seconds: float = 4 * HOUR) -> TraceSpec:
    """Realistic 50 ms steps (20 Hz) for hours: one step_seconds sample per step."""
    return TraceSpec("healthy_fast", seconds, seed, steps=FAST_STEPS, healthy=True)


def healthy_short(seed: int = 0, seconds: float = 40.0) -> TraceSpec:
    """A 40-second healthy run: 10 ms steps, 0.5 s ticks, start-up memory ramp."""
    return TraceSpec(
        "healthy_short",
        seconds,
        seed,
        tick=0.5,
        steps=SHORT_STEPS,
        memory=SHORT_MEMORY,
        logs=SHORT_LOGS,
        healthy=True,
    )


HEALTHY = {
    "healthy_plain": healthy_plain,
    "healthy_heavy": healthy_heavy,
    "healthy_wander": healthy_wander,
    "healthy_gc": healthy_gc,
    "healthy_rotation": healthy_rotation,
}
"""Long healthy scenarios: repeated with new seeds to make up the healthy days."""

HEALTHY_EXTRA = {"healthy_fast": healthy_fast, "healthy_short": healthy_short}
"""Healthy scenarios run once each (their time counts towards the healthy days too)."""


def slow_step_10pct(seed: int = 0) -> TraceSpec:
    return _slow(
        "slow_step_10pct",
        2 * HOUR,
        HOUR,
        1.10,
        0,
        FAST_STEPS,
        Goal("+10% step change within 1,000 steps", max_steps=1000),
    ).with_run(seed)


def slow_step_2x(seed: int = 0) -> TraceSpec:
    return _slow("slow_step_2x", 2 * HOUR, HOUR, 2.0, 0, FAST_STEPS).with_run(seed)


def slow_ramp_20pct_20k(seed: int = 0) -> TraceSpec:
    return _slow(
        "slow_ramp_20pct_20k",
        2.5 * HOUR,
        HOUR,
        1.20,
        20_000,
        FAST_STEPS,
        Goal("+20% over 20k steps within 10k steps", max_steps=10_000),
    ).with_run(seed)


def slow_gradual_10pct_4h(seed: int = 0) -> TraceSpec:
    return _slow(
        "slow_gradual_10pct_4h", 8 * HOUR, 2 * HOUR, 1.10, 28_800, HALF_SECOND_STEPS
    ).with_run(seed)


def slow_gradual_20pct_2h(seed: int = 0) -> TraceSpec:
    return _slow(
        "slow_gradual_20pct_2h", 6 * HOUR, 2 * HOUR, 1.20, 14_400, HALF_SECOND_STEPS
    ).with_run(seed)


def slow_gradual_50pct_3h(seed: int = 0) -> TraceSpec:
    return _slow(
        "slow_gradual_50pct_3h", 6 * HOUR, 2 * HOUR, 1.50, 21_600, HALF_SECOND_STEPS
    ).with_run(seed)


LEAK_STEPS = StepModel(checkpoint_every=1800, checkpoint_seconds=4.0, steps_per_epoch=3600)


def _leak(
    name: str,
    per_hour_mib: float,
    goal: Goal | None = None,
    tf_share: float = 0.0,
    traces_per_hour: float = 0.0,
    leak_class: str = "framework_state",
    seconds: float = 12 * HOUR,
) -> TraceSpec:
    onset = 2 * HOUR
    expected = {"host_memory_drift"}
    if tf_share:
        expected.add("tf_memory_drift")
    what = f"RSS leak {per_hour_mib:g} MiB/h on 10 GiB" + (
        " (TF allocator too)" if tf_share else " (with retracing)" if traces_per_hour else ""
    )
    return TraceSpec(
        name,
        seconds,
        steps=LEAK_STEPS,
        injections=(Leak(onset, per_hour_mib * MIB, tf_share, traces_per_hour),),
        label=Label(
            what,
            T0 + onset,
            frozenset({"host_memory_drift"}),
            "host_memory_drift",
            tolerated=frozenset(expected),
            evidence=(("leak_class", leak_class),),
            goal=goal,
        ),
    )


def leak_10(seed: int = 0) -> TraceSpec:
    return _leak("leak_10", 10).with_run(seed)


def leak_25(seed: int = 0) -> TraceSpec:
    return _leak("leak_25", 25, Goal("25 MB/h leak within 3.5 h", max_delay=3.5 * HOUR)).with_run(
        seed
    )


def leak_50(seed: int = 0) -> TraceSpec:
    return _leak("leak_50", 50, Goal("50 MB/h leak within 2 h", max_delay=2 * HOUR)).with_run(seed)


def leak_200(seed: int = 0) -> TraceSpec:
    return _leak("leak_200", 200).with_run(seed)


def leak_50_tensors(seed: int = 0) -> TraceSpec:
    return _leak("leak_50_tensors", 50, tf_share=1.0, leak_class="tensors_kept_alive").with_run(
        seed
    )


def leak_50_retracing(seed: int = 0) -> TraceSpec:
    return _leak("leak_50_retracing", 50, traces_per_hour=20, leak_class="retracing").with_run(seed)


def memory_jump_400(seed: int = 0) -> TraceSpec:
    return TraceSpec(
        "memory_jump_400",
        12 * HOUR,
        seed,
        steps=LEAK_STEPS,
        injections=(MemoryJump(3 * HOUR, 400 * MIB),),
        label=Label(
            "RSS +400 MiB once",
            T0 + 3 * HOUR,
            frozenset(),
            "memory_step",
            goal=Goal(
                "+400 MB jump not called a leak",
                silent=frozenset({"host_memory_drift", "tf_memory_drift", "gpu_memory_drift"}),
            ),
        ),
    )


def _event_file(name: str, per_hour_mib: float, goal: Goal | None) -> TraceSpec:
    onset = 3 * HOUR
    return TraceSpec(
        name,
        6 * HOUR,
        steps=LEAK_STEPS,
        injections=(EventFileGrowth(onset, per_hour_mib * MIB),),
        label=Label(
            f"one event file +{per_hour_mib:g} MiB/h",
            T0 + onset,
            frozenset({"event_file_unrotated"}),
            "event_file_unrotated",
            tolerated=frozenset({"event_file_growth"}),
            goal=goal,
        ),
    )


def eventfile_100(seed: int = 0) -> TraceSpec:
    goal = Goal("event file growing >= 100 MB/h within 15 min", max_delay=15 * 60.0)
    return _event_file("eventfile_100", 100, goal).with_run(seed)


def eventfile_300(seed: int = 0) -> TraceSpec:
    goal = Goal("event file growing >= 100 MB/h within 15 min", max_delay=15 * 60.0)
    return _event_file("eventfile_300", 300, goal).with_run(seed)


def nan_at_3h(seed: int = 0) -> TraceSpec:
    return TraceSpec(
        "nan_at_3h",
        4 * HOUR,
        seed,
        steps=LEAK_STEPS,
        injections=(NonFinite(3 * HOUR),),
        label=Label("loss becomes NaN", T0 + 3 * HOUR, frozenset({"nonfinite"}), "nonfinite"),
    )


def short_slowdown_3x(seed: int = 0) -> TraceSpec:
    return TraceSpec(
        "short_slowdown_3x",
        40.0,
        seed,
        tick=0.5,
        steps=SHORT_STEPS,
        memory=SHORT_MEMORY,
        logs=SHORT_LOGS,
        injections=(Slowdown(20.0, 3.0),),
        label=Label(
            "40 s run, steps x3 at 20 s",
            T0 + 20.0,
            SLOWDOWN_KINDS,
            "abrupt_slowdown",
            goal=Goal("40-second runs flagged within seconds", max_delay=15.0),
        ),
    )


def short_leak_30gb(seed: int = 0) -> TraceSpec:
    return TraceSpec(
        "short_leak_30gb",
        40.0,
        seed,
        tick=0.5,
        steps=SHORT_STEPS,
        memory=SHORT_MEMORY,
        logs=SHORT_LOGS,
        injections=(Leak(5.0, 30 * GIB),),
        label=Label(
            "40 s run, RSS +30 GiB/h from 5 s",
            T0 + 5.0,
            frozenset({"host_memory_drift"}),
            "host_memory_drift",
            goal=Goal("40-second runs flagged within seconds", max_delay=15.0),
        ),
    )


# -- runs with no step signal: start-up, then a leak or a fast event file, or nothing ----

NOSTEP_MEMORY = MemoryModel(
    rss_start=370 * MIB,
    rss_base=600 * MIB,
    warmup_shape="import",
    creep_bytes=40 * MIB,
    creep_seconds=15.0,
    gc_period=3.0,
    gc_amplitude=8 * MIB,
    noise=1 * MIB,
    limit=16 * GIB,
    tf_base=0.0,
    gpu=False,
)
"""A TensorFlow program's start-up as recorded at 0.5 s (``tests/data/startup/``): 370 MB
from the first reading, a lumpy climb to 600 MB over seconds (``nostep_climb_seconds``), then
a slowing creep of 40 MB; RSS moved under 2 MB a reading once settled in the recordings, an
8 MiB GC sawtooth is kept as a margin."""

NOSTEP_LOGS = LogModel(
    event_bytes_per_step=0.0,
    epoch_summary_bytes=0.0,
    stdout_bytes_per_step=0.0,
    upload_bytes_per_step=0.0,
)
"""No TensorBoard scalars, no uploads: nothing gives a step."""

IMPORT_SHARE = (0.7, 0.85)
"""Range of the share of an ``import`` start-up's climb spent importing (reading modules):
TensorFlow's threads appeared, and reading stopped, at 73-83 % of the recorded climbs."""
FILE_START = 0.84
"""Share of ``rss_start`` that is file-backed (the interpreter and TensorFlow's libraries):
313-316 MB of 373-380 MB in the recordings."""
FILE_IMPORT_BYTES = 4 * MIB
"""File-backed memory that comes while importing (1-5 MB in the recordings)."""
FILE_CLIMB_BYTES = 50 * MIB
"""File-backed memory that comes with the rest of the climb (50-57 MB in the recordings)."""
CPU_SHARE = 1.0
"""CPU seconds a no-step run uses per second: one core (imports, tracing, a small model's
steps; 0.9-1.2 in the recordings on an idle host)."""
READ_START_BYTES = 4 * MIB
"""Bytes read by the first reading (the interpreter's start)."""
IMPORT_READ_BYTES = 50 * MIB
"""Bytes read while importing (about 52 MB in the recordings)."""

MEASURABLE_MARGIN = 4.0
"""Noise standard deviations that, with the GC sawtooth's amplitude, make the widest a
healthy reading strays from its level: a leak is measurable once it has added that much."""


def nostep_climb_seconds(name: str, seed: int) -> float:
    """How long this run's start-up climbs: 6 s (the recordings: 4.5-7 s on this VM) times a
    lognormal factor (sigma 0.35: a slower or busier host), 3 to 15 s."""
    rng = np.random.default_rng([zlib.crc32(name.encode()), seed, 3])
    return float(np.clip(6.0 * math.exp(0.35 * float(rng.standard_normal())), 3.0, 15.0))


def leak_measurable_after(per_hour: float, memory: MemoryModel) -> float:
    """Seconds after its onset until a leak has outgrown a healthy reading's stray."""
    return (memory.gc_amplitude + MEASURABLE_MARGIN * memory.noise) / (per_hour / HOUR)


NOSTEP_GOAL = "no step signal: flagged within 5 s of measurable growth (0.5-s readings)"
NOSTEP_SILENT = "no step signal: a start-up (import climb, then creep) not called a leak"


def _nostep(
    name: str,
    seconds: float,
    seed: int,
    make: Callable[[float], tuple[tuple[Injection, ...], Label]],
) -> TraceSpec:
    """A run of ``seconds`` whose start-up climbs for its seed's time; ``make`` gets that
    time (training starts there: the onset of a problem) and gives the injections and label."""
    climb = nostep_climb_seconds(name, seed)
    injections, label = make(climb)
    return TraceSpec(
        name,
        seconds,
        seed,
        tick=0.5,
        steps=SHORT_STEPS,
        memory=replace(NOSTEP_MEMORY, warmup_seconds=climb),
        logs=NOSTEP_LOGS,
        injections=injections,
        label=label,
        step_signal=False,
    )


def _nostep_leak(name: str, seconds: float, per_hour: float, seed: int) -> TraceSpec:
    def make(onset: float) -> tuple[tuple[Injection, ...], Label]:
        measurable = leak_measurable_after(per_hour, NOSTEP_MEMORY)
        label = Label(
            f"{seconds:g} s run, no step, RSS +{per_hour / GIB:g} GiB/h from the end of start-up",
            T0 + onset,
            frozenset({"host_memory_drift"}),
            "host_memory_drift",
            goal=Goal(NOSTEP_GOAL, max_delay=measurable + 5.0),
        )
        return (Leak(onset, per_hour),), label

    return _nostep(name, seconds, seed, make)


def _nostep_event_file(name: str, seconds: float, per_hour: float, seed: int) -> TraceSpec:
    def make(onset: float) -> tuple[tuple[Injection, ...], Label]:
        label = Label(
            f"{seconds:g} s run, no step, one event file +{per_hour / GIB:g} GiB/h from the "
            "end of start-up",
            T0 + onset,
            frozenset({"event_file_unrotated"}),
            "event_file_unrotated",
            # measurable at the first reading after the onset
            goal=Goal(NOSTEP_GOAL, max_delay=0.5 + 5.0),
        )
        return (EventFileGrowth(onset, per_hour),), label

    return _nostep(name, seconds, seed, make)


def _nostep_startup(name: str, seconds: float, seed: int) -> TraceSpec:
    def make(onset: float) -> tuple[tuple[Injection, ...], Label]:
        silent = frozenset({"host_memory_drift", "event_file_unrotated"})
        label = Label(
            f"{seconds:g} s run, no step, start-up climb of {onset:.1f} s, then creep",
            T0,
            frozenset(),
            goal=Goal(NOSTEP_SILENT, silent=silent),
        )
        return (), label

    return _nostep(name, seconds, seed, make)


def nostep_leak_30gb_15s(seed: int = 0) -> TraceSpec:
    return _nostep_leak("nostep_leak_30gb_15s", 15.0, 30 * GIB, seed)


def nostep_leak_30gb_40s(seed: int = 0) -> TraceSpec:
    return _nostep_leak("nostep_leak_30gb_40s", 40.0, 30 * GIB, seed)


def nostep_leak_400gb_15s(seed: int = 0) -> TraceSpec:
    return _nostep_leak("nostep_leak_400gb_15s", 15.0, 400 * GIB, seed)


def nostep_leak_400gb_40s(seed: int = 0) -> TraceSpec:
    return _nostep_leak("nostep_leak_400gb_40s", 40.0, 400 * GIB, seed)


def nostep_eventfile_100gib_15s(seed: int = 0) -> TraceSpec:
    return _nostep_event_file("nostep_eventfile_100gib_15s", 15.0, 100 * GIB, seed)


def nostep_eventfile_100gib_40s(seed: int = 0) -> TraceSpec:
    return _nostep_event_file("nostep_eventfile_100gib_40s", 40.0, 100 * GIB, seed)


def nostep_startup_15s(seed: int = 0) -> TraceSpec:
    return _nostep_startup("nostep_startup_15s", 15.0, seed)


def nostep_startup_40s(seed: int = 0) -> TraceSpec:
    return _nostep_startup("nostep_startup_40s", 40.0, seed)


INJECTED = {
    "slow_step_10pct": slow_step_10pct,
    "slow_step_2x": slow_step_2x,
    "slow_ramp_20pct_20k": slow_ramp_20pct_20k,
    "slow_gradual_10pct_4h": slow_gradual_10pct_4h,
    "slow_gradual_20pct_2h": slow_gradual_20pct_2h,
    "slow_gradual_50pct_3h": slow_gradual_50pct_3h,
    "leak_10": leak_10,
    "leak_25": leak_25,
    "leak_50": leak_50,
    "leak_200": leak_200,
    "leak_50_tensors": leak_50_tensors,
    "leak_50_retracing": leak_50_retracing,
    "memory_jump_400": memory_jump_400,
    "eventfile_100": eventfile_100,
    "eventfile_300": eventfile_300,
    "nan_at_3h": nan_at_3h,
    "short_slowdown_3x": short_slowdown_3x,
    "short_leak_30gb": short_leak_30gb,
    "nostep_leak_30gb_15s": nostep_leak_30gb_15s,
    "nostep_leak_30gb_40s": nostep_leak_30gb_40s,
    "nostep_leak_400gb_15s": nostep_leak_400gb_15s,
    "nostep_leak_400gb_40s": nostep_leak_400gb_40s,
    "nostep_eventfile_100gib_15s": nostep_eventfile_100gib_15s,
    "nostep_eventfile_100gib_40s": nostep_eventfile_100gib_40s,
    "nostep_startup_15s": nostep_startup_15s,
    "nostep_startup_40s": nostep_startup_40s,
}
"""Scenarios with one injected problem each, by name."""
