"""The Keras callback and the custom-loop hook, in this process, read back from the channel."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import psutil
import pytest

from driftwatch.channel.paths import channel_path
from driftwatch.channel.ring import ChannelReader, Record
from driftwatch.channel.wire import SERIES_META, RecordKind
from driftwatch.hook import core, fit_input
from tests.conftest import TF_ENV

pytestmark = [pytest.mark.tf, pytest.mark.paired]

if TYPE_CHECKING:  # for the type checker: at run time _tensorflow() binds them
    import keras  # noqa: TC004
    import tensorflow as tf  # noqa: TC004
    from keras.src.callbacks import callback_list  # noqa: TC004

    from driftwatch.keras import DriftwatchCallback  # noqa: TC004


@pytest.fixture(autouse=True, scope="module")
def _tensorflow() -> None:
    """Keras and TensorFlow, imported when this module's tests first run rather than when
    it is collected: a run of the other tests (``-m "not tf"``) collects it too, in each of
    its workers, and the import takes seconds of CPU."""
    global keras, tf, callback_list, DriftwatchCallback
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf
    from keras.src.callbacks import callback_list

    from driftwatch.keras import DriftwatchCallback


FEATURES = 8


@pytest.fixture
def channel_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh channel directory and no process-wide hook left over from another test."""
    monkeypatch.setattr(core, "_shared", None)
    directory = tmp_path / "runtime"
    yield directory
    if core._shared is not None:
        core._shared.close()


def read_channel(directory: Path) -> tuple[list[Record], dict[str, Any]]:
    path = channel_path(directory, os.getpid(), psutil.Process().create_time())
    reader = ChannelReader.open(path)
    try:
        records, lost = reader.read()
        assert lost == 0
        return records, reader.meta()
    finally:
        reader.close()


def values_of(records: list[Record], meta: dict[str, Any], series: str) -> list[float]:
    keys = {i for i, (name, _labels) in enumerate(meta[SERIES_META]) if name == series}
    return [r.a for r in records if r.kind == RecordKind.VALUE and r.key in keys]


def small_model(steps_per_execution: int = 1) -> Any:
    model = keras.Sequential(
        [keras.Input((FEATURES,)), keras.layers.Dense(4), keras.layers.Dense(1)]
    )
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=steps_per_execution)
    return model


def data(batches: int, batch_size: int = 8, nan: bool = False) -> tuple[Any, Any]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batches * batch_size, FEATURES)).astype("float32")
    y = rng.normal(size=(batches * batch_size, 1)).astype("float32")
    if nan:
        y[:] = np.nan
    return x, y


def test_callback_keeps_async_batch_dispatch_on(monkeypatch: pytest.MonkeyPatch) -> None:
    # The TensorFlow backend is not thread-safe, so Keras never dispatches asynchronously
    # there; pretend it is (as JAX is) to see what our callback does to the decision.
    monkeypatch.setattr(callback_list.backend, "IS_THREAD_SAFE", True)
    assert callback_list.CallbackList([DriftwatchCallback(channel_dir=os.devnull)])._async_train

    # The control: an ordinary batch-end callback switches async dispatch off.
    class NaiveBatchEndCallback(keras.callbacks.Callback):  # type: ignore[misc]
        def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            pass

    assert not callback_list.CallbackList([NaiveBatchEndCallback()])._async_train


def test_fit_records_every_step_epoch_and_validation(channel_dir: Path) -> None:
    x, y = data(batches=20)
    callback = DriftwatchCallback(channel_dir=str(channel_dir), probe_every_steps=5)
    small_model().fit(
        x, y, batch_size=8, epochs=3, verbose=0, validation_split=0.2, callbacks=[callback]
    )
    records, meta = read_channel(channel_dir)
    steps = [r for r in records if r.kind == RecordKind.STEP]
    # 16 training batches per epoch; the first of each epoch opens a period, the rest close one.
    assert len(steps) == 3 * 15
    assert callback.hook.global_step == 48
    assert [r.key for r in steps[:3]] == [1, 2, 3]
    # Seconds a step and its time outside the step: any positive time (on a loaded machine
    # one of these ms-steps can take over a second).
    assert all(0 < r.a < 60 and 0 <= r.b < r.a for r in steps), [(r.a, r.b) for r in steps]
    epochs = [r for r in records if r.kind == RecordKind.EPOCH]
    assert [r.key for r in epochs] == [0, 1, 2]
    assert all(0 < r.b < r.a for r in epochs)  # validation is part of the epoch
    assert values_of(records, meta, "tracing_count")[-1] == 0  # a plain fit: no retracing
    assert meta["run"]
    assert meta["pid"] == os.getpid()


