"""The hook source against channels written by hand: what a hostile or broken hook can do."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from driftwatch import __version__
from driftwatch.channel.paths import ensure_private_dir
from driftwatch.channel.ring import ChannelWriter
from driftwatch.channel.wire import RUNTIME_META, SERIES_META, RecordKind
from driftwatch.history.reader import HistoryReader
from driftwatch.history.writer import History
from driftwatch.runtime.monitor import Monitor
from driftwatch.series import MAX_LABEL_SETS, MAX_LABEL_VALUE_CHARS
from driftwatch.sources.hook import HookSource
from driftwatch.target.pidns import ProcessId
from driftwatch.target.process import TargetInfo
from tests.test_exporter import samples_of, scrape

PID, CREATE_TIME = 4242, 1_700_000_000.0
PROCESS = ProcessId(PID, 170_000_000_000, 4026531836)


@pytest.fixture
def writer(tmp_path: Path) -> ChannelWriter:
    return ChannelWriter.create(ensure_private_dir(tmp_path / "dw"), PROCESS, CREATE_TIME)


INFO = TargetInfo(PID, CREATE_TIME, "python", ("python",), "ml", os.geteuid())


def monitor_of(writer: ChannelWriter, history: History | None = None) -> Monitor:
    recorder = history.recorder("train", INFO) if history is not None else None
    source = HookSource(writer.path)
    return Monitor("train", INFO, [source], clock=lambda: CREATE_TIME + 10, recorder=recorder)


def exported(monitor: Monitor, metric: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        labels: value
        for (name, labels), value in samples_of(scrape([monitor.tick()])).items()
        if name == metric
    }


def test_series_the_table_does_not_know_or_with_wrong_labels_are_ignored(
    writer: ChannelWriter,
) -> None:
    long = "GPU:" + "9" * 1000
    table = [
        ["tf_allocator_current_bytes", {"device": "CPU:0"}],
        ["made_up_series", {}],  # would grow the store without bound
        ["tf_allocator_current_bytes", {"device": "GPU:0", "pod": "x"}],  # extra label
        ["tf_allocator_current_bytes", {}],  # missing label
        "not a pair",
        ["tf_allocator_current_bytes", {"device": long}],
    ]
    writer.set_meta({SERIES_META: table})
    for key in range(len(table) + 3):  # and keys beyond the table
        writer.write(RecordKind.VALUE, key, CREATE_TIME + 1, a=1e6 + key)
    values = exported(monitor_of(writer), "driftwatch_tf_allocator_current_bytes")
    assert values == {
        (("device", "CPU:0"), ("run", "train")): 1e6,
        (("device", long[:MAX_LABEL_VALUE_CHARS]), ("run", "train")): 1e6 + 5,
    }


def test_the_jobs_versions_are_exported_once_and_kept_as_run_metadata(
    writer: ChannelWriter, tmp_path: Path
) -> None:
    versions = {"python": "3.11.7", "tensorflow": "2.21.0", "cuda": "12.4", "keras": ["x"] * 99}
    writer.set_meta({RUNTIME_META: versions, SERIES_META: []})
    history = History(tmp_path / "history.db")
    monitor = monitor_of(writer, history)
    keras = str(["x"] * 99)[:MAX_LABEL_VALUE_CHARS]
    labels = (("keras", keras), ("python", "3.11.7"), ("run", "train"), ("tensorflow", "2.21.0"))
    assert exported(monitor, "driftwatch_runtime_info") == {labels: 1.0}
    assert exported(monitor, "driftwatch_runtime_info") == {labels: 1.0}  # sent once, kept
    stored = monitor.store.get(("runtime_info", labels[:2] + labels[3:]))
    assert stored is not None
    assert len(stored.raw) == 1
    monitor.close()
    history.close()
    reader = HistoryReader(tmp_path / "history.db")
    assert reader.run(None).meta == {
        "driftwatch": __version__,
        "python": "3.11.7",
        "tensorflow": "2.21.0",
        "keras": keras,
    }
    reader.close()


def test_label_sets_per_series_are_capped_with_one_warning(
    writer: ChannelWriter, caplog: pytest.LogCaptureFixture
) -> None:
    devices = 3 * MAX_LABEL_SETS
    writer.set_meta(
        {SERIES_META: [["tf_allocator_peak_bytes", {"device": f"d{i}"}] for i in range(devices)]}
    )
    monitor = monitor_of(writer)
    with caplog.at_level(logging.WARNING):
        for _tick in range(2):
            for key in range(devices):
                writer.write(RecordKind.VALUE, key, CREATE_TIME + 1, a=float(key))
            values = exported(monitor, "driftwatch_tf_allocator_peak_bytes")
    assert sorted(values.values()) == [float(i) for i in range(MAX_LABEL_SETS)]
    warnings = [r.getMessage() for r in caplog.records if "label sets" in r.getMessage()]
    assert warnings == [
        f"tf_allocator_peak_bytes has {MAX_LABEL_SETS} label sets already; "
        "samples with new labels are dropped"
    ]


def test_an_oversized_series_table_is_ignored(writer: ChannelWriter) -> None:
    pad = "x" * (1 << 20)
    writer.set_meta({SERIES_META: [["tf_allocator_peak_bytes", {"device": "CPU:0"}]], "p": pad})
    writer.write(RecordKind.VALUE, 0, CREATE_TIME + 1, a=1.0)
    assert exported(monitor_of(writer), "driftwatch_tf_allocator_peak_bytes") == {}


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown")
def test_a_channel_planted_by_another_user_is_refused_with_one_warning(
    writer: ChannelWriter, caplog: pytest.LogCaptureFixture
) -> None:
    writer.write(RecordKind.STEP, 1, CREATE_TIME + 1, a=0.5)
    os.chown(writer.path, 65534, 65534)
    monitor = monitor_of(writer)  # watching a process of this user (root)
    with caplog.at_level(logging.WARNING):
        for _tick in range(3):
            assert exported(monitor, "driftwatch_hook_records_lost_total") == {}
    refusals = [r.getMessage() for r in caplog.records if "hook's channel" in r.getMessage()]
    assert len(refusals) == 1
    assert "owned by uid 65534" in refusals[0]


def test_a_stalled_reader_costs_the_writer_nothing_and_counts_the_overrun(
    tmp_path: Path,
) -> None:
    small = ChannelWriter.create(ensure_private_dir(tmp_path / "dw"), PROCESS, CREATE_TIME, 8)
    monitor = monitor_of(small)
    assert exported(monitor, "driftwatch_hook_records_lost_total") == {(("run", "train"),): 0.0}
    for step in range(1, 21):  # the monitor stalls: 20 records into a ring of 8
        small.write(RecordKind.STEP, step, CREATE_TIME + step, a=0.5)
    assert small.dropped == 0  # every write went through
    assert exported(monitor, "driftwatch_hook_records_lost_total") == {(("run", "train"),): 12.0}
    assert exported(monitor, "driftwatch_train_step") == {(("run", "train"),): 20.0}
