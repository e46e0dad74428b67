"""The hook's step accounting, driven with explicit clock readings (no TensorFlow needed)."""

from __future__ import annotations

import math
import os
import statistics
import time
from pathlib import Path

import psutil
import pytest

from driftwatch.channel.paths import channel_path
from driftwatch.channel.ring import ChannelReader
from driftwatch.channel.wire import RecordKind
from driftwatch.hook.core import Hook
from driftwatch.hook.custom_loop import TrainStepRecognizer, patch_iterator_next
from driftwatch.hook.fit_input import attributed_wait
from driftwatch.sources.hook import HookSource


def test_periods_are_divided_by_the_steps_each_call_ran(tmp_path: Path) -> None:
    hook = Hook(channel_dir=str(tmp_path), probe_every_steps=10**9, probe_every_seconds=1e9)
    hook.step_started(0.0, 1)
    hook.step_ended(0.5)  # 0.5 s of host work follows
    hook.step_started(1.0, 4)
    hook.step_ended(2.0)
    hook.step_started(3.0, 2)  # the 4-step call: 2 s, 1 s of it outside the step
    assert hook.global_step == 7
    path = channel_path(tmp_path, os.getpid(), psutil.Process().create_time())
    reader = ChannelReader.open(path)
    records, lost = reader.read()
    reader.close()
    steps = [r for r in records if r.kind == RecordKind.STEP]
    assert lost == 0
    assert [r.key for r in steps] == [1, 5]
    assert [r.a for r in steps] == [1.0, 0.5]
    assert [r.b for r in steps] == [0.5, 0.25]


def test_a_boundary_closes_the_period_without_a_record(tmp_path: Path) -> None:
    hook = Hook(channel_dir=str(tmp_path), probe_every_steps=10**9, probe_every_seconds=1e9)
    hook.step_started(0.0)
    hook.step_ended(0.1)
    hook.boundary()  # validation: not part of any step
    hook.step_started(30.0)
    hook.step_started(31.0)
    path = channel_path(tmp_path, os.getpid(), psutil.Process().create_time())
    reader = ChannelReader.open(path)
    records, _ = reader.read()
    reader.close()
    assert [(r.key, r.a) for r in records if r.kind == RecordKind.STEP] == [(2, 1.0)]


def test_probe_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="probe_every"):
        Hook(probe_every_steps=0)


def test_the_run_name_is_driftwatch_run_unless_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRIFTWATCH_RUN", "from-env")
    assert Hook(channel_dir=str(tmp_path)).run == "from-env"
    assert Hook(run="given", channel_dir=str(tmp_path)).run == "given"
    monkeypatch.delenv("DRIFTWATCH_RUN")
    assert Hook(channel_dir=str(tmp_path)).run != "from-env"


class SlowBatches:
    """Stands in for a tf.data iterator: ``_next_internal`` is what custom_loop patches."""

    def __init__(self, seconds: list[float]) -> None:
        self._seconds = iter(seconds)

    def _next_internal(self) -> None:
        time.sleep(next(self._seconds))


def test_a_probe_sends_the_share_of_step_time_spent_waiting_for_input(tmp_path: Path) -> None:
    hook = Hook(channel_dir=str(tmp_path), probe_every_steps=10**9, probe_every_seconds=1e9)
    patch_iterator_next(SlowBatches, TrainStepRecognizer(hook))
    batches = SlowBatches([0.05, 0.03, 0.01])
    hook.probe()  # no batch timed yet (fit, or no tf.data): nothing sent, not 0
    hook.step_started(0.0)
    hook.step_ended(0.5)
    batches._next_internal()  # the first batch timed: the window starts 2 steps on
    hook.step_started(1.0)
    hook.step_ended(1.2)
    hook.step_started(2.0)
    hook.probe()  # starts the window at step 3 (the first, traced, step left out)
    hook.step_ended(2.5)
    batches._next_internal()
    hook.step_started(3.0)
    hook.step_ended(3.2)
    batches._next_internal()
    hook.step_started(4.0)
    hook.probe()  # two batches' waits over the two 1-s periods closed since
    waits = hook.input_waits[1:3]
    assert hook.input_batches == 3
    assert waits[0] >= 0.03
    assert waits[1] >= 0.01
    hook.probe()  # nothing fetched since: nothing sent
    path = channel_path(tmp_path, os.getpid(), psutil.Process().create_time())
    source = HookSource(path)
    samples = source.sample(10.0)
    source.close()
    assert [s.value for s in samples if s.series == "input_wait_share"] == [sum(waits) / 2.0]
    sent = [s.value for s in samples if s.series == "input_wait_batch_seconds"]
    assert sent == [statistics.median(waits)]
    # Each wait came between two steps: input, not host work outside the step.
    gaps = [s.value for s in samples if s.series == "step_gap_seconds"]
    first = hook.input_waits[0]
    assert gaps == pytest.approx([0.5 - first, 0.8, 0.5 - waits[0], 0.8 - waits[1]])


