"""Goodput: where a run's wall time went, by phase, from the step records the sources already
give (``step_seconds``, ``step_gap_seconds``), the hook's input-wait readings
(``input_wait_share``) where it sends them, and the stall rule of the ``stalled`` finding.

Pure, like the detectors: samples in, seconds per phase out, no clock of its own. The monitor
stores its ``wall_seconds{phase}`` counters and ``goodput_ratio`` after each tick (so they are
exported, recorded in the history and read back by ``driftwatch report``); ``driftwatch
analyze`` replays a recording through it. How each phase is told apart, and what goodput is
not: docs/goodput.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from driftwatch.detect.basic import StallDetector
from driftwatch.detect.stall_band import (
    CHAIN_TOLERANCE,
    CLOCK_RESOLUTION,
    MAX_STEPS_JUMP,
    StallBand,
    chained_steps,
)
from driftwatch.series import Sample
from driftwatch.units import human_seconds

PHASES = ("productive", "input_wait", "startup", "periodic_stall", "stalled", "host_overhead")
"""The phases wall time is split into, in the order they are shown."""
STALL_STAMP_SECONDS = 1.0
"""Seconds of step records between two step times told to the stall rule: about as often as
a live monitor reads the latest step (its usual interval between steps is the rule's)."""
TAKEN_FIRST = ("productive", "input_wait", "host_overhead", "periodic_stall", "startup", "stalled")
"""Phases that give back time first when a provisional reading (a stall still going on, step
time counted before an input-wait reading split it) turns out longer than what the steps
settle: the exported counters never go down."""
INPUT_WAIT_HOLD_SECONDS = 30.0
"""Seconds of steps after the latest input-wait reading that are held for the next one to
split; past them they are counted as they settled (three of the hook's 10-s probes)."""
INPUT_WAIT_HOLD_READINGS = 3.0
"""The same hold in intervals between the latest two readings, where that is longer (steps
longer than a probe interval: one reading a step)."""


@dataclass(frozen=True, slots=True)
class Breakdown:
    """Wall time watched, in seconds per phase (every phase of ``PHASES``)."""

    seconds: Mapping[str, float]

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    @property
    def ratio(self) -> float:
        """Goodput: the productive share of the wall time accounted for; NaN with none."""
        total = self.total
        return self.seconds["productive"] / total if total > 0 else math.nan

    @classmethod
    def of(cls, seconds: Mapping[str, float]) -> Breakdown | None:
        """The breakdown of per-phase ``seconds`` read back (a history, a snapshot); None
        when they hold no phase."""
        if not any(phase in seconds for phase in PHASES):
            return None
        return cls({phase: float(seconds.get(phase, 0.0)) for phase in PHASES})

    def describe(self) -> str:
        """One line: the goodput, then each phase that took any time."""
        if not self.total > 0:
            return "no wall time accounted for yet"
        parts = ", ".join(
            f"{phase.replace('_', ' ')} {human_seconds(self.seconds[phase])} "
            f"({self.seconds[phase] / self.total:.0%})"
            for phase in PHASES
            if self.seconds[phase] > 0
        )
        return f"{self.ratio:.0%} of {human_seconds(self.total)}: {parts}"

    def to_dict(self) -> dict[str, object]:
        return {
            "ratio": self.ratio if math.isfinite(self.ratio) else None,
            "wall_seconds": self.total,
            "seconds": dict(self.seconds),
        }


@dataclass(frozen=True, slots=True)
class _Record:
    """One step record: the ``steps`` steps of its period ended at ``t`` and took ``step``
    seconds each, ``gap`` of which outside the train step."""

    t: float
    step: float
    gap: float
    steps: int


@dataclass(slots=True)
class _InputWindow:
    """The time in steps settled since the latest input-wait reading (since the start before
    the first), which the next reading splits: ``productive`` seconds, ``host`` seconds
    outside the train step, and the ``periods`` (start to next start) they came from."""

    productive: float = 0.0
    host: float = 0.0
    periods: float = 0.0


class GoodputAccount:
    """Splits the wall time from ``started`` (None: the first sample observed) into
    ``PHASES`` as step records come.

    Each record's period (its steps at their step time) is productive, less its share
    outside the train step (``step_gap_seconds``, from the hook: host overhead). A period
    that ``StallBand`` calls a stall (every record is told to it, as to
    ``PeriodicStallDetector``'s) keeps its steps' typical time and the rest is a pause, taken
    from its time outside the step first. A record that does not chain holds as many steps
    as the latest that did: its slow steps after a pause (the first of a new ``fit``,
    tracing a new model) are a pause too, where the detector counts no stall. Time no
    record covers (validation, an epoch's end) is a pause too. A pause is ``stalled`` when
    the stall rule (``StallDetector``: no step for 120 s, ten usual intervals or twice the
    longest recent validation, the longest) holds at its end, else a ``periodic_stall``.
    Until the first step record ends is ``startup``, with the first period's time past the
    next one's step time (tracing, compiling). Time after the latest record is settled by
    the next one; until then only a stall the rule already calls one is counted; once the
    run has ended, the time after its last step is host overhead (evaluation, saving,
    exiting).

    Where the hook sends ``input_wait_share`` (the share of the step periods since its
    previous reading spent waiting for the next batch), each reading splits the time in
    steps settled since the previous one (since the start, for the first): that share of
    their periods is ``input_wait``, taken from their productive time, never more than it
    (the hook counts the wait inside the step, a custom loop's as fit's). From the first
    reading on, that time is held until the next reading splits it, so that no counter
    shows it productive first; steps
    that go on past ``INPUT_WAIT_HOLD_SECONDS`` (or ``INPUT_WAIT_HOLD_READINGS`` intervals
    between readings) after the latest reading with none new are counted as they settled,
    and the latest reading splits what is held when the run ends.
    """

    series = frozenset(
        {"step_seconds", "step_gap_seconds", "validation_seconds", "input_wait_share"}
    )

    def __init__(self, started: float | None = None) -> None:
        self._start = math.nan if started is None else started
        self._settled = dict.fromkeys(PHASES, 0.0)
        self._settled_at = self._start  # the wall time before this is in ``_settled``
        self._exported = dict.fromkeys(PHASES, 0.0)
        self._end = math.nan  # the latest record's end
        self._steps_per_record = 1
        self._seen = False  # whether any step record came
        self._first: _Record | None = None  # the first record after start, held for its typical
        self._startup_over = False
        self._open: tuple[float, float] | None = None  # a step record waiting for its gap
        self._band = StallBand()
        self._stall = StallDetector()  # fed the records' ends: its rule, on step records
        self._stall_fed = -math.inf  # the latest record end it was fed
        self._window = _InputWindow()
        self._held = False  # the window is not in ``_settled``: the next reading splits it
        self._share = math.nan  # the latest input-wait reading, at ``_share_at``
        self._share_at = math.nan
        self._share_every = 0.0  # seconds between the latest two readings

    # -- input ---------------------------------------------------------------------------

    def observe(self, sample: Sample) -> None:
        if math.isnan(self._start):
            self._start = self._settled_at = sample.t
        if sample.series == "step_seconds":
            self._close_open()
            if 0 < sample.value < math.inf and math.isfinite(sample.t):
                self._open = (sample.t, sample.value)
        elif sample.series == "step_gap_seconds":
            if self._open is not None and self._open[0] == sample.t:
                gap = sample.value if 0 <= sample.value < math.inf else 0.0
                self._record(self._open[0], self._open[1], gap)
                self._open = None
        elif sample.series == "validation_seconds":
            self._stall.observe(sample)
        elif sample.series == "input_wait_share":
            self._read_input_wait(sample.value, sample.t)

    def _close_open(self) -> None:
        """The step record waiting for its gap has none (event files give none)."""
        if self._open is not None:
            self._record(self._open[0], self._open[1], 0.0)
            self._open = None

    def _record(self, t: float, step: float, gap: float) -> None:
        interval = t - self._end
        self._band.add(step, t, interval)
        steps = self._chained_steps(interval, step)
        self._seen = True
        self._release_late(t)
        if t <= self._settled_at:  # before watching began, or out of order: not counted
            self._startup_over = True  # the run was training before it was watched
            self._end = max(self._end, t) if math.isfinite(self._end) else t
            return
        if not self._startup_over and self._first is None:
            self._first = _Record(t, step, min(gap, step), steps)  # held for the next's step
            self._end = t
            return
        if self._first is not None:  # its steps: as many as the next one's, which chains to it
            self._settle_first(replace(self._first, steps=steps), typical=step)
        self._settle(t, step, min(gap, step), steps)

    def _chained_steps(self, interval: float, step: float) -> int:
        """The steps of a record whose period starts where the previous one ended, the
        ``interval`` before it (at most ``MAX_STEPS_JUMP`` times the latest chained record's
        once start-up is over); else as many as that record held (a pause came between)."""
        steps = chained_steps(step, interval)
        if steps is not None and (
            not self._startup_over or steps <= self._steps_per_record * MAX_STEPS_JUMP
        ):
            self._steps_per_record = steps
        return self._steps_per_record

    def _stall_sync(self) -> None:
        """Tell the stall rule of the latest record's end, before it is asked (it is asked at
        each reading and at each pause: as often as the live detector learns of steps)."""
        if self._end > self._stall_fed:
            self._stall_fed = self._end
            self._stall.observe(Sample("step_timestamp", self._end, self._end))

    # -- settling ------------------------------------------------------------------------

    def _settle_first(self, record: _Record, typical: float) -> None:
        """Start-up: until the first period began, and the first period's time past the
        ``typical`` step (the next one's: tracing and compiling the train function)."""
        self._first = None
        self._startup_over = True
        period_start = max(self._settled_at, record.t - record.steps * record.step)
        self._settled["startup"] += period_start - self._settled_at
        work = min(record.t - period_start, record.steps * min(record.step, typical))
        self._settled["startup"] += record.t - period_start - work
        self._split_work(work, record.gap / record.step, record.t - period_start)
        self._settled_at = record.t

    def _settle(self, t: float, step: float, gap: float, steps: int) -> None:
        span_start = self._settled_at
        period_start = max(span_start, t - steps * step)
        work = t - period_start
        if self._band.excess(step, steps) > 0:  # a pause ended this period
            work = min(work, steps * self._band.typical)  # its steps' typical time is work
        pause = t - span_start - work
        if pause <= CHAIN_TOLERANCE * step + CLOCK_RESOLUTION:  # the periods chain
            work, pause = work + pause, 0.0
        if pause > 0:
            self._settled[self._pause_phase(t)] += pause
        self._split_work(work, gap / step, t - period_start)
        self._settled_at = self._end = t
        if t - self._stall_fed >= STALL_STAMP_SECONDS:
            self._stall_sync()

    def _split_work(self, work: float, gap_share: float, period: float) -> None:
        """``work`` of the ``period`` a record covers is productive, less its time outside
        the train step (``gap_share`` of the period); a pause in the period is taken from
        that time first (a checkpoint or a slow callback runs outside the step)."""
        host = min(work, max(0.0, period * gap_share - (period - work)))
        window = self._window
        window.productive += work - host
        window.host += host
        window.periods += period
        if not self._held:
            self._settled["host_overhead"] += host
            self._settled["productive"] += work - host

    def _pause_phase(self, end: float) -> str:
        self._stall_sync()
        stalled = self._stall.evaluate(end).findings or self._exported_past("stalled")
        return "stalled" if stalled else "periodic_stall"

    # -- input wait ----------------------------------------------------------------------

    def _read_input_wait(self, share: float, t: float) -> None:
        """A reading: ``share`` of the step periods since the previous one waited for input."""
        if not 0 <= share <= 1:
            return
        self._split_window(share)
        if math.isfinite(self._share_at):
            self._share_every = t - self._share_at
        self._share, self._share_at, self._held = share, t, True

    def _split_window(self, share: float) -> None:
        """Move ``share`` of the window's periods to ``input_wait``, from its productive
        time, never more than that: the hook counts the wait inside the step, a custom
        loop's fetch between two steps as fit's inside its train function."""
        window, settled = self._window, self._settled
        if self._held:
            self._count_window()
        wait = min(share * window.periods, window.productive)
        settled["productive"] -= wait
        settled["input_wait"] += wait
        self._window = _InputWindow()

    def _release_late(self, t: float) -> None:
        """Count the held window as it settled once steps that end at ``t`` have gone on
        past the hold with no new reading (the source stopped sending them)."""
        if self._held and t - self._share_at > max(
            INPUT_WAIT_HOLD_SECONDS, INPUT_WAIT_HOLD_READINGS * self._share_every
        ):
            self._count_window()

    def _count_window(self) -> None:
        self._settled["productive"] += self._window.productive
        self._settled["host_overhead"] += self._window.host
        self._held = False

    def _exported_past(self, phase: str) -> bool:
        """Whether more of ``phase`` was exported than is settled: a provisional reading."""
        return self._exported[phase] > self._settled[phase] + CLOCK_RESOLUTION

    # -- output --------------------------------------------------------------------------

    def breakdown(self, now: float, *, final: bool = False) -> Breakdown | None:
        """Seconds per phase of the wall time watched up to ``now`` (``final``: the run has
        ended there); None before any step record. Each phase only grows from one call to
        the next (they are exported as counters)."""
        self._close_open()
        if not self._seen:
            return None
        self._stall_sync()
        stalled = bool(self._stall.evaluate(now).findings)
        if self._first is not None and (final or stalled):  # no next record will come soon
            self._settle_first(self._first, typical=self._first.step)
        if final and self._held:  # no next reading: the latest splits what is held
            self._split_window(self._share)
        seconds = dict(self._settled)
        open_span = now - self._settled_at
        if open_span > 0 and self._first is None:
            if stalled:
                seconds["stalled"] += open_span
            elif final:  # after the last step: evaluation, saving, shutting down
                seconds["host_overhead"] += open_span
        if final and open_span > 0:
            self._settled, self._settled_at = dict(seconds), now
        return Breakdown(self._monotone(seconds))

    def _monotone(self, seconds: dict[str, float]) -> dict[str, float]:
        """``seconds``, with no phase below what was exported before: a provisional reading
        that the steps settled shorter keeps its time, taken from other phases' growth."""
        owed = 0.0
        for phase in PHASES:
            if seconds[phase] < self._exported[phase]:
                owed += self._exported[phase] - seconds[phase]
                seconds[phase] = self._exported[phase]
        for phase in TAKEN_FIRST:
            taken = min(owed, seconds[phase] - self._exported[phase])
            seconds[phase] -= taken
            owed -= taken
        self._exported = dict(seconds)
        return seconds

    def samples(self, now: float, *, final: bool = False) -> list[Sample]:
        """``wall_seconds{phase}`` and ``goodput_ratio`` at ``now``; none before a step."""
        breakdown = self.breakdown(now, final=final)
        if breakdown is None:
            return []
        samples = [
            Sample("wall_seconds", seconds, now, (("phase", phase),))
            for phase, seconds in breakdown.seconds.items()
        ]
        if math.isfinite(breakdown.ratio):
            samples.append(Sample("goodput_ratio", breakdown.ratio, now))
        return samples
