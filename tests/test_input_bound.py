"""Input-bound runs: the detector on synthetic shares, and real custom loops over a real
``tf.data`` pipeline under ``driftwatch run`` with its defaults."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

import pytest

from driftwatch.detect import Evaluation
from driftwatch.detect.input_bound import InputBoundDetector
from driftwatch.findings import Severity
from driftwatch.series import Sample
from tests.test_custom_loop_hook import (
    findings,
    history_series,
    run_under_driftwatch,
    steps_run,
)

T0 = 1_700_000_000.0


def fed(detector: InputBoundDetector, shares: list[float], step_seconds: float, t: float) -> float:
    """``detector`` fed ``shares`` as the hook sends them: one share a probe, every 100 steps
    of ``step_seconds`` or every 10 s, whichever comes first; the time of the last."""
    steps = max(1, min(100, round(10.0 / step_seconds)))
    for share in shares:
        for _ in range(steps):
            t += step_seconds
            detector.observe(Sample("step_seconds", step_seconds, t))
        detector.observe(Sample("input_wait_share", share, t))
    return t


def judged(shares: list[float], step_seconds: float) -> Evaluation:
    """What holds live once ``shares`` have been read (``fed``)."""
    detector = InputBoundDetector()
    return detector.evaluate(fed(detector, shares, step_seconds, T0))


def test_a_share_over_a_fifth_of_each_step_is_an_input_bound_warning() -> None:
    # 13 readings a second apart: 12 s at 29-31 % after a first of 90 %.
    evaluation = judged([0.9] + [0.3, 0.31, 0.29, 0.3] * 3, 0.010)
    (finding,) = evaluation.findings
    assert finding.kind == "input_bound"
    assert finding.severity is Severity.WARNING
    assert finding.evidence == pytest.approx(
        {"share": 0.3, "step_seconds": 0.010, "wait_seconds": 0.003, "compute_seconds": 0.007}
    )
    assert finding.message.startswith("30% of each step (3.0 ms of 10.0 ms) waits")
    assert "7.0 ms computes" in finding.message
    assert "prefetch" in finding.message
    assert "num_parallel_calls" in finding.message
    assert "tf.numpy_function" in finding.message
    assert "more workers" in finding.message
    assert evaluation.score == pytest.approx(6.0)


def test_a_moderate_share_is_information_and_a_small_one_nothing() -> None:
    (finding,) = judged([0.1, 0.12, 0.08, 0.1], 0.050).findings  # 5 s apart
    assert finding.severity is Severity.INFO
    assert "a moderate share" in finding.message
    quiet = judged([0.04, 0.045, 0.03, 0.04, 0.02], 0.050)
    assert quiet.findings == ()
    assert quiet.score == pytest.approx(0.8)


def test_one_slow_reading_such_as_the_pipeline_filling_is_not_enough() -> None:
    assert judged([0.95, 0.01, 0.02], 0.100).findings == ()
    assert judged([0.95, 0.95], 0.100).findings == ()  # too few readings yet


def test_a_cache_filling_for_its_first_seconds_is_not_an_input_bound_run() -> None:
    # healthy_fit_cache (scenarios/): the first epoch decodes and caches every example, its
    # steps waiting for the decoder; every later epoch reads the cache. Modelled on a loaded
    # host: 40 % of 12-ms steps for 6 s (5 readings), then 3 % of 4-ms steps for 20 s.
    # Expected: never a finding, live at any reading or at the run's end. Judged on the
    # newest 3 readings alone, as before, the fill was a warning.
    detector = InputBoundDetector()
    t = fed(detector, [0.4] * 5, 0.012, T0)
    assert detector.evaluate(t).findings == ()
    for _ in range(50):
        t = fed(detector, [0.03], 0.004, t)
        assert detector.evaluate(t).findings == (), t - T0
    assert detector.conclude(t).findings == ()


def test_an_input_bound_run_is_reported_once_its_readings_cover_ten_seconds() -> None:
    # 60 % of 30-ms steps, a reading every 100 steps (3 s). Expected: nothing at the third
    # reading (9 s of readings), a warning at the fourth, input-bound since they began.
    detector = InputBoundDetector()
    t = fed(detector, [0.6] * 3, 0.030, T0)
    assert detector.evaluate(t).findings == ()
    t = fed(detector, [0.6], 0.030, t)
    (finding,) = detector.evaluate(t).findings
    assert finding.severity is Severity.WARNING
    assert finding.since == pytest.approx(T0 + 0.030)  # the end of the first step


def test_a_run_input_bound_for_most_of_its_few_seconds_is_stated_at_its_end() -> None:
    # 8 s of readings a second apart, 70 % each: under the 10 s asked live, input-bound
    # at the run's end.
    detector = InputBoundDetector()
    t = fed(detector, [0.7] * 8, 0.010, T0)
    assert detector.evaluate(t).findings == ()
    (finding,) = detector.conclude(t).findings
    assert finding.severity is Severity.WARNING


def test_the_newest_minute_is_judged_so_a_run_that_recovers_goes_quiet() -> None:
    # Bound for a minute, then a prefetch-fast pipeline: once fast readings hold more than
    # half of the newest 60 s, nothing is reported.
    detector = InputBoundDetector()
    t = fed(detector, [0.6] * 60, 0.010, T0)
    assert detector.evaluate(t).findings
    t = fed(detector, [0.01] * 31, 0.010, t)
    assert detector.evaluate(t).findings == ()


def test_a_wait_under_a_millisecond_per_step_is_the_iterators_own_cost() -> None:
    # A prefetched pipeline in a custom loop of sub-millisecond steps (measured under
    # driftwatch run: 0.34 ms of 0.69-ms steps): nothing to fix with the input pipeline.
    evaluation = judged([0.49] * 200, 0.00069)  # 14 s
    assert evaluation.findings == ()
    assert evaluation.score < 1
    (finding,) = judged([0.49] * 60, 0.0021).findings  # the same share of 2.1-ms steps
    assert finding.severity is Severity.WARNING


def test_a_floor_judged_on_the_typical_batch_not_on_a_loaded_machines_tail() -> None:
    # healthy_loop on the machine at a load of about 17: 29 % of its 4.3-ms steps in the
    # iterator's next, 1.24 ms a step on average, from a few descheduled waits; the typical
    # batch waited 0.2-0.3 ms (the iterator's own dispatch): nothing to fix in the pipeline.
    def with_batch_waits(batch_wait: float) -> Evaluation:
        detector = InputBoundDetector()
        t = T0
        for _ in range(30):  # 13 s
            t = fed(detector, [0.29], 0.0043, t)
            detector.observe(Sample("input_wait_batch_seconds", batch_wait, t))
        return detector.evaluate(t)

    assert with_batch_waits(0.00025).findings == ()
    (finding,) = with_batch_waits(0.0012).findings  # every batch waits: input-bound
    assert finding.severity is Severity.WARNING
    assert finding.evidence["batch_wait_seconds"] == pytest.approx(0.0012)


def test_a_share_outside_zero_to_one_is_ignored() -> None:
    assert judged([1.5, 2.0, -0.5, 3.0], 0.010).findings == ()


# -- real TensorFlow ---------------------------------------------------------------------

PIPELINE_LOOP = """
import sys, time
import numpy as np
import tensorflow as tf
import keras

