"""The channel between the in-process hook and the monitor, on real files and processes."""

from __future__ import annotations

import logging
import mmap
import os
import shutil
import stat
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from driftwatch.channel.env import rank_from, tf_cluster_tasks
from driftwatch.channel.paths import (
    ChannelError,
    channel_path,
    ensure_private_dir,
    list_channels,
    runtime_dir,
)
from driftwatch.channel.ring import (
    HEADER_SIZE,
    RECORD_SIZE,
    WRITE_SEQ_OFFSET,
    ChannelReader,
    ChannelWriter,
    NullWriter,
    Record,
    open_writer,
    writer_alive,
)
from driftwatch.target.pidns import ProcessId, identify
from tests.conftest import REPO

PROCESS = ProcessId(4242, 123_456_789, 4026531836)
"""A writer that need not exist: the tests of the file format do not look it up."""

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown")


def write_numbered(writer: ChannelWriter, first: int, last: int) -> None:
    """Records ``first..last``, each carrying its own number so corruption shows."""
    for n in range(first, last + 1):
        writer.write(1, n, float(n), n * 0.5, n * 1.0)


def check_numbered(record: Record) -> None:
    assert record == Record(record.seq, 1, record.seq, record.seq, record.seq * 0.5, record.seq)
    assert record.b == record.a * 2


def seqs(records: list[Record]) -> list[int]:
    return [r.seq for r in records]


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def poke(path: Path, offset: int, fmt: str, *values: object) -> None:
    """Write raw bytes into a channel file, as a writer caught mid-record would have."""
    with open(path, "r+b") as file, mmap.mmap(file.fileno(), 0) as mm:
        struct.pack_into(fmt, mm, offset, *values)


def slot_offset(seq: int, capacity: int) -> int:
    return HEADER_SIZE + (seq - 1) % capacity * RECORD_SIZE


@pytest.fixture
def channel_dir(tmp_path: Path) -> Path:
    return ensure_private_dir(tmp_path / "channels")


@pytest.fixture
def writer(channel_dir: Path) -> Iterator[ChannelWriter]:
    writer = ChannelWriter.create(channel_dir, PROCESS, 1712345678.91, capacity=8)
    yield writer
    writer.close()


# -- records ---------------------------------------------------------------------------


def test_records_round_trip_with_the_writer_identity(channel_dir: Path) -> None:
    writer = ChannelWriter.create(channel_dir, PROCESS, 1712345678.91, capacity=4)
    reader = ChannelReader.open(writer.path)
    assert (reader.process, reader.create_time, reader.capacity) == (PROCESS, 1712345678.91, 4)
    writer.write(3, 0xFFFFFFFF, 1.5, -2.25, float("inf"))
    writer.write(1, 0, 2.0)
    records, lost = reader.read()
    assert records == [
        Record(1, 3, 0xFFFFFFFF, 1.5, -2.25, float("inf")),
        Record(2, 1, 0, 2.0, 0, 0),
    ]
    assert lost == 0
    assert reader.read() == ([], 0)
    reader.close()
    writer.close()


def test_reads_are_incremental_across_the_end_of_the_ring(writer: ChannelWriter) -> None:
    reader = ChannelReader.open(writer.path)
    write_numbered(writer, 1, 5)
    assert seqs(reader.read()[0]) == [1, 2, 3, 4, 5]
    write_numbered(writer, 6, 10)  # slots 6, 7, 8, then 1 and 2 again
    records, lost = reader.read()
    assert (seqs(records), lost) == ([6, 7, 8, 9, 10], 0)
    for record in records:
        check_numbered(record)


def test_a_lapped_reader_gets_the_newest_records_and_the_exact_loss(
    writer: ChannelWriter,
) -> None:
    reader = ChannelReader.open(writer.path)
    write_numbered(writer, 1, 20)
    records, lost = reader.read()
    assert (seqs(records), lost) == (list(range(13, 21)), 12)
    write_numbered(writer, 21, 23)
    assert (seqs(reader.read()[0]), reader.lost_total) == ([21, 22, 23], 12)


def test_a_reader_away_for_a_long_time_resumes_at_the_oldest_record_left(
    writer: ChannelWriter,
) -> None:
    reader = ChannelReader.open(writer.path)
    write_numbered(writer, 1, 3)
    assert seqs(reader.read()[0]) == [1, 2, 3]
    write_numbered(writer, 4, 100_003)
    records, lost = reader.read()
    assert (seqs(records), lost) == (list(range(99_996, 100_004)), 99_992)
    assert reader.lost_total == 99_992
    for record in records:
        check_numbered(record)


