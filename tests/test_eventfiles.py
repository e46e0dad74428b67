"""Event-file source against real event files written by tensorboard's pure-Python writer."""

from __future__ import annotations

import copy
import importlib.util
import logging
import math
import os
import random
import struct
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import google_crc32c
import pytest
from google.protobuf.message import DecodeError

from bench.detection.analyze_speed import T0, YEAR, EventLog

pytest.importorskip("tensorboard")

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.image import metadata as image_metadata
from tensorboard.plugins.scalar import metadata as scalar_metadata
from tensorboard.summary.writer.event_file_writer import EventFileWriter
from tensorboard.util import tensor_util

from driftwatch.errors import SourceUnavailable, TargetAccessDenied, TargetGone
from driftwatch.series import SERIES, Sample
from driftwatch.sources import eventfiles, protowire, records
from driftwatch.sources.eventfiles import EventFileSource, describe
from driftwatch.sources.replay import replay_logdir
from driftwatch.sources.scalars import masked
from driftwatch.target.process import Target
from tests.conftest import REPO, TF_ENV, in_pid_namespace, needs_pid_namespaces


@pytest.fixture(autouse=True, scope="module")
def _tensorboard_stub() -> None:
    """Load the source's tensorboard first: the writer below then uses the stub, not TF."""
    ok, why = describe()
    assert ok, why


class Log:
    """One event file, written the way TF2 (tensor scalars) or TF1 (``simple_value``) does."""

    def __init__(self, logdir: Path, simple: bool = False) -> None:
        before = set(logdir.glob("events.out.tfevents.*")) if logdir.exists() else set()
        self._writer = EventFileWriter(str(logdir), flush_secs=3600)
        (self.path,) = set(logdir.glob("events.out.tfevents.*")) - before
        self._simple = simple
        self._tags: set[str] = set()

    def scalar(self, step: int, wall_time: float, **values: float) -> int:
        """Log ``tag=value`` scalars as one event; returns the size of its record."""
        event = event_pb2.Event(wall_time=wall_time, step=step)
        for tag, value in values.items():
            if self._simple:
                event.summary.value.add(tag=tag, simple_value=value)
                continue
            summary = event.summary.value.add(tag=tag)
            summary.tensor.CopyFrom(tensor_util.make_tensor_proto(value))
            if tag not in self._tags:  # TF2 writes the metadata with a tag's first value only
                self._tags.add(tag)
                summary.metadata.CopyFrom(scalar_metadata.create_summary_metadata(tag, ""))
        self._writer.add_event(event)
        return len(event.SerializeToString()) + 16  # length, its CRC, data, data CRC

    def image(self, step: int, wall_time: float, tag: str, size: int, tf1: bool = False) -> None:
        """Log an image summary of ``size`` bytes (random: a reader never looks inside), as
        TF2 writes it (a string tensor: width, height, encoded images) or TF1 (``image``)."""
        event = event_pb2.Event(wall_time=wall_time, step=step)
        encoded = os.urandom(size)
        if tf1:
            image = summary_pb2.Summary.Image(height=8, width=8, encoded_image_string=encoded)
            event.summary.value.add(tag=tag, image=image)
        else:
            value = event.summary.value.add(tag=tag)
            value.tensor.CopyFrom(tensor_util.make_tensor_proto([b"8", b"8", encoded]))
            value.metadata.CopyFrom(image_metadata.create_summary_metadata(tag, ""))
        self.event(event)

    def event(self, event: event_pb2.Event) -> None:
        self._writer.add_event(event)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def latest(samples: list[Sample]) -> dict[str, float]:
    return {sample.series: sample.value for sample in samples}


def of(series: str, samples: list[Sample]) -> list[Sample]:
    return [sample for sample in samples if sample.series == series]


@pytest.fixture
def log(tmp_path: Path) -> Iterator[Log]:
    writer = Log(tmp_path / "train")
    yield writer
    writer.close()


def test_emits_only_known_series(tmp_path: Path, log: Log) -> None:
    log.scalar(1, 100.0, loss=1.0)
    log.scalar(2, 101.0, loss=1.0)
    log.flush()
    samples = EventFileSource([tmp_path]).sample(500.0)
    assert {s.series for s in samples} <= SERIES.keys()
    assert all(s.t == 500.0 for s in samples if s.series != "step_seconds")


def test_a_run_without_event_files_has_no_event_file_series_until_one_comes(
    tmp_path: Path,
) -> None:
    source = EventFileSource([tmp_path], rescan_seconds=0.0)
    assert source.sample(0.0) == []
    log = Log(tmp_path)
    log.scalar(1, 1.0, loss=1.0)
    log.flush()
    values = latest(source.sample(1.0))
    assert values["event_files"] == 1.0
    assert values["event_file_bytes"] > 0
    # Closed first: the writer's thread appends by the file's name, so a record it still
    # held would create the file again after the removal.
    log.close()
    os.remove(log.path)
    values = latest(source.sample(2.0))  # its files gone: zeros, as any run's then
    assert values["event_files"] == values["event_file_bytes"] == 0.0