def test_fit_with_async_dispatch(channel_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(callback_list.backend, "IS_THREAD_SAFE", True)
    threads: set[int] = set()

    class WhereAmI(DriftwatchCallback):
        def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            threads.add(threading.get_ident())
            super().on_train_batch_end(batch, logs)

    x, y = data(batches=10)
    callback = WhereAmI(channel_dir=str(channel_dir))
    small_model().fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[callback])
    assert threading.get_ident() not in threads, "batch ends were not dispatched asynchronously"
    records, _ = read_channel(channel_dir)
    assert len([r for r in records if r.kind == RecordKind.STEP]) == 2 * 9
    assert callback.hook.global_step == 20


def test_fit_trains_the_same_when_every_fetch_is_timed(
    channel_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every step sampled (no spacing): each batch is fetched by the sampler and handed to
    # Keras's own step function. The weights, the losses, the steps per epoch (a partial
    # last batch included, and the end of the data each epoch) must be those of the same fit
    # without driftwatch, the step function traced no more often, and the wait sent.
    monkeypatch.setattr(fit_input, "SAMPLE_SPACING_SECONDS", 0.0)
    x, y = data(batches=13)  # 104 samples: 6 batches of 16 and a partial one of 8
    keras.utils.set_random_seed(1)
    plain = small_model()
    keras.utils.set_random_seed(1)
    watched = small_model()
    callback = DriftwatchCallback(channel_dir=str(channel_dir), probe_every_steps=5)
    fits = {"batch_size": 16, "epochs": 3, "verbose": 0, "shuffle": False}
    expected = plain.fit(x, y, **fits).history["loss"]
    assert watched.fit(x, y, callbacks=[callback], **fits).history["loss"] == expected
    for ours, theirs in zip(watched.weights, plain.weights, strict=True):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    assert callback.hook.global_step == 3 * 7
    assert callback.hook.input_batches == 3 * 7  # the first sample stands for the first step
    records, meta = read_channel(channel_dir)
    assert values_of(records, meta, "tracing_count")[-1] == 0
    shares = values_of(records, meta, "input_wait_share")
    assert shares
    assert all(0 <= share <= 1 for share in shares)


def test_steps_per_execution(channel_dir: Path) -> None:
    x, y = data(batches=32)
    callback = DriftwatchCallback(channel_dir=str(channel_dir))
    small_model(steps_per_execution=4).fit(
        x, y, batch_size=8, epochs=1, verbose=0, callbacks=[callback]
    )
    records, _ = read_channel(channel_dir)
    steps = [r for r in records if r.kind == RecordKind.STEP]
    assert [r.key for r in steps] == [4, 8, 12, 16, 20, 24, 28]  # the last period stays open
    assert callback.hook.global_step == 32


def test_nonfinite_loss_is_reported_with_its_first_step(channel_dir: Path) -> None:
    x, y = data(batches=6, nan=True)
    callback = DriftwatchCallback(channel_dir=str(channel_dir))
    small_model().fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[callback])
    records, meta = read_channel(channel_dir)
    counts = values_of(records, meta, "hook_nonfinite_total")
    assert counts
    assert counts[-1] >= 6
    assert meta["first_nonfinite"] == {"step": 1, "name": "loss"}


def test_weights_check_finds_nonfinite_weights(channel_dir: Path) -> None:
    x, y = data(batches=4)
    model = small_model()
    model.build((None, FEATURES))
    kernel = model.layers[0].kernel
    kernel.assign(np.full(kernel.shape, np.inf, dtype="float32"))
    callback = DriftwatchCallback(channel_dir=str(channel_dir), check_weights_every=2)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[callback])
    _, meta = read_channel(channel_dir)
    assert callback.hook.nonfinite > 0
    assert "first_nonfinite" in meta


def test_callbacks_of_several_fits_share_one_hook(channel_dir: Path) -> None:
    x, y = data(batches=5)
    model = small_model()
    first = DriftwatchCallback(channel_dir=str(channel_dir))
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[first])
    second = DriftwatchCallback(channel_dir=str(channel_dir))
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[second])
    assert second.hook is first.hook
    assert first.hook.global_step == 10
    assert model.train_function.__name__ != "timed_step_function"  # unwrapped after fit


