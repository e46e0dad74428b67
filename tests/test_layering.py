"""The core imports and runs without TensorFlow, tensorboard or NVML installed."""

from __future__ import annotations

import subprocess
import sys

BLOCK_OPTIONAL = """
import sys
for name in ("tensorflow", "keras", "tf_keras", "tensorboard", "pynvml"):
    sys.modules[name] = None  # makes `import name` raise ImportError, as if not installed
"""


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCK_OPTIONAL + code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_attach_samples_a_process_without_optional_packages() -> None:
    result = run_python(
        """
import os
from driftwatch.runtime.monitor import Monitor
from driftwatch.sources.eventfiles import EventFileSource
from driftwatch.sources.nvml import NvmlSource
from driftwatch.sources.process import ProcessSource
from driftwatch.target.process import Target

target = Target.attach(os.getpid())
monitor = Monitor("self", target.info, [
    ProcessSource(target), EventFileSource([], target.open_paths), NvmlSource(target.pid)])
snapshot = monitor.tick()
print(sorted(s.name for s in snapshot.sources if not s.up))
print(snapshot.values[("rss_bytes", ())] > 0)
"""
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["['eventfiles', 'nvml']", "True"]
    assert "pip install 'driftwatch[tf]'" in result.stderr
    assert "pip install nvidia-ml-py" in result.stderr


def test_doctor_explains_missing_optional_packages() -> None:
    result = run_python(
        "from driftwatch.commands.cli import main\nsys.argv = ['driftwatch', 'doctor']\nmain()"
    )
    assert result.returncode == 0, result.stderr
    lines = {line.split()[1]: line for line in result.stdout.splitlines()}
    assert lines["eventfiles"].startswith("--")
    assert lines["nvml"].startswith("--")
    assert "not installed" in lines["tensorflow"]


def test_watching_event_files_never_imports_tensorflow() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, driftwatch.commands.cli\n"
            "from driftwatch.sources.eventfiles import describe\n"
            "describe()\n"
            "print(sorted(m for m in ('tensorflow', 'keras', 'pynvml') if m in sys.modules))",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