def test_count_total_and_largest_size(tmp_path: Path) -> None:
    small, big = Log(tmp_path), Log(tmp_path)
    small.scalar(1, 1.0, loss=1.0)
    for step in range(50):
        big.scalar(step, float(step), loss=1.0, accuracy=0.5)
    small.close()
    big.close()
    values = latest(EventFileSource([tmp_path]).sample(0.0))
    sizes = [small.path.stat().st_size, big.path.stat().st_size]
    assert values["event_files"] == 2
    assert values["event_file_bytes"] == sum(sizes)
    assert values["event_file_largest_bytes"] == max(sizes) == big.path.stat().st_size


def test_tails_incrementally_and_times_steps(tmp_path: Path, log: Log) -> None:
    source = EventFileSource([tmp_path])
    for step in range(3):
        log.scalar(step, 100.0 + 2 * step, loss=1.0)
    log.flush()
    first = source.sample(1.0)
    assert latest(first)["train_step"] == 2
    assert latest(first)["step_timestamp"] == 104.0
    assert [(s.value, s.t) for s in of("step_seconds", first)] == [(2.0, 102.0), (2.0, 104.0)]

    assert of("step_seconds", source.sample(2.0)) == []  # nothing new, nothing repeated
    log.scalar(5, 110.0, loss=1.0)  # three steps in six seconds
    log.flush()
    third = source.sample(3.0)
    assert [(s.value, s.t) for s in of("step_seconds", third)] == [(2.0, 110.0)]
    assert latest(third)["train_step"] == 5


def test_simple_value_scalars(tmp_path: Path) -> None:
    log = Log(tmp_path, simple=True)
    for step in range(4):
        log.scalar(step, 10.0 + 0.5 * step, loss=1.0, accuracy=math.nan)
    log.close()
    samples = EventFileSource([tmp_path]).sample(0.0)
    assert [s.value for s in of("step_seconds", samples)] == [0.5, 0.5, 0.5]
    assert latest(samples)["nonfinite_total"] == 4


@pytest.mark.parametrize("written", [5, 10, 20, -1], ids=["length", "length-crc", "data", "crc"])
def test_partial_last_record_is_read_once_completed(tmp_path: Path, log: Log, written: int) -> None:
    """The writer is cut off ``written`` bytes into a record (-1: all but the last byte)."""
    log.scalar(1, 100.0, loss=1.0)
    record = log.scalar(2, 103.0, loss=math.nan)
    log.close()
    size = log.path.stat().st_size
    tail = log.path.read_bytes()[size - record + written % record :]
    os.truncate(log.path, size - len(tail))

    source = EventFileSource([tmp_path])
    before = latest(source.sample(0.0))
    assert before["train_step"] == 1
    assert before["nonfinite_total"] == 0

    with log.path.open("ab") as f:
        f.write(tail)
    after = source.sample(1.0)
    assert latest(after)["train_step"] == 2
    assert latest(after)["nonfinite_total"] == 1
    assert [s.value for s in of("step_seconds", after)] == [3.0]
    assert latest(source.sample(2.0))["nonfinite_total"] == 1


def test_several_tags_per_step_and_epoch_tags_do_not_pollute(tmp_path: Path) -> None:
    """Keras with batch logging: batch tags at the global step, epoch tags at the epoch."""
    train, validation = Log(tmp_path / "train"), Log(tmp_path / "validation")
    for step in range(1, 7):
        train.scalar(step, 100.0 + 2 * step, batch_loss=1.0)
        train.scalar(step, 100.0 + 2 * step + 0.5, batch_accuracy=0.5)
        if step % 3 == 0:
            epoch = step // 3 - 1
            train.scalar(epoch, 100.0 + 2 * step + 0.7, epoch_loss=1.0)
            validation.scalar(epoch, 100.0 + 2 * step + 0.8, epoch_loss=1.0)
            validation.scalar(step, 100.0 + 2 * step + 0.9, evaluation_loss_vs_iterations=1.0)
    train.close()
    validation.close()
    samples = EventFileSource([tmp_path]).sample(0.0)
    assert [(s.value, s.t) for s in of("step_seconds", samples)] == [
        (2.0, 100.0 + 2 * step) for step in range(2, 7)
    ]
    assert latest(samples)["train_step"] == 6
    assert latest(samples)["step_timestamp"] == 112.0


def test_epoch_logging_uses_the_iteration_tag_without_mixing_tags(tmp_path: Path) -> None:
    """Keras' default: only the validation writer logs at the iteration count (50/epoch)."""
    train, validation = Log(tmp_path / "train"), Log(tmp_path / "validation")
    for epoch in range(3):
        end = 100.0 * (epoch + 1)
        train.scalar(epoch, end, epoch_loss=1.0, epoch_learning_rate=0.1)
        validation.scalar(epoch, end + 10, epoch_loss=1.0)
        validation.scalar(50 * (epoch + 1), end + 11, evaluation_loss_vs_iterations=1.0)
    train.close()
    validation.close()
    samples = EventFileSource([tmp_path]).sample(0.0)
    # Measured between two evaluation events; never between an epoch tag and an iteration tag.
    assert [s.value for s in of("step_seconds", samples)] == [2.0, 2.0]
    assert latest(samples)["train_step"] == 150


def test_counts_nonfinite_scalars_cumulatively(tmp_path: Path, log: Log) -> None:
    source = EventFileSource([tmp_path])
    log.scalar(1, 1.0, loss=math.nan, accuracy=0.5)
    log.scalar(2, 2.0, loss=math.inf, accuracy=-math.inf)
    log.flush()
    assert latest(source.sample(0.0))["nonfinite_total"] == 3
    assert latest(source.sample(1.0))["nonfinite_total"] == 3
    log.scalar(3, 3.0, loss=math.nan)
    log.flush()
    assert latest(source.sample(2.0))["nonfinite_total"] == 4


