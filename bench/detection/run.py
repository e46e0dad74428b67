"""Detection benchmark: labeled synthetic runs through ``default_engine()``, at an accelerated
clock, scored against the detection goals.

Run from the repository root::

    .venv/bin/python bench/detection/run.py            # everything (~6 min on 2 cores)
    .venv/bin/python bench/detection/run.py --quick    # a subset, under a minute
    .venv/bin/python bench/detection/run.py --days 20  # fewer healthy days
    .venv/bin/python bench/detection/run.py --scenario leak_50 --scenario nan_at_3h

Each run's samples (see ``bench/detection/traces.py``) are fed to ``engine.observe`` in time
order; at each monitoring tick (10 s of simulated time, 0.5 s for the 15- and 40-second
runs) the tick's samples are fed and ``engine.evaluate(T)`` is called, and once a run
reaches its end, ``engine.evaluate(end, final=True)``, as the monitor does after the target
exits (a detection there is shown "at the end"). A finding of warning or
critical severity becomes an *episode* when its kind was not active at the previous
evaluation. An episode of an expected kind after the onset is a detection (the first one
gives the delay, in seconds and, for step-time scenarios, in steps); any other
warning/critical episode, or any before the onset, is a false finding. Healthy runs have no
onset: every episode is false. Each injected scenario runs with ``--seeds`` seeds (default
5); a goal passes only if every seed meets it.

Density and shortcuts, to fit about 10 minutes on two cores:

* ``engine.evaluate`` costs a few milliseconds, so evaluating every 10 s over 100 simulated
  days (864,000 calls) would take about an hour. The long healthy scenarios keep their
  10 s sample tick (the detectors see the same data) but are evaluated only every
  ``--healthy-eval`` seconds (default 60): a false finding that holds for less than that
  can be missed (on 10 healthy days, every 10 s found about twice the false episodes of
  every 60 s: flapping findings and stalls of 2-3 minutes). ``--healthy-eval 10``
  evaluates them at every tick. The 50 ms and 40-second healthy runs and every injected
  run are evaluated at every tick.
* The long healthy runs use 1-2 s steps (one ``step_seconds`` sample per step, as the hook
  sends); ``healthy_fast`` and the step-time scenarios use realistic 50 ms steps.
* Injected runs stop ``--linger`` simulated seconds (default 15 min) after their first
  detection: while the host-memory detector reports a leak, its leak-class diagnosis runs
  Theil-Sen and Mann-Kendall (O(n^2)) over the TF-allocator windows since the trend's
  start, so each evaluation costs 0.02-1 s and running the leak scenarios to their end
  would take longer than everything else together. "held" is the share of the evaluations
  after the detection at which an expected finding was still active (flapping).

Runs go to ``--jobs`` worker processes (default: all CPUs). Exit status 0, or 1 if a
detector raised (its traceback is printed).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from traces import (
    DAY,
    HEALTHY,
    HEALTHY_EXTRA,
    HOUR,
    INJECTED,
    SLOWDOWN_KINDS,
    T0,
    Label,
    Trace,
    TraceSpec,
)

from driftwatch.detect import Engine
from driftwatch.detect.catalog import default_engine
from driftwatch.findings import Finding, Severity

ALARM = (Severity.WARNING, Severity.CRITICAL)
QUICK_INJECTED = ("slow_step_10pct", "eventfile_300", "short_slowdown_3x", "short_leak_30gb")
QUICK_DAYS = 1.0
LINGER = 15 * 60.0


# -- one run -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Episode:
    """A warning/critical finding that became active at evaluation time ``t``."""

    kind: str
    severity: str
    t: float
    since: float
    step: int
    message: str
    evidence: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, finding: Finding, t: float, step: int) -> Episode:
        evidence = tuple(
            (k, f"{v:.4g}" if isinstance(v, float) else str(v))
            for k, v in sorted(finding.evidence.items())
        )
        return cls(
            finding.kind, finding.severity.value, t, finding.since, step, finding.message, evidence
        )


@dataclass(slots=True)
class RunResult:
    scenario: str
    seed: int
    seconds: float
    healthy: bool
    label: Label
    eval_every: float
    steps: int = 0
    onset_step: int | None = None
    detection: Episode | None = None
    detected_before_onset: bool = False
    false: list[Episode] = field(default_factory=list)
    tolerated: list[Episode] = field(default_factory=list)
    info: dict[str, float] = field(default_factory=dict)
    """Info-only kinds seen: kind -> first evaluation time."""
    error: str | None = None
    simulated: float = 0.0
    """Seconds actually simulated (less than ``seconds`` when stopped after detection)."""
    evaluations_after: int = 0
    held: float = math.nan
    """Share of the evaluations after the detection at which an expected kind held."""
    real_seconds: float = 0.0
    observe_seconds: float = 0.0
    evaluate_seconds: float = 0.0
    samples: int = 0
    step_samples: int = 0
    evaluations: int = 0
    at_end: bool = False
    """The detection came from the evaluation after the run ended (``final=True``)."""

    @property
    def delay(self) -> float:
        if self.detection is None or self.label.onset is None:
            return math.nan
        return self.detection.t - self.label.onset

    @property
    def delay_steps(self) -> float:
        if self.detection is None or self.onset_step is None:
            return math.nan
        return float(self.detection.step - self.onset_step)


class _Judge:
    """Sorts each evaluation's warning/critical findings into episodes (the detection,
    false ones, tolerated ones) and counts how long a detection holds afterwards."""

    def __init__(self, result: RunResult, linger: float) -> None:
        label = result.label
        self.result = result
        self.label = label
        self.onset = label.onset if label.onset is not None else math.inf
        self.relevant = label.expected | label.tolerated
        self.linger = linger
        self.active: set[str] = set()
        """Kinds at warning or critical at the previous evaluation."""
        self.stop_at = math.inf
        """When to stop the run: ``linger`` after the detection."""
        self.step = 0
        """The last ``train_step`` fed (an episode's step)."""
        self.held = 0
        """Evaluations after the detection at which an expected kind was active."""

    def classify(self, findings: list[Finding], tick: float) -> None:
        """Judge the findings of the evaluation at ``tick``."""
        alarms = self._alarms(findings, tick)
        for kind, finding in alarms.items():
            self._episode(kind, finding, tick)
        self.active = set(alarms)
        if self.result.detection is not None:
            self.result.evaluations_after += 1
            self.held += bool(self.active & self.label.expected)

    def _alarms(self, findings: list[Finding], tick: float) -> dict[str, Finding]:
        """The first warning/critical finding of each kind; info-only kinds are noted with
        the first time they were seen."""
        alarms: dict[str, Finding] = {}
        for finding in findings:
            if finding.severity in ALARM:
                alarms.setdefault(finding.kind, finding)
            else:
                self.result.info.setdefault(finding.kind, tick)
        return alarms

    def _episode(self, kind: str, finding: Finding, tick: float) -> None:
        """File one alarm: the first expected one after the onset is the detection; a kind
        that was not active before is a false episode, or a tolerated one when relevant."""
        result = self.result
        fresh = kind not in self.active
        expected = kind in self.label.expected and tick >= self.onset
        if expected and result.detection is None:
            result.detection = Episode.of(finding, tick, self.step)
            result.detected_before_onset = not fresh
            self.stop_at = tick + self.linger
        elif fresh and (tick < self.onset or kind not in self.relevant):
            result.false.append(Episode.of(finding, tick, self.step))
        elif fresh:
            result.tolerated.append(Episode.of(finding, tick, self.step))


def run_one(spec: TraceSpec, eval_every: float, linger: float = math.inf) -> RunResult:
    """Feed one trace to a fresh ``default_engine()`` and classify what it reports; stop
    ``linger`` simulated seconds after the first detection."""
    trace = Trace(spec)
    result = RunResult(spec.name, spec.seed, spec.seconds, spec.healthy, spec.label, eval_every)
    judge = _Judge(result, linger)
    engine = default_engine()
    start = time.perf_counter()
    try:
        if _feed_ticks(trace, engine, judge, eval_every):
            # the run ended: judged once more, over all of it, as the monitor does
            _judge_the_end(engine, judge)
    except Exception:  # noqa: BLE001 - a detector bug: report it with its traceback, go on
        result.error = traceback.format_exc()
    result.held = judge.held / result.evaluations_after if result.evaluations_after else math.nan
    result.real_seconds = time.perf_counter() - start
    result.steps = trace.steps
    result.step_samples = trace.step_samples
    result.onset_step = trace.onset_step
    return result


def _feed_ticks(trace: Trace, engine: Engine, judge: _Judge, eval_every: float) -> bool:
    """Feed the trace tick by tick, evaluating every ``eval_every`` simulated seconds;
    whether it ran to its end (False: stopped ``linger`` after the detection)."""
    result = judge.result
    observe, evaluate = engine.observe, engine.evaluate
    clock = time.perf_counter
    next_eval = -math.inf
    for tick, batch in trace.ticks():
        a = clock()
        for sample in batch:
            observe(sample)
            if sample.series == "train_step":
                judge.step = int(sample.value)
        b = clock()
        result.observe_seconds += b - a
        result.samples += len(batch)
        if tick > judge.stop_at:
            return False
        result.simulated = tick - T0
        if tick < next_eval:
            continue
        next_eval = tick + eval_every - 1e-6
        findings = evaluate(tick)
        result.evaluate_seconds += clock() - b
        result.evaluations += 1
        judge.classify(findings, tick)
    return True


def _judge_the_end(engine: Engine, judge: _Judge) -> None:
    """The evaluation after the run's end (``final=True``), over all of it; a detection
    there is shown "at the end"."""
    result = judge.result
    end = T0 + result.simulated
    b = time.perf_counter()
    findings = engine.evaluate(end, final=True)
    result.evaluate_seconds += time.perf_counter() - b
    result.evaluations += 1
    detected = result.detection
    judge.classify(findings, end)
    result.at_end = detected is None and result.detection is not None


Job = tuple[TraceSpec, float, float]
"""(spec, evaluate every, linger after detection)."""


def _run_job(job: Job) -> RunResult:
    return run_one(*job)


# -- the plan ----------------------------------------------------------------------------


def healthy_jobs(days: float, eval_every: float, seed: int) -> list[Job]:
    """Runs of the long healthy scenarios, with new seeds, making up ``days`` together with
    the extra healthy runs (equal shares; each scenario in runs of its own default length)."""
    jobs: list[Job] = []
    extras = [factory(seed) for factory in HEALTHY_EXTRA.values()] if days >= 1 else []
    jobs.extend((spec, spec.tick, math.inf) for spec in extras)
    share = max(0.0, days * DAY - sum(spec.seconds for spec in extras)) / len(HEALTHY)
    for name in HEALTHY:
        jobs.extend(healthy_runs(name, share, eval_every, seed))
    return jobs


def healthy_runs(name: str, seconds: float, eval_every: float, seed: int) -> list[Job]:
    """Runs of one long healthy scenario, each of its default length (new seeds), making up
    ``seconds``; a remainder under 6 h is folded into the last run."""
    factory = HEALTHY[name]
    jobs: list[Job] = []
    left = seconds
    run = 0
    while left > 60:
        spec = factory(seed + 1000 * run)
        length = min(spec.seconds, left)
        if left - length < 6 * HOUR:
            length = left
        jobs.append((spec.with_run(spec.seed, length), eval_every, math.inf))
        left -= length
        run += 1
    return jobs


def injected_runs(name: str, seed: int, seeds: int, linger: float) -> list[Job]:
    """``seeds`` runs of one injected scenario."""
    runs: list[Job] = []
    for k in range(seeds):
        spec = INJECTED[name](seed + k)
        runs.append((spec, spec.tick, linger))
    return runs


def plan(args: argparse.Namespace) -> list[Job]:
    seed: int = args.seed
    linger: float = args.linger if args.linger >= 0 else math.inf
    seeds: int = args.seeds if args.seeds is not None else (1 if args.quick else 5)
    if not args.scenario:
        days = args.days if args.days is not None else (QUICK_DAYS if args.quick else 100.0)
        jobs = healthy_jobs(days, args.healthy_eval, seed)
        for name in QUICK_INJECTED if args.quick else INJECTED:
            jobs.extend(injected_runs(name, seed, seeds, linger))
        return jobs
    jobs = []
    for name in args.scenario:
        if name in INJECTED:
            jobs.extend(injected_runs(name, seed, seeds, linger))
        elif name in HEALTHY:
            default = HEALTHY[name](seed).seconds
            total = args.days * DAY if args.days is not None else default
            jobs.extend(healthy_runs(name, total, args.healthy_eval, seed))
        elif name in HEALTHY_EXTRA:
            spec = HEALTHY_EXTRA[name](seed)
            jobs.append((spec, spec.tick, math.inf))
        else:
            known = sorted([*INJECTED, *HEALTHY, *HEALTHY_EXTRA])
            raise SystemExit(f"unknown scenario {name!r}; known: {', '.join(known)}")
    return jobs


def estimated_cost(job: Job) -> float:
    """Rough seconds of CPU a job needs (to start the longest first)."""
    spec, eval_every, _ = job
    evaluate = 0.05 if not spec.healthy and spec.seconds > HOUR else 3e-3  # leak reports
    return spec.seconds / spec.steps.seconds * 20e-6 + spec.seconds / eval_every * evaluate


def execute(jobs: Sequence[Job], workers: int, progress: Callable[[str], None]) -> list[RunResult]:
    ordered = sorted(jobs, key=estimated_cost, reverse=True)
    results: list[RunResult] = []
    if workers <= 1:
        for job in ordered:
            results.append(run_one(*job))
            progress(_progress_line(results[-1], len(results), len(ordered)))
        return results
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        for result in pool.imap_unordered(_run_job, ordered):
            results.append(result)
            progress(_progress_line(result, len(results), len(ordered)))
    return results


def _progress_line(result: RunResult, done: int, total: int) -> str:
    state = "ERROR" if result.error else f"{len(result.false)} false"
    return (
        f"  [{done}/{total}] {result.scenario} seed {result.seed} "
        f"({_duration(result.seconds)}): {state}, {result.real_seconds:.1f} s"
    )


# -- reporting ---------------------------------------------------------------------------


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "-"
    sign = "-" if seconds < 0 else ""
    seconds = abs(seconds)
    if seconds < 120:
        return f"{sign}{seconds:.1f} s"
    if seconds < 2 * HOUR:
        return f"{sign}{seconds / 60:.1f} min"
    if seconds < 2 * DAY:
        return f"{sign}{seconds / HOUR:.2f} h"
    return f"{sign}{seconds / DAY:.1f} d"


def _signed(seconds: float) -> str:
    return ("+" if seconds >= 0 else "") + _duration(seconds)


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out.extend("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)
    return "\n".join(out)


def _counts_steps(result: RunResult) -> bool:
    return bool(result.label.expected & SLOWDOWN_KINDS) and not math.isnan(result.delay_steps)


def _spread(values: Sequence[float], fmt: Callable[[float], str]) -> str:
    """``median (min-max)`` of the finite values, or ``-``."""
    finite = sorted(v for v in values if math.isfinite(v))
    if not finite:
        return "-"
    median = fmt(statistics.median(finite))
    if len(finite) == 1:
        return median
    return f"{median} ({fmt(finite[0])}..{fmt(finite[-1])})"


def _steps(value: float) -> str:
    return f"{value:,.0f}"


def by_scenario(results: Sequence[RunResult]) -> dict[str, list[RunResult]]:
    grouped: dict[str, list[RunResult]] = {}
    for r in sorted(results, key=lambda r: r.seed):
        grouped.setdefault(r.scenario, []).append(r)
    return grouped


def injected_table(results: Sequence[RunResult]) -> str:
    rows = []
    grouped = by_scenario(results)
    for name in [n for n in INJECTED if n in grouped]:
        runs = grouped[name]
        label = runs[0].label
        found = [r for r in runs if r.detection is not None]
        kinds = Counter(
            f"{r.detection.kind}/{r.detection.severity[0].upper()}" for r in found if r.detection
        )
        errors = sum(1 for r in runs if r.error)
        detected = f"{len(found)}/{len(runs)}" + (f", {errors} ERROR" if errors else "")
        notes = []
        if label.onset is not None and found:
            errs = [r.detection.since - label.onset for r in found if r.detection]
            notes.append(f"since-onset {_spread(errs, _duration)}")
        if label.evidence and found:
            for key, _ in label.evidence:
                got = Counter(
                    dict(r.detection.evidence).get(key, "?") for r in found if r.detection
                )
                notes.append(f"{key}: " + ", ".join(f"{v} x{n}" for v, n in got.most_common()))
        if label.ideal:
            saw = [r.info[label.ideal] - (label.onset or T0) for r in runs if label.ideal in r.info]
            if saw:
                notes.append(f"info {label.ideal} in {len(saw)}/{len(runs)}")
        before = sum(1 for r in runs if r.detected_before_onset)
        if before:
            notes.append(f"{before} already active before onset")
        rows.append(
            [
                name,
                label.injected,
                _duration((label.onset or T0) - T0),
                detected,
                ", ".join(f"{k} x{n}" for k, n in kinds.most_common()) or "-",
                _spread([r.delay for r in runs], _duration),
                _spread([r.delay_steps for r in runs], _steps) if _counts_steps(runs[0]) else "-",
                _spread([r.held for r in runs], lambda v: f"{v:.0%}"),
                str(sum(len(r.false) for r in runs)),
                "; ".join(notes),
                f"{sum(r.real_seconds for r in runs):.1f}",
            ]
        )
    headers = [
        "scenario",
        "injected",
        "onset",
        "detected",
        "first kind (W/C)",
        "delay: median (min..max)",
        "steps",
        "held",
        "false",
        "notes",
        "real s",
    ]
    return _table(headers, rows)


def healthy_table(results: Sequence[RunResult]) -> tuple[str, float, int]:
    by: dict[str, list[RunResult]] = {}
    for r in results:
        by.setdefault(r.scenario, []).append(r)
    rows = []
    total_days = 0.0
    total_false = 0
    for name in [*HEALTHY, *HEALTHY_EXTRA]:
        runs = by.get(name)
        if not runs:
            continue
        days = sum(r.seconds for r in runs) / DAY
        false = [e for r in runs for e in r.false]
        kinds = Counter(e.kind for e in false)
        total_days += days
        total_false += len(false)
        rows.append(
            [
                name,
                str(len(runs)),
                f"{days:.2f}",
                f"{sum(r.steps for r in runs):,}",
                _duration(runs[0].eval_every),
                f"{sum(1 for r in runs if r.false)}/{len(runs)}",
                str(len(false)),
                f"{len(false) / days:.2f}" if days else "-",
                ", ".join(f"{k} x{n}" for k, n in kinds.most_common()) or "-",
                ", ".join(sorted({k for r in runs for k in r.info})) or "-",
                f"{sum(r.real_seconds for r in runs):.1f}",
            ]
        )
    rows.append(
        [
            "TOTAL",
            str(sum(len(v) for v in by.values())),
            f"{total_days:.2f}",
            f"{sum(r.steps for r in results):,}",
            "",
            f"{sum(1 for r in results if r.false)}/{len(results)}",
            str(total_false),
            f"{total_false / total_days:.3f}" if total_days else "-",
            "",
            "",
            f"{sum(r.real_seconds for r in results):.1f}",
        ]
    )
    headers = [
        "healthy scenario",
        "runs",
        "sim days",
        "steps",
        "eval every",
        "runs w/ false",
        "false",
        "false/day",
        "false kinds",
        "info kinds seen",
        "real s",
    ]
    return _table(headers, rows), total_days, total_false


def goals_table(injected: Sequence[RunResult], days: float, false: int, healthy_run: bool) -> str:
    rows: list[list[str]] = []
    if healthy_run:
        verdict = "PASS" if false == 0 and days >= 100 else "FAIL"
        if false == 0 and days < 100:
            verdict = f"n/a ({days:.1f} < 100 days)"
        rows.append(
            [
                "no warning/critical over >= 100 healthy days (incl. slow wander)",
                f"{false} false findings in {days:.1f} days ({false / max(days, 1e-9):.3f}/day)",
                verdict,
            ]
        )
    goals: dict[str, dict[str, list[RunResult]]] = {}
    for r in injected:
        if r.label.goal is not None:
            goals.setdefault(r.label.goal.name, {}).setdefault(r.scenario, []).append(r)
    for name, scenarios in goals.items():
        parts = []
        ok = True
        for scenario, runs in scenarios.items():
            goal = runs[0].label.goal
            assert goal is not None
            if goal.silent:
                bad = [
                    e
                    for r in runs
                    for e in r.false
                    if e.kind in goal.silent and e.t >= (r.label.onset or T0)
                ]
                step = sum(1 for r in runs if "memory_step" in r.info)
                parts.append(
                    f"{scenario}: {len(bad)} leak findings after the jump in {len(runs)} runs"
                    + (f" (first: {bad[0].kind})" if bad else "")
                    + f", memory_step info in {step}/{len(runs)}"
                )
                ok = ok and not bad and not any(r.error for r in runs)
                continue
            in_steps = math.isfinite(goal.max_steps)
            good = [
                r
                for r in runs
                if r.detection is not None
                and not r.error
                and not r.detected_before_onset
                and r.delay <= goal.max_delay
                and r.delay_steps <= goal.max_steps
            ]
            values = [r.delay_steps if in_steps else r.delay for r in runs]
            worst = max((v if math.isfinite(v) else math.inf) for v in values)
            fmt = _steps if in_steps else _duration
            limit = fmt(goal.max_steps if in_steps else goal.max_delay)
            missed = sum(1 for r in runs if r.detection is None)
            parts.append(
                f"{scenario}: {len(good)}/{len(runs)} within {limit}{' steps' * in_steps}, "
                f"median {_spread(values, fmt).split(' (')[0]}, worst "
                + ("not detected" if math.isinf(worst) else fmt(worst))
                + (f" ({missed} missed)" if missed else "")
            )
            ok = ok and len(good) == len(runs)
        rows.append([name, "; ".join(parts), "PASS" if ok else "FAIL"])
    return _table(["goal", "measured (all seeds)", "verdict"], rows)


def per_seed(results: Sequence[RunResult]) -> str:
    """Each injected run's delay, by scenario and seed."""
    lines = []
    grouped = by_scenario(results)
    for name in [n for n in INJECTED if n in grouped]:
        cells = []
        for r in grouped[name]:
            if r.error:
                cells.append(f"{r.seed}: ERROR")
            elif r.detection is None:
                cells.append(f"{r.seed}: missed")
            else:
                steps = f"/{r.delay_steps:,.0f} steps" if _counts_steps(r) else ""
                at_end = " at the end" if r.at_end else ""
                cells.append(f"{r.seed}: {_duration(r.delay)}{steps}{at_end}")
        lines.append(f"- {name}: " + "; ".join(cells))
    return "\n".join(lines)


def false_details(results: Sequence[RunResult], per_kind: int) -> str:
    lines: list[str] = []
    shown: Counter[tuple[str, str]] = Counter()
    for r in results:
        for e in r.false:
            key = (r.scenario, e.kind)
            shown[key] += 1
            if shown[key] > per_kind:
                continue
            onset = r.label.onset
            when = f"+{_duration(e.t - T0)} into the run"
            if onset is not None:
                when += f" ({_duration(e.t - onset)} from onset)"
            lines.append(
                f"- {r.scenario} seed {r.seed}: {e.kind} ({e.severity}) at {when}, "
                f"since +{_duration(e.since - T0)}, step {e.step:,}"
            )
            lines.append(f"    message: {e.message}")
            lines.append(f"    evidence: {', '.join(f'{k}={v}' for k, v in e.evidence)}")
    more = sum(max(0, n - per_kind) for n in shown.values())
    if more:
        lines.append(f"  ... and {more} more (--show N to see more per scenario and kind)")
    return "\n".join(lines) if lines else "none"


def cost_summary(results: Sequence[RunResult]) -> str:
    samples = sum(r.samples for r in results)
    observe = sum(r.observe_seconds for r in results)
    evaluations = sum(r.evaluations for r in results)
    evaluate = sum(r.evaluate_seconds for r in results)
    real = sum(r.real_seconds for r in results)
    steps = sum(r.step_samples for r in results)
    lines = [
        f"samples fed: {samples:,} ({steps:,} steps, 2 samples each, plus tick samples)",
        f"engine.observe: {observe:.1f} s in all, {observe / max(samples, 1) * 1e6:.2f} us/sample "
        "(loop overhead included)",
        f"engine.evaluate: {evaluations:,} calls, {evaluate:.1f} s in all, "
        f"{evaluate / max(evaluations, 1) * 1e3:.2f} ms/call",
        f"trace generation and bookkeeping: {real - observe - evaluate:.1f} s",
        f"simulated {sum(r.seconds for r in results) / DAY:.1f} days in {real:.1f} CPU s",
    ]
    worst = sorted(
        (r for r in results if r.evaluations),
        key=lambda r: r.evaluate_seconds / r.evaluations,
        reverse=True,
    )[:3]
    if worst:
        lines.append(
            "slowest evaluate: "
            + ", ".join(
                f"{r.scenario} {r.evaluate_seconds / r.evaluations * 1e3:.2f} ms" for r in worst
            )
        )
    return "\n".join(lines)


def code_version() -> str:
    """The commit the detectors come from, and whether driftwatch/ has local changes."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "driftwatch"], capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown commit"
    return f"commit {head}" + (" + local changes in driftwatch/" if dirty else "")


def _parser() -> argparse.ArgumentParser:
    """The command line (see the module's docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a subset, under a minute")
    parser.add_argument("--days", type=float, help="simulated healthy days (default 100)")
    parser.add_argument("--scenario", action="append", help="run only this scenario (repeatable)")
    parser.add_argument("--seed", type=int, default=0, help="base seed (default 0)")
    parser.add_argument(
        "--seeds", type=int, help="runs of each injected scenario (default 5, 1 with --quick)"
    )
    parser.add_argument(
        "--healthy-eval",
        type=float,
        default=60.0,
        help="evaluate the long healthy runs every this many simulated seconds (default 60)",
    )
    parser.add_argument(
        "--linger",
        type=float,
        default=LINGER,
        help="simulated seconds an injected run goes on after its detection (default 900; "
        "-1: to its end)",
    )
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    parser.add_argument(
        "--show", type=int, default=1, help="false findings shown per scenario and kind"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    jobs = plan(args)
    print(
        f"driftwatch detection benchmark: {len(jobs)} runs, "
        f"{sum(job[0].seconds for job in jobs) / DAY:.1f} simulated days, {args.jobs} workers, "
        f"python {platform.python_version()} on {platform.machine()} "
        f"({os.cpu_count()} CPUs), detectors at {code_version()}",
        flush=True,
    )
    started = time.perf_counter()
    results = execute(jobs, args.jobs, lambda line: print(line, file=sys.stderr, flush=True))
    wall = time.perf_counter() - started

    print()
    _print_scores(results, args.show)
    _print_tolerated([r for r in results if not r.healthy])
    print()
    print("== Engine cost ==")
    print(cost_summary(results))
    print(f"wall time: {wall:.1f} s with {args.jobs} workers")
    return _print_errors(results)


def _print_scores(results: Sequence[RunResult], show: int) -> None:
    """The healthy, injected, per-seed, goals and false-findings sections."""
    healthy = [r for r in results if r.healthy]
    injected = [r for r in results if not r.healthy]
    days = 0.0
    false = 0
    if healthy:
        table, days, false = healthy_table(healthy)
        print("== Healthy runs (every warning/critical finding is false) ==")
        print(table)
        print()
    if injected:
        print("== Injected problems (each with --seeds seeds) ==")
        print(injected_table(injected))
        print()
        print("== Delay per seed ==")
        print(per_seed(injected))
        print()
    print("== Goals ==")
    print(goals_table(injected, days, false, bool(healthy)))
    print()
    print("== False findings (first of each kind per scenario) ==")
    print(false_details(sorted(results, key=lambda r: (r.scenario, r.seed)), show))


def _print_tolerated(injected: Sequence[RunResult]) -> None:
    """The other warning/critical episodes after the onset, by scenario (if any)."""
    tolerated = [(r, e) for r in injected for e in r.tolerated]
    if not tolerated:
        return
    print()
    print("== Other warning/critical episodes after the onset (re-raised, or a consequence) ==")
    grouped: dict[str, Counter[str]] = {}
    for r, e in tolerated:
        grouped.setdefault(r.scenario, Counter())[e.kind] += 1
    for name, kinds in grouped.items():
        print(f"- {name}: " + ", ".join(f"{k} x{n}" for k, n in kinds.most_common()))


def _print_errors(results: Sequence[RunResult]) -> int:
    """The tracebacks of the runs a detector raised in; the exit status (1 if any)."""
    errors = [r for r in results if r.error]
    if not errors:
        return 0
    print()
    print("== Exceptions ==")
    for r in errors:
        print(f"- {r.scenario} seed {r.seed}:")
        print(r.error)
    return 1


if __name__ == "__main__":
    sys.exit(main())