SLOW = sys.argv[2] == "slow"
DELAY = float(sys.argv[3]) if len(sys.argv) > 3 else 0.08
keras.utils.set_random_seed(0)
model = keras.Sequential(
    [
        keras.Input((64,)),
        keras.layers.Dense(512, activation="relu"),
        keras.layers.Dense(512, activation="relu"),
        keras.layers.Dense(1),
    ]
)
optimizer = keras.optimizers.SGD(0.01)
features = np.random.default_rng(0).normal(size=(16384, 64)).astype("float32")


def decode(batch):
    time.sleep(DELAY)  # a slow decoder or augmentation in Python: 80 ms a batch
    return batch


def slow_load(batch):
    out = tf.py_function(decode, [batch], tf.float32)
    out.set_shape(batch.shape)
    return out, tf.reduce_sum(out, axis=1, keepdims=True)


def fast_load(batch):  # TensorFlow ops only: no Python, no GIL
    return batch, tf.reduce_sum(batch, axis=1, keepdims=True)


dataset = tf.data.Dataset.from_tensor_slices(features).batch(256, drop_remainder=True).repeat()
if SLOW:  # one batch at a time, fetched when the loop asks for it
    dataset = dataset.map(slow_load)
else:
    dataset = dataset.map(fast_load, num_parallel_calls=tf.data.AUTOTUNE)
    dataset = dataset.prefetch(tf.data.AUTOTUNE)


@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(x) - y) ** 2)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