def test_discovers_files_the_target_has_open(tmp_path: Path, log: Log) -> None:
    log.scalar(1, 1.0, loss=1.0)
    log.flush()
    other = tmp_path / "notes.txt"
    other.write_text("not an event file")
    open_now = [str(log.path), str(other)]
    source = EventFileSource([], open_paths=lambda: open_now)
    assert latest(source.sample(0.0))["event_files"] == 1
    open_now.clear()  # closed by the target: still one of the run's files
    assert latest(source.sample(1.0))["event_files"] == 1


def test_file_both_open_and_under_a_logdir_counts_once(tmp_path: Path, log: Log) -> None:
    log.flush()
    source = EventFileSource([tmp_path], open_paths=lambda: [str(log.path)])
    assert latest(source.sample(0.0))["event_files"] == 1


def test_walks_logdir_subdirectories(tmp_path: Path) -> None:
    train, validation = Log(tmp_path / "train"), Log(tmp_path / "validation")
    train.close()
    validation.close()
    (tmp_path / "validation" / "checkpoint").write_text("not an event file")
    values = latest(EventFileSource([tmp_path]).sample(0.0))
    assert values["event_files"] == 2


def test_rescans_logdirs_at_the_interval(tmp_path: Path) -> None:
    Log(tmp_path / "train").close()
    source = EventFileSource([tmp_path], rescan_seconds=10.0)
    assert latest(source.sample(100.0))["event_files"] == 1
    Log(tmp_path / "validation").close()
    assert latest(source.sample(109.0))["event_files"] == 1
    assert latest(source.sample(110.0))["event_files"] == 2


def test_new_file_seen_through_open_paths_at_once(tmp_path: Path) -> None:
    first = Log(tmp_path)
    first.close()
    open_now = [str(first.path)]
    source = EventFileSource([tmp_path], open_paths=lambda: open_now, rescan_seconds=3600.0)
    assert latest(source.sample(0.0))["event_files"] == 1
    second = Log(tmp_path)
    second.scalar(7, 1.0, loss=1.0)
    second.close()
    open_now.append(str(second.path))
    values = latest(source.sample(1.0))
    assert values["event_files"] == 2
    assert values["train_step"] == 7