def test_records_overwritten_during_the_copy_are_counted_lost_never_returned(
    writer: ChannelWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    reader = ChannelReader.open(writer.path)
    write_numbered(writer, 1, 8)
    real_head = reader._head

    def writer_runs_after_the_head_is_read() -> int:
        head = real_head()
        if head == 8:
            # Between the reader's look at write_seq and its copy, the writer completes
            # 9..11 (over the slots of 1..3) and is half-way through 12: announced, its body
            # is in the slot of 4, whose seq field still says 4.
            write_numbered(writer, 9, 11)
            poke(writer.path, WRITE_SEQ_OFFSET, "<Q", 12)
            poke(writer.path, slot_offset(12, 8) + 8, "<IIddd", 1, 12, 12.0, 6.0, 12.0)
        return head

    monkeypatch.setattr(reader, "_head", writer_runs_after_the_head_is_read)
    records, lost = reader.read()
    assert (seqs(records), lost) == ([5, 6, 7, 8], 4)
    for record in records:
        check_numbered(record)
    writer.write(1, 12, 12.0, 6.0, 12.0)
    records, lost = reader.read()
    assert (seqs(records), lost) == ([9, 10, 11, 12], 0)


def test_a_record_announced_before_its_seq_is_visible_is_retried(
    writer: ChannelWriter,
) -> None:
    reader = ChannelReader.open(writer.path)
    write_numbered(writer, 1, 3)
    poke(writer.path, slot_offset(3, 8), "<Q", 0)  # as if the seq store were not seen yet
    assert (seqs(reader.read()[0]), reader.lost_total) == ([1, 2], 0)
    poke(writer.path, slot_offset(3, 8), "<Q", 3)
    records, lost = reader.read()
    assert (seqs(records), lost) == ([3], 0)
    check_numbered(records[0])


WRITER_PROCESS = """
import os, sys
from driftwatch.channel.ring import ChannelWriter
from driftwatch.target.pidns import identify
total = int(sys.argv[2])
writer = ChannelWriter.create(sys.argv[1], identify(os.getpid()), 1.0, capacity=int(sys.argv[3]))
print(writer.path, flush=True)
sys.stdin.readline()
write = writer.write
for n in range(1, total + 1):
    write(1, n, float(n), n * 0.5, n * 1.0)
writer.close()
"""


@pytest.mark.parametrize("capacity", [8, 4096])
def test_a_reader_keeps_up_with_a_writer_in_another_process(
    channel_dir: Path, capacity: int
) -> None:
    """Every record returned is intact and in order, and none goes unaccounted for.

    A tiny ring makes the writer overwrite records while the reader copies them.
    """
    total = 200_000
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER_PROCESS, str(channel_dir), str(total), str(capacity)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=REPO,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdin is not None
        reader = ChannelReader.open(child.stdout.readline().strip())
        assert reader.process == identify(child.pid)
        child.stdin.write("go\n")
        child.stdin.flush()
        returned = lost_sum = last = 0
        finished = False
        while not finished:
            finished = child.poll() is not None  # then this read sees every record
            records, lost = reader.read()
            lost_sum += lost
            for record in records:
                check_numbered(record)
                assert record.seq > last
                last = record.seq
            returned += len(records)
        assert child.returncode == 0
        assert last == total
        assert returned + lost_sum == total
        assert reader.lost_total == lost_sum
    finally:
        child.kill()
        child.wait()


# -- the writer never disturbs training ------------------------------------------------


def test_the_hot_path_never_raises(writer: ChannelWriter) -> None:
    reader = ChannelReader.open(writer.path)
    write_numbered(writer, 1, 4)
    os.unlink(writer.path)
    write_numbered(writer, 5, 10_000)  # the mapping outlives the name
    assert seqs(reader.read()[0]) == list(range(9_993, 10_001))
    writer.write(-1, 0, 0.0)  # kind out of range
    writer.write(1, 2**32, 0.0)  # key out of range
    writer.write(1, 0, "not a float")  # type: ignore[arg-type]
    assert writer.dropped == 3
    writer.write(1, 10_004, 10_004.0, 5_002.0, 10_004.0)
    records, lost = reader.read()  # skips the abandoned records instead of waiting for them
    assert (seqs(records), lost) == ([10_004], 0)
    writer.close()
    writer.write(1, 10_005, 10_005.0)
    assert writer.dropped == 4
    reader.close()


def test_open_writer_falls_back_to_a_null_writer_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "file").write_text("")
    with caplog.at_level(logging.WARNING, logger="driftwatch.channel"):
        writer = open_writer(os.getpid(), 1.0, tmp_path / "file" / "channels")
        assert isinstance(writer, NullWriter)
        writer.write(1, 2, 3.0, 4.0, 5.0)
        writer.set_meta({"run": "x"})
        writer.close(unlink=True)
    assert len(caplog.records) == 1
    assert "monitoring channel disabled" in caplog.text
    assert str(tmp_path / "file") in caplog.text


