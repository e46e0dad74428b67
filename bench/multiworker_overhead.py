"""What does the hook cost a worker of a distributed job?

Run: ``.venv/bin/python bench/multiworker_overhead.py`` (about 5 minutes on a 2-core box).
It always exits 0: it is a measurement, not a test.

A real 2-worker ``MultiWorkerMirroredStrategy`` job (``tests/data/programs/mwms_worker.py``:
a custom loop with ``strategy.run``, CPU, ``TF_CONFIG`` on loopback ports) trains for
``--seconds`` under each configuration:

* ``none``: plain Python, no driftwatch;
* ``none-again``: the same again: the A/A control, whose spread is the run's resolution;
* ``driftwatch``: the hook injected as ``driftwatch run`` injects it (``PYTHONPATH`` led by
  ``driftwatch/hook/inject``), with no monitor reading it: the train step timed, its
  ``tf.data`` fetch and, in each traced step, its all-reduces timed in the graph (two
  timestamps and an ``assign_add`` to a host variable each: the collective wait).

Every round runs each configuration once, the order rotated each round. The figure is each
job's median step time (the slower rank's; both ranks step together), as a ratio to
``none`` in the same round; the report gives the median of the per-round ratios with a
distribution-free 95 % confidence interval. The goal is the hook's: at most 1.02x.

Micro: what timing one op in the graph costs (``GraphTimings.timed``: two timestamps and an
``assign_add`` to a host variable, as around each all-reduce and each fetch), in a
``tf.function`` of ``MICRO_OPS`` small ops with and without it, called alternately, the
median of ``MICRO_REPEATS`` repeats: its cost per step is that times the ops a step times.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from hook_overhead import median_confidence_interval, rotated

REPO = Path(__file__).resolve().parent.parent
WORKER = REPO / "tests" / "data" / "programs" / "mwms_worker.py"
INJECT = REPO / "driftwatch" / "hook" / "inject"
CONFIGURATIONS = ("none", "none-again", "driftwatch")
GOAL = 1.02
"""The hook-overhead goal: a hooked job's step at most this many times a plain one's."""
MICRO_OPS = 3
"""Small ops in the micro benchmark's function: a train step times three (two all-reduces
and its fetch)."""
MICRO_CALLS = 2000
"""Calls per repeat of the micro benchmark."""
MICRO_REPEATS = 7
"""Repeats of the micro benchmark, alternating the two functions."""


def free_ports(count: int) -> list[int]:
    """Ports free on loopback now (a worker binds its own a moment later)."""
    with ExitStack() as stack:
        bound = [stack.enter_context(socket.create_server(("127.0.0.1", 0))) for _ in range(count)]
        return [sock.getsockname()[1] for sock in bound]


def job_step_ms(configuration: str, seconds: float, workers: int = 2) -> float:
    """The median step, in milliseconds, of one job run under ``configuration`` (the slower
    rank's)."""
    cluster = {"worker": [f"127.0.0.1:{port}" for port in free_ports(workers)]}
    jobs = []
    for index in range(workers):
        task = {"cluster": cluster, "task": {"type": "worker", "index": index}}
        env = {**os.environ, "TF_CONFIG": json.dumps(task), "MW_SECONDS": str(seconds)}
        env |= {"TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
        if configuration == "driftwatch":
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(INJECT), env.get("PYTHONPATH")]))
            env["DRIFTWATCH_RUN"] = "bench"
        command = [sys.executable, str(WORKER)]
        jobs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True))
    medians = []
    for job in jobs:
        out, _ = job.communicate(timeout=seconds + 120)
        medians.append(json.loads(out.strip().splitlines()[-1])["median_step_ms"])
    return max(medians)


def micro_seconds_per_timed_op() -> tuple[float, float]:
    """Seconds a call of the plain function takes, and what timing one op adds to it."""
    sys.path.insert(0, str(REPO))
    import tensorflow as tf

    from driftwatch.hook.multiworker import GraphTimings

    def build(timings: GraphTimings | None) -> object:
        @tf.function  # type: ignore[untyped-decorator]
        def step(x: object) -> object:
            for _ in range(MICRO_OPS):
                if timings is None:
                    x = tf.identity(x) + 1.0
                else:
                    x = timings.timed(lambda x=x: tf.identity(x) + 1.0, x, step)
            return x

        return step

    plain, timed = build(None), build(GraphTimings(tf))
    x = tf.constant(1.0)
    times: dict[object, list[float]] = {plain: [], timed: []}
    for function in times:
        function(x)  # traced
    for _ in range(MICRO_REPEATS):
        for function, kept in times.items():
            start = time.perf_counter()
            for _ in range(MICRO_CALLS):
                function(x)
            kept.append((time.perf_counter() - start) / MICRO_CALLS)
    base, added = statistics.median(times[plain]), statistics.median(times[timed])
    return base, (added - base) / MICRO_OPS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6, help="rounds (default 6)")
    parser.add_argument("--seconds", type=float, default=10.0, help="training per job, s")
    args = parser.parse_args()
    ratios: dict[str, list[float]] = {name: [] for name in CONFIGURATIONS}
    steps: dict[str, list[float]] = {name: [] for name in CONFIGURATIONS}
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load = os.getloadavg()[0]
    for round_index in range(args.rounds):
        measured = {c: job_step_ms(c, args.seconds) for c in rotated(CONFIGURATIONS, round_index)}
        for name, value in measured.items():
            steps[name].append(value)
            ratios[name].append(value / measured["none"])
        print(
            f"round {round_index + 1}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in measured.items())
        )
    print(f"\n{args.rounds} rounds from {started}, load {load:.1f} -> {os.getloadavg()[0]:.1f}")
    print("| configuration | median step | median per-round ratio to none (95 % CI) |")
    print("| --- | --- | --- |")
    for name in CONFIGURATIONS:
        low, high = median_confidence_interval(ratios[name])
        ratio = statistics.median(ratios[name])
        step = statistics.median(steps[name])
        print(f"| `{name}` | {step:.2f} ms | {ratio:.3f}x ({low:.3f}-{high:.3f}) |")
    base, per_op = micro_seconds_per_timed_op()
    print(
        f"\nmicro: a {MICRO_OPS}-op step {base * 1e6:.1f} us; timing an op adds "
        f"{per_op * 1e6:.1f} us ({MICRO_OPS * per_op * 1e6:.0f} us a step of three timed ops: "
        f"{MICRO_OPS * per_op / (statistics.median(steps['none']) / 1e3):.2%} of the median step)"
    )
    hooked = statistics.median(ratios["driftwatch"])
    print(
        f"\ngoal: driftwatch <= {GOAL}x none: {hooked:.3f}x, {'PASS' if hooked <= GOAL else 'MISS'}"
    )


if __name__ == "__main__":
    main()