def test_a_file_found_under_two_names_is_read_once(tmp_path: Path) -> None:
    """The logdir through a symlink, the open file by its real path: one file."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    log = Log(tmp_path / "real")
    size = log.scalar(7, 1.0, loss=1.0)
    log.flush()
    source = EventFileSource([tmp_path / "link"], open_paths=lambda: [str(log.path)])
    values = latest(source.sample(0.0))
    assert values["event_files"] == 1
    assert values["event_file_bytes"] == log.path.stat().st_size
    assert size < values["event_file_bytes"]  # the file version record comes first
    log.close()


CONTAINED_WRITER = """
import subprocess, sys, time
from pathlib import Path
subprocess.run(["mount", "-t", "tmpfs", "none", sys.argv[1]], check=True)
from tests.test_eventfiles import Log
log = Log(Path(sys.argv[1]))
log.scalar(7, 1.0, loss=1.0)
log.flush()
print(log.path.stat().st_size, flush=True)
time.sleep(300)
"""


@needs_pid_namespaces
def test_event_files_of_a_process_in_another_mount_namespace(tmp_path: Path) -> None:
    """A containerised job's logdir is a mount the host does not see at that path: its
    files are read through /proc/PID/root."""
    logdir = tmp_path / "logs"
    logdir.mkdir()
    with in_pid_namespace(CONTAINED_WRITER, str(logdir)) as (contained, pid):
        assert contained.stdout is not None
        size = float(contained.stdout.readline())
        assert not list(logdir.iterdir())  # not here: on the job's own tmpfs
        target = Target.attach(pid)
        values = latest(EventFileSource([], target.open_paths).sample(0.0))
    assert values["event_files"] == 1
    assert values["event_file_bytes"] == size
    assert values["train_step"] == 7


def test_deleted_files_drop_out(tmp_path: Path) -> None:
    kept, deleted = Log(tmp_path), Log(tmp_path)
    kept.close()
    deleted.close()
    source = EventFileSource(
        [tmp_path], open_paths=lambda: [str(tmp_path / "events.out.tfevents.gone")]
    )
    assert latest(source.sample(0.0))["event_files"] == 2
    deleted.path.unlink()
    values = latest(source.sample(1.0))
    assert values["event_files"] == 1
    assert values["event_file_bytes"] == kept.path.stat().st_size


def test_target_gone_propagates(tmp_path: Path) -> None:
    def gone() -> list[str]:
        raise TargetGone(42, "process 42 has exited")

    with pytest.raises(TargetGone):
        EventFileSource([tmp_path], open_paths=gone).sample(0.0)


def test_access_denied_falls_back_to_logdirs_and_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    Log(tmp_path).close()

    def denied() -> list[str]:
        raise TargetAccessDenied(42, "the open files (/proc/PID/fd)")

    source = EventFileSource([tmp_path], open_paths=denied)
    with caplog.at_level(logging.WARNING):
        assert latest(source.sample(0.0))["event_files"] == 1
        assert latest(source.sample(1.0))["event_files"] == 1
    assert len([r for r in caplog.records if "permission denied" in r.getMessage()]) == 1


def record_starts(path: Path) -> list[int]:
    """Offsets of the records of an event file (the first is the file-version record)."""
    data = path.read_bytes()
    starts = [0]
    while starts[-1] < len(data):
        (length,) = struct.unpack_from("<Q", data, starts[-1])
        starts.append(starts[-1] + 12 + length + 4)
    return starts[:-1]


def corrupt(path: Path, offset: int) -> None:
    with path.open("r+b") as file:
        file.seek(offset)
        byte = file.read(1)
        file.seek(offset)
        file.write(bytes([byte[0] ^ 0xFF]))


def warnings_about(path: Path, caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if str(path) in r.getMessage()]


def test_a_record_failing_its_checksum_is_skipped_with_one_warning(
    tmp_path: Path, log: Log, caplog: pytest.LogCaptureFixture
) -> None:
    for step in (1, 2, 3):
        log.scalar(step, float(step), loss=1.0)
    log.flush()
    corrupt(log.path, record_starts(log.path)[2] + 12)  # step 2's first data byte
    source = EventFileSource([tmp_path])
    with caplog.at_level(logging.WARNING):
        assert latest(source.sample(0.0))["train_step"] == 3
        log.scalar(4, 4.0, loss=1.0)
        log.flush()
        corrupt(log.path, record_starts(log.path)[4] + 12)  # step 4's: skipped silently
        log.scalar(5, 5.0, loss=1.0)
        log.flush()
        assert latest(source.sample(1.0))["train_step"] == 5
    (warning,) = warnings_about(log.path, caplog)
    assert "fails its checksum and is skipped" in warning


def test_a_file_whose_framing_is_lost_is_dropped_with_one_warning_others_go_on(
    tmp_path: Path, log: Log, caplog: pytest.LogCaptureFixture
) -> None:
    other = Log(tmp_path / "train")
    for step in (1, 2, 3):
        log.scalar(step, float(step), loss=1.0)
        other.scalar(step, float(step) + 0.5, acc=1.0)
    log.flush()
    other.flush()
    corrupt(log.path, record_starts(log.path)[2])  # step 2's length
    source = EventFileSource([tmp_path])
    with caplog.at_level(logging.WARNING):
        assert latest(source.sample(0.0))["train_step"] == 3  # from the other file
        other.scalar(4, 4.5, acc=1.0)
        other.flush()
        values = latest(source.sample(1.0))
    other.close()
    assert values["train_step"] == 4
    assert values["event_files"] == 2  # still counted and sized
    (warning,) = warnings_about(log.path, caplog)
    assert f"corrupt at byte {record_starts(log.path)[2]}" in warning
    assert "no longer read" in warning


def test_read_budget_spreads_a_backlog_over_ticks_losing_nothing(tmp_path: Path, log: Log) -> None:
    for step in range(1, 6):
        log.scalar(step, float(step), loss=math.nan)
    log.flush()
    source = EventFileSource([tmp_path], read_budget_seconds=0.0)  # one event per tick
    ticks = [source.sample(float(t)) for t in range(8)]
    assert [latest(tick).get("train_step") for tick in ticks] == [None, 1, 2, 3, 4, 5, 5, 5]
    assert sum(len(of("step_seconds", tick)) for tick in ticks) == 4
    assert latest(ticks[-1])["nonfinite_total"] == 5


def test_missing_tensorboard_makes_the_source_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    eventfiles._tensorboard.cache_clear()
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    with pytest.raises(SourceUnavailable, match=r"pip install 'driftwatch\[tf\]'"):
        EventFileSource([tmp_path]).sample(0.0)
    assert describe() == (False, eventfiles._MISSING)
    monkeypatch.undo()
    assert describe()[0]


def test_describe_names_the_tensorboard_version() -> None:
    import tensorboard

    ok, text = describe()
    assert ok
    assert tensorboard.__version__ in text


def test_reading_event_files_does_not_import_tensorflow(tmp_path: Path, log: Log) -> None:
    for step in range(4):
        log.scalar(step, float(step), loss=1.0)
    log.flush()
    code = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from driftwatch.sources.eventfiles import EventFileSource, describe
        assert describe()[0]
        samples = EventFileSource([Path({str(tmp_path)!r})]).sample(0.0)
        assert {{s.series: s.value for s in samples}}["train_step"] == 3, samples
        assert "tensorflow" not in sys.modules, "tensorflow was imported"
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=120)


TF_WRITER = """
import math, sys, time
import tensorflow as tf
writer = tf.summary.create_file_writer(sys.argv[1])
with writer.as_default():
    for step in range(int(sys.argv[2]) + 1):
        tf.summary.scalar("loss", math.nan if step == 2 else 1.0 / (step + 1), step=step)
        tf.summary.scalar("accuracy", step / 10, step=step)
        time.sleep(0.02)
