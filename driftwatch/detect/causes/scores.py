"""How much each cause's signals moved between the two sides of a finding: its score.

One scorer per cause (or family of causes), each reading a ``Signals``: what a signal did
before and after (or between stalls and during them). A score of 1 is the least change that
counts (the ``*_STEP`` constants); the ranking is in ``driftwatch.detect.causes.ranker``.
Reasoning and the figures behind each step: docs/causes.md, "Scores".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

from driftwatch.causes import RankedCause
from driftwatch.series import Labels

THROTTLE_SHARE_STEP = 0.25
"""Rise in the share of time a GPU's clocks are held down for a reason that scores 1."""
CLOCK_DROP_STEP = 0.10
"""Fall of a GPU's mean SM clock, as a share of what it was, that adds 1."""
PRESSURE_STEP = 0.10
"""Rise in the node's CPU (or I/O) pressure, seconds stalled per second, that scores 1."""
CPU_DROP_STEP = 0.25
"""Fall of the target's CPU time per wall second, as a share, that adds 1 to contention."""
CONTENDED = 0.5
"""Node CPU pressure (s/s) from which the node counts as contended, risen or not (saturated)."""
CPU_DROP_ALONE = 0.5
"""The same fall that scores 1 alone, where the node has no pressure information."""
QUOTA_STEP = 0.10
"""Rise in the cgroup's throttled seconds per second that scores 1."""
INPUT_WAIT_STEP = 0.05
"""Rise in the share of step time waiting for input that scores 1 (the Profiler's band)."""
INPUT_EXPLAINS_STEP = 0.5
"""Part of the step's rise that the rise of the wait for input per step makes up that
scores 1 (all of it: 2)."""
STEP_RISE_FLOOR = 0.05
"""Least rise of the mean step, as a share of what it was, whose parts are scored (half the
least slowdown reported)."""
COLLECTIVE_WAIT_STEP = 0.05
"""Rise in the share of step time waiting at the collectives that scores 1 (as for input)."""
STOPPED_STEP = 0.25
"""Share of a stall's time the process was stopped that scores 1."""
HOST_SHARE_STEP = 0.10
"""Rise in the share of step time spent outside the train step that scores 1."""
TRACES_STEP = 0.01
"""Rise in traces (or retracing warnings) per step that scores 1: one in a hundred steps."""
NEAR_LIMIT = 0.85
"""Share of its limit above which resident memory starts to score."""
NEAR_LIMIT_STEP = 0.05
"""Share of the limit past ``NEAR_LIMIT`` that scores 1."""
FRAGMENTED = 1.5
"""Ratio of the allocator's peak to what it holds from which fragmentation can score."""
FRAGMENTATION_STEP = 0.25
"""Rise of that ratio, as a share of what it was, that scores 1."""
VOLUME_FLOOR = 16 * 1024.0
"""Bytes per second by which a write or read rate must rise to count at all."""
READ_FLOOR = 1024.0 * 1024.0
"""Bytes per second by which storage reads must rise to count at all."""

REASON_CAUSES = {
    "thermal": "gpu_thermal",
    "power_cap": "gpu_power_cap",
    "hw_slowdown": "gpu_hw_slowdown",
}
"""The cause of each clock-event reason NVML reports (the ``reason`` label)."""


class Signals(Protocol):
    """What each signal did on the two sides of a comparison: (before, after), NaN where
    there is no data."""

    def labels(self, series: str) -> list[Labels]: ...

    def mean(self, series: str, labels: Labels = ()) -> tuple[float, float]: ...

    def rate(self, series: str, labels: Labels = ()) -> tuple[float, float]: ...


Scorer = Callable[[Signals], Iterable[RankedCause]]


def _rise(pair: tuple[float, float]) -> float:
    """After minus before; NaN where either is missing."""
    return pair[1] - pair[0]


def _drop(pair: tuple[float, float]) -> float:
    """The fall from before to after as a share of before (0 if it rose; NaN: no data)."""
    before, after = pair
    return max(0.0, 1 - after / before) if before > 0 and math.isfinite(after) else math.nan


def _numbers(**pairs: tuple[float, float] | float) -> dict[str, float]:
    """``name_before``/``name_after`` of each pair (single values as they are), finite only."""
    numbers: dict[str, float] = {}
    for name, value in pairs.items():
        if isinstance(value, tuple):
            numbers[f"{name}_before"], numbers[f"{name}_after"] = value
        else:
            numbers[name] = value
    return {k: v for k, v in numbers.items() if math.isfinite(v)}