steps = 0
end = time.monotonic() + float(sys.argv[1])
for x, y in dataset:
    train_step(x, y)
    steps += 1
    if time.monotonic() > end:
        break
print("steps", steps)
"""


@pytest.mark.tf
@pytest.mark.paired
def test_a_custom_loop_waiting_on_a_slow_map_is_reported_input_bound(tmp_path: Path) -> None:
    # Expected: the 80-ms map outruns the prefetch tf.data injects, as a step of this model
    # takes about 10 ms: most of each step waits for input, a warning. The map runs beside
    # the step, so a step waits the map's time less its compute. Paired, as the fit test
    # below: a job beside it slows the compute, not the sleep, and the share stays over the
    # 30 % asked until the compute takes 56 ms (measured with a 40-ms map: 59-65 % of
    # 41-46-ms steps at a load of 10-13, and fit's shares 28 % and 44 % beside another job).
    stdout, db = run_under_driftwatch(PIPELINE_LOOP, tmp_path, "15", "slow")
    assert steps_run(stdout) > 100, stdout
    shares = [b.mean for b in history_series(db)["input_wait_share"] if b.mean == b.mean]
    assert_reported_input_bound(shares, tmp_path, stdout)


def assert_reported_input_bound(shares: list[float], tmp_path: Path, stdout: str) -> None:
    """Every share over 30 %, one input_bound warning with its numbers, and the live line."""
    assert shares
    assert min(shares) > 0.3, shares
    (finding,) = [f for f in findings(tmp_path) if f["kind"] == "input_bound"]
    assert finding["severity"] == "warning"
    assert finding["evidence"]["share"] > 0.3
    assert finding["evidence"]["wait_seconds"] > 0.005
    assert f"{finding['evidence']['share']:.0%} of each step" in finding["message"]
    assert re.search(r"waiting for input: \d+% of each step", stdout)  # the live line


@pytest.mark.tf
def test_the_same_loop_with_prefetch_and_a_parallel_fast_map_is_not(tmp_path: Path) -> None:
    # Expected: batches are ready when the loop asks; what is left is the iterator's own
    # dispatch, a few tenths of a millisecond of a 5-ms step: no input_bound warning.
    stdout, db = run_under_driftwatch(PIPELINE_LOOP, tmp_path, "15", "fast")
    assert steps_run(stdout) > 100, stdout
    shares = [b.mean for b in history_series(db)["input_wait_share"] if b.mean == b.mean]
    assert shares  # measured, and small
    assert max(shares) < 0.2, shares
    warned = [f for f in findings(tmp_path) if f["severity"] != "info"]
    assert "input_bound" not in {f["kind"] for f in warned}


# -- a Python decoder per sample, no prefetch: fit and a custom loop ------------------

DECODER_JOB = """
import sys, time
import numpy as np
import tensorflow as tf
import keras

LOOP, BATCHES = sys.argv[1], int(sys.argv[2])
keras.utils.set_random_seed(0)
model = keras.Sequential(
    [keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)]
)
samples = np.random.default_rng(0).normal(size=(4096, 32)).astype("float32")


def decode(sample):
    time.sleep(0.004)  # a decoder in Python: 4 ms a sample, 32 a batch
    return sample


def load(sample):
    out = tf.numpy_function(decode, [sample], tf.float32)
    out.set_shape(sample.shape)
    return out, tf.reduce_sum(out, keepdims=True)


# No prefetch, a sequential map: each batch is decoded when the step asks for it. Finite,
# so that the job ends with its data (see FIT_UNDER_DRIFTWATCH below).
dataset = tf.data.Dataset.from_tensor_slices(samples).map(load).batch(32).repeat().take(BATCHES)
if LOOP == "fit":
    model.compile(optimizer="sgd", loss="mse")
    model.fit(dataset, verbose=0)
else:
    optimizer = keras.optimizers.SGD(0.01)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    for x, y in dataset:
        train_step(x, y)