def test_a_wait_timed_in_the_step_is_sent_as_its_share_of_the_step_time_since_the_last_probe(
    tmp_path: Path,
) -> None:
    # Expected (a rank's collectives, read from their in-graph totals): watched from step 1,
    # nothing is sent until the probe 2 steps on starts the window; then each probe sends
    # the seconds added since over the step time closed since: 0.3 s of 2 s, then 0.9 of 1.
    hook = Hook(channel_dir=str(tmp_path), probe_every_steps=10**9, probe_every_seconds=1e9)
    waited = [0.0]
    hook.step_started(0.0)
    hook.watch_wait("collective_wait_share", lambda: waited[0])
    hook.watch_wait("collective_wait_share", lambda: -1.0)  # watched already: unchanged
    hook.probe()  # the window has not started: nothing read, nothing sent
    for start in (1.0, 2.0):
        hook.step_ended(start - 0.5)
        waited[0] += 0.1
        hook.step_started(start)
    hook.probe()  # step 3: the window starts, at 0.2 s waited and 2 s of periods
    for start in (3.0, 4.0):
        hook.step_ended(start - 0.5)
        waited[0] += 0.15
        hook.step_started(start)
    hook.probe()
    hook.step_ended(4.5)
    waited[0] += 0.9
    hook.step_started(5.0)
    hook.probe()
    hook.probe()  # no period closed since: nothing sent
    path = channel_path(tmp_path, os.getpid(), psutil.Process().create_time())
    source = HookSource(path)
    samples = source.sample(10.0)
    source.close()
    shares = [s.value for s in samples if s.series == "collective_wait_share"]
    assert shares == pytest.approx([0.3 / 2.0, 0.9 / 1.0])


def test_a_sampled_fetch_stands_for_the_steps_since_the_last_but_not_for_more_than_they_took() -> (
    None
):
    # fit's sampler times one fetch in every few steps and gives each step since the last
    # sample that wait: 4 ms among ten 10-ms steps is 40 ms of input wait.
    assert attributed_wait(0.004, 10, 0.1) == pytest.approx(0.04)
    # One fetch descheduled for 200 ms among 5-ms steps took 245 ms of the ten steps'
    # time: its 200 ms is not ten steps' wait (2 s, a share of 1.0 for the probe).
    assert attributed_wait(0.2, 10, 0.245) == pytest.approx(0.245)
    assert attributed_wait(0.003, 1, math.nan) == pytest.approx(0.003)  # the first sample
    assert attributed_wait(-1e-7, 3, 0.03) == 0.0  # the clocks' jitter on a ready batch


class FirstBatches:
    """Another stand-in iterator (a class is patched once, for the recognizer it is given)."""

    def _next_internal(self) -> None:
        time.sleep(0.002)


def test_input_waits_first_reading_leaves_the_traced_step_out_and_comes_within_ten_steps(
    tmp_path: Path,
) -> None:
    """A custom loop probed every 100 steps; its first step (tracing) takes 5 s, the others
    1 s; its first batch timed after step 1. Expected: the probe at step 3's end starts the
    first window (the periods of steps 1 and 2 and their batches left out) and sends
    nothing; the probe at step 13's end sends the first reading: the waits of the 10
    batches fetched in periods 3 to 12 over their 10 s; the next reading at step 113."""
    hook = Hook(channel_dir=str(tmp_path), probe_every_steps=100, probe_every_seconds=1e9)
    patch_iterator_next(FirstBatches, TrainStepRecognizer(hook))
    batches, probed_at = FirstBatches(), []
    hook.check_at_probe(lambda probed: probed_at.append(probed.global_step))
    for step in range(1, 120):
        if step > 1:
            batches._next_internal()
        start = 0.0 if step == 1 else 5.0 + step - 2
        hook.step_started(start)
        hook.step_ended(start + 0.5)
    assert probed_at == [3, 13, 113]
    source = HookSource(channel_path(tmp_path, os.getpid(), psutil.Process().create_time()))
    samples = source.sample(10.0)
    source.close()
    shares = [s.value for s in samples if s.series == "input_wait_share"]
    assert len(shares) == 2
    assert shares[0] == sum(hook.input_waits[2:12]) / 10.0