def test_open_writer_refuses_an_unsafe_directory_without_raising(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with caplog.at_level(logging.WARNING, logger="driftwatch.channel"):
        assert isinstance(open_writer(os.getpid(), 1.0, shared), NullWriter)
    assert len(caplog.records) == 1
    assert "chmod 700" in caplog.text


def test_open_writer_uses_the_runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRIFTWATCH_RUNTIME_DIR", str(tmp_path / "run"))
    writer = open_writer(os.getpid(), 2.5)
    assert isinstance(writer, ChannelWriter)
    assert writer.path == tmp_path / "run" / f"{os.getpid()}-250.dwc"
    assert ChannelReader.open(writer.path).process == identify(os.getpid())
    writer.close(unlink=True)
    assert list_channels(tmp_path / "run") == []


def test_metadata_is_replaced_atomically(writer: ChannelWriter) -> None:
    reader = ChannelReader.open(writer.path)
    assert reader.meta() == {}
    writer.set_meta({"run": "mnist", "series": [["tf_memory_bytes", {"device": "GPU:0"}]]})
    assert reader.meta() == {"run": "mnist", "series": [["tf_memory_bytes", {"device": "GPU:0"}]]}
    writer.set_meta({"run": "mnist", "logdir": Path("/tmp/logs")})  # not JSON: as a string
    assert reader.meta() == {"run": "mnist", "logdir": "/tmp/logs"}
    sidecar = writer.path.with_suffix(".json")
    assert mode(sidecar) == 0o600
    assert sorted(os.listdir(writer.path.parent)) == [writer.path.name, sidecar.name]


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", ""])
def test_malformed_metadata_reads_as_empty(writer: ChannelWriter, text: str) -> None:
    writer.path.with_suffix(".json").write_text(text)
    assert ChannelReader.open(writer.path).meta() == {}


def test_metadata_failures_are_logged_once_and_never_raised(
    writer: ChannelWriter, caplog: pytest.LogCaptureFixture
) -> None:
    shutil.rmtree(writer.path.parent)
    with caplog.at_level(logging.WARNING, logger="driftwatch.channel"):
        writer.set_meta({"run": "a"})
        writer.set_meta({"run": "b"})
    assert len(caplog.records) == 1
    assert "cannot write the channel metadata" in caplog.text
    writer.write(1, 1, 1.0)
    assert writer.dropped == 0


def test_close_can_remove_the_files(writer: ChannelWriter) -> None:
    writer.set_meta({"run": "x"})
    writer.close(unlink=True)
    assert os.listdir(writer.path.parent) == []


def test_a_stale_file_of_the_same_process_is_replaced(writer: ChannelWriter) -> None:
    write_numbered(writer, 1, 5)
    again = ChannelWriter.create(writer.path.parent, PROCESS, 1712345678.91, capacity=4)
    assert again.path == writer.path
    reader = ChannelReader.open(again.path)
    assert (reader.capacity, reader.read()) == (4, ([], 0))
    assert os.listdir(writer.path.parent) == [writer.path.name]
    again.close()


# -- finding channels ------------------------------------------------------------------


HOLDER_PROCESS = """
import os, sys
from driftwatch.channel.ring import open_writer
print(open_writer(os.getpid(), 1.0, sys.argv[1]).path, flush=True)
sys.stdin.readline()
"""


def test_a_channel_is_alive_until_its_writer_exits_however_it_ends(channel_dir: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER_PROCESS, str(channel_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=REPO,
        text=True,
    )
    assert child.stdout is not None
    path = Path(child.stdout.readline().strip())
    assert writer_alive(path)
    reader = ChannelReader.open(path)
    assert writer_alive(path)  # readers take no lock
    child.kill()  # no chance to clean up: as the OOM killer does it
    child.wait()
    assert not writer_alive(path)
    reader.close()
    assert not writer_alive(channel_dir / "1-1.dwc")


def test_a_closed_writer_leaves_an_abandoned_channel(writer: ChannelWriter) -> None:
    assert writer_alive(writer.path)
    writer.close()
    assert not writer_alive(writer.path)


def test_channels_are_named_by_pid_and_create_time(channel_dir: Path) -> None:
    a = ChannelWriter.create(channel_dir, PROCESS._replace(pid=10), 1000.25, capacity=1)
    b = ChannelWriter.create(channel_dir, PROCESS._replace(pid=2), 5.5, capacity=1)
    for junk in ("x.dwc", ".10-100025.dwc.tmp", "3-4.json", "3-4.dwc.bak"):
        (channel_dir / junk).write_text("")
    assert list_channels(channel_dir) == [(2, 5.5, b.path), (10, 1000.25, a.path)]
    assert channel_path(channel_dir, 10, 1000.25) == channel_dir / "10-100025.dwc"
    assert list_channels(channel_dir / "missing") == []


def test_runtime_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DRIFTWATCH_RUNTIME_DIR", "DRIFTWATCH_SHARED_DIR", "XDG_RUNTIME_DIR"):
        monkeypatch.delenv(name, raising=False)
    assert runtime_dir() == Path(f"/tmp/driftwatch-{os.getuid()}")
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1000")
    assert runtime_dir() == Path("/run/user/1000/driftwatch")
    monkeypatch.setenv("DRIFTWATCH_SHARED_DIR", "/run/driftwatch")
    assert runtime_dir() == Path(f"/run/driftwatch/{os.getuid()}")
    assert runtime_dir(uid=1000) == Path("/run/driftwatch/1000")
    monkeypatch.setenv("DRIFTWATCH_RUNTIME_DIR", "/var/lib/dw")
    assert runtime_dir() == Path("/var/lib/dw")


# -- permissions and refusals ----------------------------------------------------------


def test_files_and_directory_are_private(tmp_path: Path) -> None:
    old_umask = os.umask(0)
    try:
        directory = ensure_private_dir(tmp_path / "b")
        writer = ChannelWriter.create(directory, PROCESS, 1.0, capacity=1)
        writer.set_meta({})
    finally:
        os.umask(old_umask)
    assert mode(directory) == 0o700
    assert mode(writer.path) == 0o600
    assert mode(writer.path.with_suffix(".json")) == 0o600
    assert ensure_private_dir(directory) == directory  # an existing private one is fine
    writer.close()


def test_a_directory_others_can_enter_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "channels"
    directory.mkdir()
    directory.chmod(0o770)
    with pytest.raises(ChannelError, match=f"mode 0770.*chmod 700 {directory}"):
        ensure_private_dir(directory)


def test_a_symlinked_directory_is_refused(tmp_path: Path) -> None:
    real = ensure_private_dir(tmp_path / "real")
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(ChannelError, match="symbolic link"):
        ensure_private_dir(tmp_path / "link")


@needs_root
def test_a_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    directory = ensure_private_dir(tmp_path / "channels")
    os.chown(directory, 65534, 65534)
    with pytest.raises(ChannelError, match="belongs to uid 65534"):
        ensure_private_dir(directory)


@needs_root
def test_a_channel_of_another_user_than_the_targets_is_refused(writer: ChannelWriter) -> None:
    os.chown(writer.path, 65534, 65534)
    ChannelReader.open(writer.path, owner=65534).close()  # root watching nobody's process
    with pytest.raises(ChannelError, match=r"owned by uid 65534.*uid 0\)"):
        ChannelReader.open(writer.path)  # planted for root's own process
    with pytest.raises(ChannelError, match=r"owned by uid 65534.*uid 1000\)"):
        ChannelReader.open(writer.path, owner=1000)


@pytest.mark.parametrize("opened", ["reader", "writer"])
def test_a_world_writable_directory_without_the_sticky_bit_is_refused(
    tmp_path: Path, opened: str
) -> None:
    shared = tmp_path / "shared"
    channels = ensure_private_dir(shared / "channels")
    writer = ChannelWriter.create(channels, PROCESS, 1.0, capacity=1)
    # The reader checks the channel's own directory, the writer its private one's parent.
    parent = channels if opened == "reader" else shared

    def open_up() -> None:
        if opened == "reader":
            ChannelReader.open(writer.path).close()
        else:
            ensure_private_dir(channels)

    parent.chmod(0o777)
    with pytest.raises(ChannelError, match=rf"{parent} is writable by every user.*chmod \+t"):
        open_up()
    parent.chmod(0o1777)  # like /tmp: only owners may rename or remove entries
    open_up()
    writer.close()


def test_a_symlinked_channel_is_refused(writer: ChannelWriter) -> None:
    link = writer.path.with_name("1-1.dwc")
    link.symlink_to(writer.path)
    with pytest.raises(ChannelError, match="symbolic link"):
        ChannelReader.open(link)


def test_a_missing_channel_says_so(channel_dir: Path) -> None:
    with pytest.raises(ChannelError, match="no channel file") as info:
        ChannelReader.open(channel_dir / "1-1.dwc")
    assert isinstance(info.value.__cause__, FileNotFoundError)


def test_a_file_that_is_not_a_channel_is_refused(writer: ChannelWriter) -> None:
    with open(writer.path, "r+b") as file:
        file.write(b"NOTCHAN\0")
    with pytest.raises(ChannelError, match="bad magic"):
        ChannelReader.open(writer.path)


@pytest.mark.parametrize("version", [1, 3])
def test_another_format_is_refused(writer: ChannelWriter, version: int) -> None:
    poke(writer.path, 8, "<I", version)
    with pytest.raises(ChannelError, match=f"version {version} .*reads version 2"):
        ChannelReader.open(writer.path)


def test_a_truncated_channel_is_refused(writer: ChannelWriter) -> None:
    os.truncate(writer.path, HEADER_SIZE + RECORD_SIZE)
    with pytest.raises(ChannelError, match="does not match its capacity"):
        ChannelReader.open(writer.path)


WORKER_1 = '{"cluster": {"worker": ["h0:2222", "h1:2222"]}, "task": {"type": "worker", "index": 1}}'


@pytest.mark.parametrize(
    ("environ", "rank"),
    [
        ({}, ""),  # one process
        ({"TF_CONFIG": WORKER_1}, "worker:1"),
        ({"TF_CONFIG": '{"task": {"type": "chief"}}'}, "chief:0"),  # index 0 left out
        ({"TF_CONFIG": WORKER_1, "DRIFTWATCH_RANK": "w1"}, "w1"),  # the user's word first
        ({"TF_CONFIG": WORKER_1, "RANK": "3"}, "worker:1"),  # TensorFlow's own before a launcher's
        ({"HOROVOD_RANK": "2", "OMPI_COMM_WORLD_RANK": "2"}, "2"),
        ({"OMPI_COMM_WORLD_RANK": "5"}, "5"),
        ({"PMI_RANK": "7"}, "7"),
        ({"SLURM_PROCID": "4"}, "4"),
        ({"RANK": "1"}, "1"),  # torchrun
        ({"TF_CONFIG": "not json", "RANK": "1"}, "1"),  # TensorFlow refuses it itself
        ({"TF_CONFIG": '{"cluster": {}}'}, ""),  # a cluster but no task: no rank
        ({"TF_CONFIG": '{"task": {"type": "worker", "index": "x"}}'}, ""),
        ({"DRIFTWATCH_RANK": "  "}, ""),
    ],
)
def test_a_processs_rank_comes_from_its_own_setting_then_tf_config_then_its_launcher(
    environ: dict[str, str], rank: str
) -> None:
    assert rank_from(environ) == rank


@pytest.mark.parametrize(
    ("tf_config", "tasks"),
    [
        ('{"cluster": {"chief": ["a:1"], "worker": ["b:1", "c:1"]}, "task": {}}', 3),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}}', 1),
        ('{"task": {"type": "worker", "index": 0}}', 0),
        ("not json", 0),
        ("", 0),
    ],
)
def test_the_tasks_of_a_tf_config_cluster_are_counted(tf_config: str, tasks: int) -> None:
    assert tf_cluster_tasks({"TF_CONFIG": tf_config}) == tasks
