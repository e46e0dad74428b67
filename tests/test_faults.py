"""Faults injected while ``driftwatch attach`` runs as a real subprocess.

Each test asserts that attach keeps working (or ends cleanly, with its summary), keeps what it
had, and says what happened. Faults already covered elsewhere: a target that is killed or
becomes a zombie, a busy port, access denied and malformed flags (test_cli), a PID reused
under a ``Target`` (test_target), a stalled or absent reader of the hook's channel
(test_channel, test_hook_source), corrupt and truncated event files (test_eventfiles).
"""

from __future__ import annotations

import math
import re
import shutil
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from driftwatch.sources.eventfiles import describe
from tests.conftest import REPO, wait_for
from tests.test_eventfiles import Log, corrupt, record_starts
from tests.test_exporter import samples_of
from tests.test_target import _spawn_with_pid

Labels = tuple[tuple[str, str], ...]


@pytest.fixture(autouse=True, scope="module")
def _tensorboard_stub() -> None:
    """Event files are written here with tensorboard's writer on its stub, not TensorFlow."""
    ok, why = describe()
    assert ok, why


class Attached:
    """``driftwatch attach PID`` sampling every 0.1 s; its output goes to files, not pipes."""

    def __init__(self, tmp_path: Path, pid: int, *args: str, prelude: str = "") -> None:
        self._err_path = tmp_path / "attach.err"
        self._out_path = tmp_path / "attach.out"
        code = f"{prelude}\nfrom driftwatch.commands.cli import main\nmain()"
        with self._out_path.open("w") as out, self._err_path.open("w") as err:
            self.process = subprocess.Popen(
                [
                    *(sys.executable, "-c", code, "attach", str(pid)),
                    *("--interval", "0.1", "--listen", "127.0.0.1:0", *args),
                ],
                stdout=out,
                stderr=err,
                cwd=REPO,
            )
        wait_for(lambda: "metrics at" in self.stderr(), 60, "attach to start serving")
        url = re.search(r"metrics at (\S+)", self.stderr())
        assert url is not None
        self.url = url.group(1)

    def stderr(self) -> str:
        return self._err_path.read_text()

    def metrics(self) -> dict[tuple[str, Labels], float]:
        with urllib.request.urlopen(self.url, timeout=10) as response:
            return samples_of(response.read().decode())

    def value(self, name: str, **labels: str) -> float:
        """The value of the run's sample of ``name`` with these labels (and maybe others);
        NaN while there is none."""
        wanted = {("run", "faults"), *labels.items()}
        for (sample, sample_labels), value in self.metrics().items():
            if sample == name and wanted <= set(sample_labels):
                return value
        return math.nan

    def wait_value(self, name: str, expected: float, what: str, **labels: str) -> None:
        wait_for(lambda: self.value(name, **labels) == expected, 30, what)

    def ticks_on(self) -> None:
        """Wait until attach has taken a sample after this call (it is still working)."""
        before = self.value("driftwatch_last_sample_timestamp_seconds")
        wait_for(
            lambda: (
                self.value("driftwatch_last_sample_timestamp_seconds") > before
                and self.value("driftwatch_process_resident_memory_bytes") > 0
            ),
            30,
            "another sample",
        )

    def finish(self) -> tuple[int, str, str]:
        """Wait for attach to end; its exit code, output and errors."""
        code = self.process.wait(timeout=30)
        return code, self._out_path.read_text(), self.stderr()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


Attach = Callable[..., Attached]
"""``attach(pid, *args, prelude="")``: start ``Attached`` on run ``faults``."""


@pytest.fixture
def attach(tmp_path: Path) -> Iterator[Attach]:
    """Starts ``Attached`` runs; kills those still running after the test."""
    started: list[Attached] = []

    def start(pid: int, *args: str, prelude: str = "") -> Attached:
        started.append(Attached(tmp_path, pid, "--run", "faults", *args, prelude=prelude))
        return started[-1]

    yield start
    for attached in started:
        attached.kill()