writer.flush()
"""


@pytest.mark.tf
@pytest.mark.paired
@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs TensorFlow")
def test_reads_what_tensorflow_writes(tmp_path: Path) -> None:
    steps = 5
    subprocess.run(
        [sys.executable, "-c", TF_WRITER, str(tmp_path / "train"), str(steps)],
        check=True,
        env={**os.environ, **TF_ENV},
        timeout=240,
    )
    samples = EventFileSource([tmp_path]).sample(0.0)
    values = latest(samples)
    assert values["event_files"] == 1
    assert values["train_step"] == steps
    assert values["nonfinite_total"] == 1
    durations = [s.value for s in of("step_seconds", samples)]
    assert len(durations) == steps
    assert all(0.015 < d < 10 for d in durations)


def test_a_replayed_file_whose_first_record_is_dated_later_still_yields_every_step(
    tmp_path: Path,
) -> None:
    """A summary writer dates its first record when it is created: here three years after the
    scalars it then holds. Every logged step is replayed all the same."""
    log = EventLog(tmp_path, created=T0 + 3 * YEAR)
    for i in range(600):
        log.scalar(i, T0 + i, "loss", 1.0)
    log.close()
    stamps = [s for s in replay_logdir(tmp_path) if s.series == "step_timestamp"]
    assert len(stamps) >= 600


def test_read_budget_stopping_a_read_says_how_far_behind_once(
    tmp_path: Path, log: Log, caplog: pytest.LogCaptureFixture
) -> None:
    for step in range(1, 4):
        log.scalar(step, float(step), loss=1.0)
    log.flush()
    source = EventFileSource([tmp_path], read_budget_seconds=0.0)  # one event per tick
    with caplog.at_level(logging.WARNING):
        ticks = [latest(source.sample(float(t))) for t in range(6)]
    unread = [tick["event_file_unread_bytes"] for tick in ticks]
    starts = record_starts(log.path)
    size = log.path.stat().st_size
    assert unread == [size - start for start in starts[1:]] + [0.0, 0.0, 0.0]
    behind = [r.getMessage() for r in caplog.records if "written faster than" in r.getMessage()]
    assert len(behind) == 1
    assert "event_file_unread_bytes" in behind[0]
    assert ticks[-1]["train_step"] == 3


def test_keeping_up_leaves_nothing_unread_and_warns_nothing(
    tmp_path: Path, log: Log, caplog: pytest.LogCaptureFixture
) -> None:
    source = EventFileSource([tmp_path])
    with caplog.at_level(logging.WARNING):
        for step in range(1, 4):
            log.image(step, float(step), "samples", 200_000)
            log.scalar(step, float(step), loss=1.0)
            log.flush()
            assert latest(source.sample(float(step)))["event_file_unread_bytes"] == 0
    assert caplog.records == []


def pread_counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of what ``records`` reads from files from now on."""
    reads: list[int] = []
    pread = os.pread

    def counted(fd: int, n: int, offset: int) -> bytes:
        data = pread(fd, n, offset)
        reads.append(len(data))
        return data

    monkeypatch.setattr(os, "pread", counted)  # records reads through os.pread
    return reads


@pytest.mark.parametrize("tf1", [False, True], ids=["tf2-tensor", "tf1-image"])
def test_large_image_records_are_skipped_by_their_length_their_steps_read(
    tmp_path: Path, log: Log, monkeypatch: pytest.MonkeyPatch, tf1: bool
) -> None:
    written = []
    for step in range(1, 6):
        log.image(step, 100.0 + step, "samples", 500_000, tf1=tf1)
        log.scalar(step, 100.5 + step, loss=float(step))
        written += [(step, 100.0 + step, "samples"), (step, 100.5 + step, "loss")]
    log.close()
    reads = pread_counted(monkeypatch)
    reader = eventfiles.tail(str(log.path))
    events = [event_pb2.Event.FromString(r) for r in reader.records][1:]  # after the version
    assert sum(reads) < 0.02 * log.path.stat().st_size
    assert [(e.step, e.wall_time, e.summary.value[0].tag) for e in events] == written
    plugins = {e.summary.value[0].metadata.plugin_data.plugin_name for e in events[::2]}
    assert plugins == ({""} if tf1 else {"images"})
    assert [e.summary.value[0].WhichOneof("value") for e in events[::2]] == 5 * [
        "image" if tf1 else "tensor"
    ]
    scalars = [s for e in events for s in reader.scalars_of(e)]
    assert [(s.step, s.value, s.key[1]) for s in scalars] == [(i, i, "loss") for i in range(1, 6)]
    assert reader.records.offset == log.path.stat().st_size


@pytest.mark.parametrize("tf1", [False, True], ids=["tf2-tensor", "tf1-image"])
def test_a_large_value_of_a_tag_that_holds_no_scalar_is_left_out_once_that_is_known(
    log: Log, tf1: bool
) -> None:
    """The first image tells its tag holds no scalar; later ones keep their event's wall
    time and step and lose the value, unwalked."""
    for step in range(1, 4):
        log.image(step, 100.0 + step, "samples", 500_000, tf1=tf1)
        log.scalar(step, 100.5 + step, loss=float(step))
    log.close()
    reader = eventfiles.tail(str(log.path))
    read = list(reader.read())[1:]  # after the file version
    assert [(t, [(s.step, s.value) for s in found]) for t, found in read] == [
        (101.0, []),
        (101.5, [(1, 1.0)]),
        (102.0, []),
        (102.5, [(2, 2.0)]),
        (103.0, []),
        (103.5, [(3, 3.0)]),
    ]
    assert reader._tags.never_scalar == {b"samples"}
    crc = masked(google_crc32c.value)
    walked = records.Records(str(log.path), crc)
    told = records.Records(str(log.path), crc, dropped_tags={b"samples"})
    images = [event_pb2.Event.FromString(r) for r in walked][1::2]
    left_out = [event_pb2.Event.FromString(r) for r in told][1::2]
    assert [len(e.summary.value) for e in images] == [1, 1, 1]
    assert [
        (e.step, e.wall_time, e.WhichOneof("what"), len(e.summary.value)) for e in left_out
    ] == [
        (1, 101.0, "summary", 0),
        (2, 102.0, "summary", 0),
        (3, 103.0, "summary", 0),
    ]