@pytest.mark.parametrize("loop", ["evaluate", "predict"])
def test_evaluate_or_predict_run_on_their_own_are_timed_step_by_step(
    channel_dir: Path, loop: str
) -> None:
    # An evaluation or inference job has no fit: its own loop's steps are the job's steps,
    # each period start to start, its input wait measured, its step function given back.
    x, y = data(batches=12)
    model = small_model()
    callback = DriftwatchCallback(channel_dir=str(channel_dir), probe_every_steps=5)
    if loop == "evaluate":
        model.evaluate(x, y, batch_size=8, verbose=0, callbacks=[callback])
    else:
        model.predict(x, batch_size=8, verbose=0, callbacks=[callback])
    assert callback.hook.global_step == 12
    records, meta = read_channel(channel_dir)
    steps = [r for r in records if r.kind == RecordKind.STEP]
    assert [r.key for r in steps] == list(range(1, 12))  # the last period stays open
    assert all(0 < r.a < 60 and 0 <= r.b < r.a for r in steps)
    shares = values_of(records, meta, "input_wait_share")
    assert shares
    assert all(0 <= share <= 1 for share in shares)
    function = model.test_function if loop == "evaluate" else model.predict_function
    assert function.__name__ not in ("timed_step_function", "timed_predict_function")


def test_validation_inside_fit_is_not_timed_as_evaluate_steps(channel_dir: Path) -> None:
    x, y = data(batches=10)
    callback = DriftwatchCallback(channel_dir=str(channel_dir))
    model = small_model()
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, validation_split=0.5, callbacks=[callback])
    assert callback.hook.global_step == 2 * 5  # the training batches only
    assert model.test_function.__name__ != "timed_step_function"


def test_custom_loop_hook(channel_dir: Path) -> None:
    hook = core.Hook(channel_dir=str(channel_dir), probe_every_steps=10)
    weights = tf.Variable(tf.ones((FEATURES, 1)))

    @tf.function  # type: ignore[untyped-decorator]
    def train_step(x: Any) -> Any:
        loss = tf.reduce_mean(tf.matmul(x, weights) ** 2)
        weights.assign_sub(0.01 * weights)
        return loss

    hook.watch_function(train_step)
    x, _ = data(batches=1)
    for _ in range(30):
        with hook.step():
            loss = train_step(x)
            assert hook.check_finite(float(loss))
    assert not hook.check_finite(math.nan, "loss")
    assert not hook.check_finite(np.array([1.0, np.inf]), "grads")
    records, meta = read_channel(channel_dir)
    assert len([r for r in records if r.kind == RecordKind.STEP]) == 29
    assert values_of(records, meta, "tracing_count")[-1] == 0  # traced once, before the first read
    assert values_of(records, meta, "hook_nonfinite_total")[-1] == 2
    assert meta["first_nonfinite"] == {"step": 30, "name": "loss"}


def test_callback_serves_metrics_without_a_daemon(channel_dir: Path) -> None:
    x, y = data(batches=30)
    callback = DriftwatchCallback(channel_dir=str(channel_dir), listen="127.0.0.1:0")
    small_model().fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[callback])
    server = callback.hook._server
    assert server is not None

    def scrape() -> str:
        with urllib.request.urlopen(server.url, timeout=10) as response:
            body: bytes = response.read()
        return body.decode()

    from tests.conftest import wait_for

    # The sampler thread reads the channel every 2 s: the end-of-fit probe's tracing count
    # may come a read after the steps.
    series = ("driftwatch_step_duration_seconds{", "driftwatch_tf_function_traces_total{")
    wait_for(lambda: all(name in scrape() for name in series), 15, "hook step and trace series")
    text = scrape()
    assert "driftwatch_tf_function_traces_total{" in text
    assert 'driftwatch_source_up{run="' in text
    assert 'source="hook"} 1.0' in text


def test_tf_memory_is_read_once_the_allocator_holds_tensors(tmp_path: Path) -> None:
    """With statistics on, the CPU allocator's peak is zero until the first tensor: an early
    probe must not give up on the device, as it does for an allocator that keeps none."""
    script = (
        "from driftwatch.hook.probes import TensorflowProbes\n"
        "import tensorflow as tf\n"
        "probes = TensorflowProbes()\n"
        "assert probes.read() == [], 'nothing placed yet'\n"
        "kept = tf.ones((256, 256))\n"
        "print(sorted(series for series, _, _ in probes.read()))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **TF_ENV, "TF_CPU_ALLOCATOR_USE_BFC": "true"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split("\n")[-2] == (
        "['tf_allocator_current_bytes', 'tf_allocator_peak_bytes']"
    )