def _positive(value: float) -> float:
    return value if value > 0 else 0.0  # NaN too


def gpu_clocks(signals: Signals) -> Iterator[RankedCause]:
    """A throttle reason on more of the time, and the SM clock lower, on any GPU."""
    for labels in signals.labels("gpu_clock_throttled"):
        named = dict(labels)
        cause = REASON_CAUSES.get(named.get("reason", ""))
        throttled = signals.mean("gpu_clock_throttled", labels)
        if cause is None or not _rise(throttled) > 0:
            continue
        gpu = (("gpu", named.get("gpu", "")),)
        clock = signals.mean("gpu_sm_clock_hertz", gpu)
        score = _rise(throttled) / THROTTLE_SHARE_STEP + _positive(_drop(clock)) / CLOCK_DROP_STEP
        numbers = _numbers(
            throttled_share=throttled,
            sm_clock_hertz=clock,
            sm_clock_max_hertz=signals.mean("gpu_sm_clock_max_hertz", gpu)[1],
        )
        yield RankedCause(cause, score, numbers, f"GPU {named.get('gpu', '?')}")


def host_cpu(signals: Signals) -> Iterator[RankedCause]:
    """The node's CPU pressure up, the target's CPU time per second down; the quota."""
    pressure = signals.rate("pressure_some_seconds", (("resource", "cpu"),))
    cores = signals.rate("cpu_seconds")
    drop = _positive(_drop(cores))
    if math.isfinite(_rise(pressure)):
        score = _positive(_rise(pressure)) / PRESSURE_STEP
        contended = score > 0 or pressure[1] >= CONTENDED
        score += drop / CPU_DROP_STEP if contended else 0.0
    else:
        score = drop / CPU_DROP_ALONE
    yield RankedCause(
        "host_cpu_contention", score, _numbers(cpu_pressure_share=pressure, target_cpu_cores=cores)
    )
    throttled = signals.rate("cgroup_cpu_throttled_seconds")
    score = _positive(_rise(throttled)) / QUOTA_STEP
    yield RankedCause("cgroup_cpu_throttled", score, _numbers(quota_throttled_share=throttled))


def _input_wait(signals: Signals) -> tuple[float, float]:
    return signals.mean("input_wait_share")


def _wait(signals: Signals, series: str, share_step: float) -> tuple[float, dict[str, float]]:
    """The score of a wait inside the step (its share of step time: ``series``) that rose by
    ``share_step`` or made up much of the step's rise (share x mean step), and its numbers: a
    share near 1 can hardly rise, nor one whose step grows with its wait."""
    share = signals.mean(series)
    step = signals.mean("step_seconds")
    wait = (share[0] * step[0], share[1] * step[1])
    score = max(_positive(_rise(share)) / share_step, _made_up(wait, step) / INPUT_EXPLAINS_STEP)
    prefix = series.removesuffix("_share")
    numbers = {f"{prefix}_share": share, "wait_per_step_seconds": wait, "step_seconds": step}
    return score, _numbers(**numbers)


def _made_up(part: tuple[float, float], whole: tuple[float, float]) -> float:
    """How much of ``whole``'s rise ``part``'s rise makes up, at most all of it (0 where
    ``whole`` rose less than ``STEP_RISE_FLOOR`` of what it was, or there is no data)."""
    rise = _rise(whole)
    if not rise >= STEP_RISE_FLOOR * whole[0]:
        return 0.0
    return min(1.0, _positive(_rise(part)) / rise)


def input_wait(signals: Signals) -> Iterator[RankedCause]:
    """More of each step waiting for the input pipeline (the hook's input-wait share)."""
    yield RankedCause("input_wait", *_wait(signals, "input_wait_share", INPUT_WAIT_STEP))


def collective_wait(signals: Signals) -> Iterator[RankedCause]:
    """More of each step waiting at the collectives for the other ranks (a multi-worker
    job's ``collective_wait_share``): the step of a rank that waits for a straggler."""
    yield RankedCause(
        "collective_wait", *_wait(signals, "collective_wait_share", COLLECTIVE_WAIT_STEP)
    )