print("steps", BATCHES)
"""


@pytest.mark.tf
@pytest.mark.paired
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_a_job_decoding_each_sample_in_python_is_input_bound_and_not_productive(
    tmp_path: Path, loop: str
) -> None:
    # Expected, for fit as for a custom loop: each 32-sample batch waits about 130 ms for
    # its decoder while the model computes for a millisecond or two, so at least 80 % of
    # each step waits for input: an input_bound warning with that share, and goodput's
    # productive share at most 20 % (the wait is not compute). 160 batches, about 20 s: the
    # hook's readings (a dozen steps in, every 10 s, and at the end) cover over the 10 s
    # the detector asks live, and the run's end judges them all.
    stdout, db = run_under_driftwatch(DECODER_JOB, tmp_path, loop, "160")
    assert steps_run(stdout) == 160, stdout
    series = history_series(db)
    (finding,) = [f for f in findings(tmp_path) if f["kind"] == "input_bound"]
    assert finding["severity"] == "warning"
    assert finding["evidence"]["share"] >= 0.8, finding
    assert finding["evidence"]["compute_seconds"] < 0.2 * finding["evidence"]["step_seconds"]
    goodput = [b.last for b in series["goodput_ratio"] if b.last == b.last]
    assert goodput[-1] <= 0.2, goodput


# -- Keras fit: its input wait timed in its graph -------------------------------------

FIT_UNDER_DRIFTWATCH = (
    PIPELINE_LOOP.split("@tf.function")[0]
    + """
WIDTH = int(sys.argv[4]) if len(sys.argv) > 4 else 512
if WIDTH != 512:  # a heavier step
    model = keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(WIDTH, activation="relu"),
            keras.layers.Dense(WIDTH, activation="relu"),
            keras.layers.Dense(1),
        ]
    )
STEPS_PER_EXECUTION = int(sys.argv[5]) if len(sys.argv) > 5 else 1
model.compile(optimizer="sgd", loss="mse", steps_per_execution=STEPS_PER_EXECUTION)
# A finite dataset, so that fit ends with it: stopped mid-stream, the slow map's Python
# function can still be running when the interpreter exits, and TensorFlow's iterator
# destructor then waits for it forever (TF's shutdown, with or without driftwatch).
model.fit(dataset.take(int(sys.argv[1])), verbose=0)
print("steps", int(sys.argv[1]))
"""
)


def fit_shares(tmp_path: Path, *mode: str) -> tuple[str, list[float]]:
    """``FIT_UNDER_DRIFTWATCH`` over 350 batches under ``driftwatch run`` with no flags: its
    stdout, and the input-wait shares its history holds (one mean per bucket)."""
    stdout, db = run_under_driftwatch(FIT_UNDER_DRIFTWATCH, tmp_path, "350", *mode)
    assert steps_run(stdout) == 350, stdout
    series = history_series(db)
    assert series["step_seconds"]
    return stdout, [b.mean for b in series.get("input_wait_share", []) if b.mean == b.mean]


@pytest.mark.tf
@pytest.mark.paired
def test_fit_waiting_on_a_slow_map_is_reported_input_bound(tmp_path: Path) -> None:
    # Expected: as for the custom loop above, the 80-ms map outruns tf.data's prefetch and
    # most of each step waits, timed on a sample of fit's steps by default
    # (driftwatch/hook/fit_input.py): an input_bound warning, the wait named in the live line.
    stdout, shares = fit_shares(tmp_path, "slow")
    assert_reported_input_bound(shares, tmp_path, stdout)


@pytest.mark.tf
@pytest.mark.paired
def test_fit_over_a_prefetched_parallel_fast_map_reads_under_five_percent(
    tmp_path: Path,
) -> None:
    # Expected: batches are ready when fit asks; what is left is the fetch op's hand-off to
    # tf.data's thread and back, which this loaded 2-core machine (one inter-op thread)
    # stretches to about 0.5 ms a batch (measured), against steps of about 40 ms with
    # 1024-wide layers: about 1 %, under the 5 % band, no finding. (With the 512-wide
    # layers' 10-ms steps it read 3.8 % and 5.7 %: the fetch's fixed cost, at the edge.)
    _, shares = fit_shares(tmp_path, "fast", "0", "1024")
    assert shares  # measured, and small
    assert statistics.median(shares) < 0.05, shares
    assert "input_bound" not in {f["kind"] for f in findings(tmp_path)}


@pytest.mark.tf
@pytest.mark.paired
def test_fit_with_several_steps_per_execution_sends_no_input_wait(tmp_path: Path) -> None:
    # Keras then fetches the next batch beside the step, in the same loop body: the fetch
    # overlaps the step and its duration is no wait. The hook times the steps and says
    # nothing of the input rather than a wrong share (docs/hook.md, "Input wait").
    _, shares = fit_shares(tmp_path, "slow", "0.04", "512", "2")
    assert not shares
    assert "input_bound" not in {f["kind"] for f in findings(tmp_path)}