def test_a_large_merged_summary_keeps_its_scalars(tmp_path: Path, log: Log) -> None:
    """TF1's ``merge_all``: scalars, an image and a histogram in one event."""
    for step in range(1, 4):
        event = event_pb2.Event(wall_time=10.0 * step, step=step)
        event.summary.value.add(tag="loss", simple_value=1.0 / step)
        image = summary_pb2.Summary.Image(height=8, width=8, encoded_image_string=b"x" * 100_000)
        event.summary.value.add(tag="input", image=image)
        histogram = summary_pb2.HistogramProto(bucket_limit=range(2000), bucket=[1.0] * 2000)
        event.summary.value.add(tag="weights", histo=histogram)
        event.summary.value.add(tag="accuracy", simple_value=math.nan)
        log.event(event)
    log.close()
    assert record_sizes(log.path)[1] > records.SMALL_RECORD_BYTES
    assert driftwatchs_scalars(log.path) == tensorboards_scalars(log.path)
    assert [s[3] for s in driftwatchs_scalars(log.path)] == 3 * ["loss", "accuracy"]


@pytest.mark.parametrize("cut", [6, 40, 300_000, -1], ids=["header", "fields", "payload", "crc"])
def test_a_large_record_cut_off_is_read_once_completed(tmp_path: Path, log: Log, cut: int) -> None:
    log.scalar(1, 1.0, loss=1.0)
    log.image(2, 2.0, "samples", 400_000)
    log.scalar(2, 2.5, loss=1.0)
    log.close()
    starts = record_starts(log.path)
    data = log.path.read_bytes()
    start, end = starts[-2], starts[-1]
    os.truncate(log.path, start + cut % (end - start))
    source = EventFileSource([tmp_path])
    assert latest(source.sample(0.0))["train_step"] == 1
    with log.path.open("r+b") as f:
        f.write(data)
    assert latest(source.sample(1.0))["train_step"] == 2


def test_a_large_record_that_does_not_walk_is_read_whole_and_skipped_if_corrupt(
    tmp_path: Path, log: Log, caplog: pytest.LogCaptureFixture
) -> None:
    log.image(1, 1.0, "samples", 400_000)
    log.scalar(1, 1.5, loss=1.0)
    log.image(2, 2.0, "samples", 400_000)
    log.scalar(2, 2.5, loss=1.0)
    log.close()
    image = record_starts(log.path)[1]
    # The summary's length (after wall time and step): now past the record's end.
    with log.path.open("r+b") as f:
        f.seek(image + 12 + 9 + 2 + 1)
        f.write(b"\xff\xff\xff\x7f")
    with caplog.at_level(logging.WARNING):
        values = latest(EventFileSource([tmp_path]).sample(0.0))
    assert values["train_step"] == 2
    (warning,) = warnings_about(log.path, caplog)
    assert "fails its checksum and is skipped" in warning


def test_a_varint_cut_short_or_longer_than_ten_bytes_is_malformed() -> None:
    """The one varint reader of event files' bytes: ``Malformed`` where the bytes end (or
    ``end`` does) before the varint, or it runs past 10 bytes; never ``IndexError``, nor a
    value read past ``end``, nor one of more than 64 bits."""
    longest = b"\xff" * 9 + b"\x01"  # 2**64 - 1, as 10 bytes
    assert protowire.varint(longest, 0, len(longest)) == (2**64 - 1, 10)
    assert protowire.varint(b"\x00\x96\x01\x05", 1, 4) == (150, 3)
    assert protowire.varint(b"\xff" * 9 + b"\x7f", 0, 10) == (2**64 - 1, 10)  # as protobuf
    for cut in range(len(longest)):  # the bytes go on, ``end`` cuts the varint short
        with pytest.raises(protowire.Malformed):
            protowire.varint(longest, 0, cut)
    with pytest.raises(protowire.Malformed):
        protowire.varint(b"\x96\x96", 0, 2)  # the bytes end before the varint
    with pytest.raises(protowire.Malformed):
        protowire.varint(b"\xff" * 10 + b"\x01", 0, 11)  # 11 bytes
    for field in (b"\x12\x96", b"\x02\x00", b"\x0b\x00"):  # cut short; number 0; a group
        with pytest.raises(protowire.Malformed):
            protowire.field_size(field, 0, len(field))