def stopped(signals: Signals) -> Iterator[RankedCause]:
    """The process stopped for much of the time (state T: SIGSTOP, a tracer)."""
    share = signals.mean("process_stopped")
    score = _positive(share[1]) / STOPPED_STEP
    yield RankedCause("process_stopped", score, _numbers(stopped_share=share))


def host_time(signals: Signals) -> Iterator[RankedCause]:
    """More of each step outside the train step (less what waits for input, when known)."""
    gap = signals.mean("step_gap_seconds")
    step = signals.mean("step_seconds")
    wait = _input_wait(signals)
    shares = tuple(
        g / s - (w if math.isfinite(w) else 0.0) if s > 0 else math.nan
        for g, s, w in zip(gap, step, wait, strict=True)
    )
    share = (shares[0], shares[1])
    score = _positive(_rise(share)) / HOST_SHARE_STEP
    yield RankedCause(
        "host_time", score, _numbers(outside_step_seconds=gap, outside_step_share=share)
    )


def retracing(signals: Signals) -> Iterator[RankedCause]:
    """More traces (or retracing warnings) per step: their count's rise over the steps'."""
    steps = signals.rate("train_step")
    best = 0.0, (math.nan, math.nan)
    for series in ("tracing_count", "retracing_warnings_total"):
        traces = signals.rate(series)
        per_step = tuple(t / s if s > 0 else math.nan for t, s in zip(traces, steps, strict=True))
        if not math.isfinite(per_step[1]):
            continue
        pair = (per_step[0] if math.isfinite(per_step[0]) else 0.0, per_step[1])
        score = _positive(_rise(pair)) / TRACES_STEP
        if score > best[0]:
            best = score, pair
    yield RankedCause("retracing", best[0], _numbers(traces_per_step=best[1]))


def memory(signals: Signals) -> Iterator[RankedCause]:
    """Resident memory near its limit; the allocator's peak far above what it holds."""
    rss, limit = signals.mean("rss_bytes"), signals.mean("memory_limit_bytes")
    share = tuple(r / m if m > 0 else math.nan for r, m in zip(rss, limit, strict=True))
    score = _positive(share[1] - NEAR_LIMIT) / NEAR_LIMIT_STEP
    yield RankedCause("memory_near_limit", score, _numbers(memory_limit_share=(share[0], share[1])))
    for labels in signals.labels("tf_allocator_peak_bytes"):
        peak = signals.mean("tf_allocator_peak_bytes", labels)
        held = signals.mean("tf_allocator_current_bytes", labels)
        ratio = tuple(p / c if c > 0 else math.nan for p, c in zip(peak, held, strict=True))
        if not ratio[1] >= FRAGMENTED:
            continue
        rise = ratio[1] / ratio[0] - 1 if ratio[0] > 0 else math.nan
        yield RankedCause(
            "allocator_fragmentation",
            _positive(rise) / FRAGMENTATION_STEP,
            _numbers(peak_to_held_ratio_x=(ratio[0], ratio[1])),
            dict(labels).get("device", ""),
        )


def _volume(signals: Signals, series: str, floor: float) -> tuple[float, tuple[float, float]]:
    """The score of a byte rate that rose (doublings, once it rose by ``floor`` or more)."""
    rate = signals.rate(series)
    if not _rise(rate) >= floor:
        return 0.0, rate
    return math.log2(rate[1] / max(rate[0], floor / 16)), rate


def volumes(signals: Signals) -> Iterator[RankedCause]:
    """Event files, uploads and storage reads: more bytes per second; I/O pressure up."""
    for cause, series in (
        ("event_file_volume", "event_file_bytes"),
        ("upload_volume", "nondisk_write_bytes"),
    ):
        score, rate = _volume(signals, series, VOLUME_FLOOR)
        yield RankedCause(cause, score, _numbers(written_bytes_per_second=rate))
    score, rate = _volume(signals, "read_bytes", READ_FLOOR)
    pressure = signals.rate("pressure_some_seconds", (("resource", "io"),))
    score = max(score, _positive(_rise(pressure)) / PRESSURE_STEP)
    yield RankedCause(
        "storage_reads", score, _numbers(read_bytes_per_second=rate, io_pressure_share=pressure)
    )


SCORERS: tuple[Scorer, ...] = (
    gpu_clocks,
    host_cpu,
    input_wait,
    collective_wait,
    stopped,
    host_time,
    retracing,
    memory,
    volumes,
)
"""Every scorer, each naming the causes of its signals."""