def test_pid_reused_while_attached(attach: Attach, sleeper: subprocess.Popen[bytes]) -> None:
    watching = attach(sleeper.pid)
    watching.ticks_on()
    watching.process.send_signal(signal.SIGSTOP)  # the swap happens between two samples
    # The signal stops it on its way back to user mode, not at once: a tick between the kill
    # and the impostor would see no process at all.
    stopped = psutil.Process(watching.process.pid)
    wait_for(lambda: stopped.status() == psutil.STATUS_STOPPED, 10, "attach to be stopped")
    sleeper.kill()
    sleeper.wait()
    impostor = _spawn_with_pid(sleeper.pid)
    try:
        watching.process.send_signal(signal.SIGCONT)
        code, out, err = watching.finish()
        assert code == 0, err
        assert f"stopped: process {sleeper.pid} has exited (its PID now belongs to" in out
        assert re.search(r"RSS: .* at start, peak .* at the end", out)  # what it had
        assert impostor.poll() is None  # left alone
        assert "Traceback" not in err
    finally:
        impostor.kill()
        impostor.wait()


@pytest.mark.parametrize(
    ("scenario", "said"),
    [
        ("driver_not_loaded", "nvml source disabled"),
        ("gpu_lost", "GPU 1 has fallen off the bus"),
    ],
)
def test_nvml_failures_switch_nvml_off_and_the_rest_goes_on(
    attach: Attach, sleeper: subprocess.Popen[bytes], scenario: str, said: str
) -> None:
    prelude = (
        "import sys\nfrom tests.fake_pynvml import FakeNvml\n"
        f"sys.modules['pynvml'] = FakeNvml({scenario!r}, {sleeper.pid}).module"
    )
    watching = attach(sleeper.pid, prelude=prelude)
    watching.wait_value("driftwatch_source_up", 0.0, "nvml switched off", source="nvml")
    watching.ticks_on()
    assert watching.value("driftwatch_source_up", source="process") == 1.0
    warnings = [line for line in watching.stderr().splitlines() if "nvml" in line]
    assert len(warnings) == 1, warnings
    assert said in warnings[0]
    if scenario == "gpu_lost":  # what the first sample read is still exported
        assert watching.value("driftwatch_gpu_process_memory_bytes", gpu="0") == 1 << 30
    sleeper.kill()
    code, _out, err = watching.finish()
    assert code == 0, err
    assert "Traceback" not in err


def test_event_file_faults_while_attached(
    attach: Attach, sleeper: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    logdir = tmp_path / "logs"
    first = Log(logdir)
    for step in (1, 2, 3):
        first.scalar(step, 100.0 + step, loss=1.0)
    first.flush()
    watching = attach(sleeper.pid, "--logdir", str(logdir))
    watching.wait_value("driftwatch_train_step", 3.0, "steps from the event file")

    # A record that fails its checksum, then a good one: skipped, with one warning.
    first.scalar(4, 104.0, loss=1.0)
    first.flush()
    corrupt(first.path, record_starts(first.path)[-1] + 12)
    first.scalar(5, 105.0, loss=1.0)
    first.flush()
    watching.wait_value("driftwatch_train_step", 5.0, "the step after the corrupt record")
    assert "fails its checksum and is skipped" in watching.stderr()

    # Rotation: the old file goes, a new one takes over.
    first.close()
    first.path.unlink()
    second = Log(logdir)
    second.scalar(6, 106.0, loss=1.0)
    second.flush()
    watching.wait_value("driftwatch_train_step", 6.0, "steps from the new file")
    watching.wait_value("driftwatch_event_files", 1.0, "the old file dropped")

    # The logdir removed: files drop out, sampling goes on, one warning.
    second.close()
    shutil.rmtree(logdir)
    watching.wait_value("driftwatch_event_files", 0.0, "no event files left")
    watching.ticks_on()
    assert watching.value("driftwatch_train_step") == 6.0  # progress seen is kept
    gone = f"logdir {logdir} no longer exists"
    wait_for(lambda: gone in watching.stderr(), 30, "a warning at the next logdir walk (10 s)")
    watching.ticks_on()
    assert watching.stderr().count(gone) == 1

    sleeper.kill()
    code, out, err = watching.finish()
    assert code == 0, err
    assert "steps: last step 6" in out
    assert "Traceback" not in err