def test_a_record_whose_step_runs_past_ten_bytes_is_skipped_as_protobuf_refuses_it(
    tmp_path: Path,
) -> None:
    crc = masked(google_crc32c.value)
    good = [event_pb2.Event(wall_time=t, step=1).SerializeToString() for t in (1.0, 3.0)]
    head = struct.pack("<Bd", protowire.WALL_TIME_KEY, 2.0) + bytes((protowire.STEP_KEY,))
    bad = head + b"\xff" * 10 + b"\x01" + bytes((protowire.SUMMARY_KEY, 0))
    with pytest.raises(DecodeError):
        event_pb2.Event.FromString(bad)
    path = tmp_path / "events.out.tfevents.1.host"
    with path.open("wb") as file:
        for data in (good[0], bad, good[1]):
            length = struct.pack("<Q", len(data))
            file.write(length + struct.pack("<I", crc(length)))
            file.write(data + struct.pack("<I", crc(data)))
    assert [wall_time for wall_time, _ in eventfiles.tail(str(path)).read()] == [1.0, 3.0]


def record_sizes(path: Path) -> list[int]:
    starts = record_starts(path)
    ends = [*starts[1:], path.stat().st_size]
    return [end - start for start, end in zip(starts, ends, strict=True)]


Scalars = list[tuple[float, int, str, str]]


def tensorboards_scalars(path: Path) -> Scalars:
    """What tensorboard's own loader (its migrations included) and driftwatch's rule as it was
    make of a file: every value of a tag whose latest metadata says scalar, that holds one
    number (values as ``repr``: NaN equals NaN)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    scalar_tags: set[str] = set()
    found = []
    for event in EventFileLoader(str(path)).Load():
        for value in event.summary.value:
            if value.HasField("metadata"):
                if value.metadata.data_class == summary_pb2.DATA_CLASS_SCALAR:
                    scalar_tags.add(value.tag)
                else:
                    scalar_tags.discard(value.tag)
            if value.tag in scalar_tags and value.HasField("tensor"):
                array = tensor_util.make_ndarray(value.tensor)
                if array.size == 1:
                    number = repr(float(array.ravel()[0]))
                    found.append((event.wall_time, event.step, number, value.tag))
    return found


def driftwatchs_scalars(path: Path) -> Scalars:
    """What the event-file source and ``analyze`` read (most records never parsed)."""
    reader = eventfiles.tail(str(path))
    return [
        (s.wall_time, s.step, repr(s.value), s.key[1])
        for _wall_time, scalars in reader.read()
        for s in scalars
    ]


def tensorboards_events(path: Path) -> list[tuple[float, int, str | None]]:
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader

    events = map(event_pb2.Event.FromString, RawEventFileLoader(str(path)).Load())
    return [(e.wall_time, e.step, e.WhichOneof("what")) for e in events]


def driftwatchs_events(path: Path) -> list[tuple[float, int, str | None]]:
    return [
        (e.wall_time, e.step, e.WhichOneof("what"))
        for e in map(event_pb2.Event.FromString, eventfiles.tail(str(path)).records)
    ]


def test_scalars_are_those_tensorboards_reader_finds(tmp_path: Path, log: Log) -> None:
    """Every form a scalar (or a look-alike) takes, small and large: the same scalars."""
    log_every_scalar_form(log)
    found = driftwatchs_scalars(log.path)
    assert found == tensorboards_scalars(log.path)
    assert {tag for *_, tag in found} == {
        *("loss", "accuracy", "epoch_loss", "tf1", "int", "half", "shifty")
    }
    assert driftwatchs_events(log.path) == tensorboards_events(log.path)


def test_a_record_read_without_parsing_reads_as_parsed_even_when_mangled(log: Log) -> None:
    """``Tags.quick`` on each record of every scalar form, then on 300 mangled copies of
    each (a byte changed, or cut short): no answer, or the parsed record's (where parsing
    refuses one, over a part ``quick`` skips unread, its answer is not checked)."""
    log_every_scalar_form(log)
    reader = eventfiles.tail(str(log.path))
    list(reader.read())  # every tag seen: settled where it can be
    tags = reader._tags

    def parsed(record: bytes) -> tuple[float, int, list[tuple[str, float]]] | None:
        try:
            event = event_pb2.Event.FromString(record)
        except DecodeError:
            return None
        if event.WhichOneof("what") != "summary":
            return None
        return event.wall_time, event.step, copy.deepcopy(tags).scalars(event.summary.value)

    records_ = list(eventfiles.tail(str(log.path)).records)
    quick = [tags.quick(record) for record in records_]
    # Settled tags only ("loss" is also a run-metadata tag here: never settled), one number.
    answered = [[tag for tag, _ in q[2]] for q in quick if q is not None]
    assert answered == 3 * [["epoch_loss"], [], []]  # and two images, left out
    for record in [*records_, *merged_forms(records_[2])]:
        answer = tags.quick(record)
        assert answer is None or same(answer, parsed(record)), record.hex()
    rng = random.Random(15)
    checked = 0
    for record in records_:
        for _ in range(300):
            mangled = bytearray(record)
            if rng.random() < 0.8:
                mangled[rng.randrange(len(mangled))] = rng.randrange(256)
            else:
                del mangled[rng.randrange(len(mangled)) :]
            answer = tags.quick(bytes(mangled))
            expected = parsed(bytes(mangled))
            if answer is not None and expected is not None:
                checked += 1
                assert same(answer, expected), (record.hex(), mangled.hex())
    assert checked > 500


def merged_forms(record: bytes) -> list[bytes]:
    """Forms protobuf reads as the merge of their parts (a later field wins, repeated ones
    add up), built on an event of one value of a scalar tag."""
    event = event_pb2.Event.FromString(record)
    (value,) = event.summary.value
    one, two = (tensor_util.make_tensor_proto(x) for x in (1.0, 2.0))
    values = [
        summary_pb2.Summary.Value(tag=value.tag, tensor=one),
        summary_pb2.Summary.Value(tensor=two),
        summary_pb2.Summary.Value(simple_value=3.0),
    ]
    head = bytes(event_pb2.Event(wall_time=event.wall_time, step=event.step).SerializeToString())

    def with_value(data: bytes) -> bytes:
        value_field = b"\x0a" + bytes([len(data)]) + data
        return head + b"\x2a" + bytes([len(value_field)]) + value_field

    first, tensor, simple = (bytes(v.SerializeToString()) for v in values)
    return [
        record + record,  # two events: one, its values twice
        with_value(first + tensor),  # the tensors merge: two numbers
        with_value(first + simple),  # the later of the value's oneof wins
        with_value(values[0].SerializeToString().replace(b"\x42", b"\x15\0\0\0\0\x42")),
    ]


def same(a: object, b: object) -> bool:
    """Equal, NaN equal to NaN."""
    return repr(a) == repr(b)


def log_every_scalar_form(log: Log) -> None:
    tensor = tensor_util.make_tensor_proto
    for step in range(1, 4):
        t = 100.0 * step
        log.scalar(step, t, loss=1.0 / step, accuracy=math.nan)  # TF2, metadata once
        log.scalar(step, t + 1, epoch_loss=float(step))
        event = event_pb2.Event(wall_time=t + 2, step=step)
        event.summary.value.add(tag="tf1", simple_value=float(step))
        event.summary.value.add(tag="int", tensor=tensor(step), metadata=SCALAR_METADATA)
        event.summary.value.add(tag="pair", tensor=tensor([1.0, 2.0]), metadata=SCALAR_METADATA)
        event.summary.value.add(tag="half", tensor=tensor(np_half(step)), metadata=SCALAR_METADATA)
        event.summary.value.add(tag="no-metadata", tensor=tensor(1.0))
        event.summary.value.add(tag="shifty", simple_value=1.0)  # a scalar, then an image
        log.event(event)
        log.image(step, t + 3, "shifty", 200_000 if step == 2 else 100, tf1=step % 2 == 0)
        log.image(step, t + 4, "tf1-image", 100_000, tf1=True)
        log.image(step, t + 5, "small-image", 100)
        graph = event_pb2.Event(wall_time=t + 6, step=step, graph_def=b"g" * 100_000)
        log.event(graph)
        run = event_pb2.TaggedRunMetadata(tag="loss", run_metadata=b"r" * (50 * step))
        log.event(event_pb2.Event(wall_time=t + 7, step=step, tagged_run_metadata=run))
    log.close()


SCALAR_METADATA = scalar_metadata.create_summary_metadata("", "")


def np_half(value: float) -> object:
    import numpy as np

    return np.float16(value)


TF_SUMMARIES = """
import sys
import numpy as np
import tensorflow as tf
logdir = sys.argv[1]
rng = np.random.default_rng(0)
images = rng.integers(0, 256, (3, 128, 128, 3), dtype=np.uint8)
with tf.summary.create_file_writer(logdir + "/tf2").as_default():
    for step in range(4):
        tf.summary.scalar("loss", 1.0 / (step + 1) if step != 2 else float("nan"), step=step)
        tf.summary.scalar("lr", tf.constant(0.1, tf.float64), step=step)
        tf.summary.image("samples", images, step=step, max_outputs=3)
        tf.summary.image("thumb", images[:1, :4, :4], step=step)
        tf.summary.histogram("weights", rng.normal(size=100_000), step=step, buckets=2000)
        tf.summary.text("note", "step %d" % step, step=step)
tf.compat.v1.disable_eager_execution()
with tf.Graph().as_default():
    x = tf.compat.v1.placeholder(tf.float32, [])
    tf.compat.v1.summary.scalar("v1_loss", x)
    tf.compat.v1.summary.image("v1_images", tf.constant(images), max_outputs=3)
    tf.compat.v1.summary.histogram("v1_weights", tf.random.normal([10000]))
    merged = tf.compat.v1.summary.merge_all()
    graph = tf.compat.v1.get_default_graph()
    writer = tf.compat.v1.summary.FileWriter(logdir + "/tf1", graph=graph)
    with tf.compat.v1.Session() as session:
        for step in range(4):
            writer.add_summary(session.run(merged, {x: 2.0 ** -step}), step)
    writer.close()
"""


@pytest.mark.tf
@pytest.mark.paired
@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs TensorFlow")
def test_reads_what_tensorflow_writes_as_tensorboards_reader_does(tmp_path: Path) -> None:
    """TF2 and TF1 summaries of every kind, images large enough to be skipped: the same
    scalars, and the same wall time and step of every event."""
    subprocess.run(
        [sys.executable, "-c", TF_SUMMARIES, str(tmp_path)],
        check=True,
        env={**os.environ, **TF_ENV},
        timeout=240,
    )
    paths = sorted(tmp_path.glob("*/events.out.tfevents.*"))
    assert len(paths) == 2
    for path in paths:
        assert max(record_sizes(path)) > records.SMALL_RECORD_BYTES
        assert driftwatchs_events(path) == tensorboards_events(path)
        found = driftwatchs_scalars(path)
        assert found == tensorboards_scalars(path)
        assert len(found) == (8 if path.parent.name == "tf2" else 4)
