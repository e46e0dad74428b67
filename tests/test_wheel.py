"""The wheel stands on its own: built from this tree and installed into a fresh virtual
environment, away from any checkout, its ``driftwatch demo`` lists and runs the examples, and
its plain install brings the stack dumps and NVML.

The fresh environment gets the wheel alone (``--no-deps``); for its third-party packages
(TensorFlow among them) a ``.pth`` file puts this environment's site-packages after its own.
A path in a ``.pth`` file is only appended to ``sys.path``: the ``.pth`` files in that
directory, the editable install's among them, are not processed, so ``import driftwatch``
there finds the wheel's copy, and the tests check that it does.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import pytest

from driftwatch.commands.demo import examples
from tests.conftest import EXAMPLES, REPO, TF_ENV
from tests.test_run import as_from_a_terminal

BUILT_FROM = ("pyproject.toml", "README.md", "driftwatch")
"""What the build reads: copied to a scratch directory, so the checkout gets no build/."""
DEMO_DEADLINE = 150.0
"""Seconds the demo may take to start its example, show steps and stop."""


@dataclass(frozen=True)
class Installed:
    python: Path  # the fresh environment's interpreter
    driftwatch: Path  # its console script
    site: Path  # its site-packages, where the wheel went
    home: Path  # a working directory outside the checkout


def run(
    command: list[str | Path], cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``command``'s output; the test fails if it fails."""
    result = subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"{command}:\n{result.stdout[-2000:]}{result.stderr[-3000:]}"
    return result


def fresh_env() -> dict[str, str]:
    """This environment, without anything that would lead Python back to the checkout."""
    dropped = {"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV"}
    env = {name: value for name, value in os.environ.items() if name not in dropped}
    return {**env, **TF_ENV, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The wheel of this tree, built without build isolation (nothing is downloaded) and
    installed without its dependencies into a new virtual environment."""
    setuptools = version("setuptools")
    if int(setuptools.split(".")[0]) < 77:
        pytest.fail(
            f"setuptools {setuptools} cannot build driftwatch (its SPDX license needs 77 or "
            "later): pip install -e '.[dev]'"
        )
    scratch = tmp_path_factory.mktemp("wheel")
    source = scratch / "source"
    source.mkdir()
    for name in BUILT_FROM:
        if (REPO / name).is_dir():
            ignored = shutil.ignore_patterns("__pycache__")
            shutil.copytree(REPO / name, source / name, ignore=ignored)
        else:
            shutil.copy2(REPO / name, source / name)
    dist = scratch / "dist"
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    pip = [sys.executable, "-m", "pip"]
    run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", dist, source])
    (wheel,) = dist.glob("driftwatch-*.whl")

    venv = scratch / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    run([*pip, "--python", python, "install", "--no-deps", "--no-index", wheel], env=env)
    where = run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"])
    site = Path(where.stdout.strip())
    ours = dict.fromkeys(sysconfig.get_path(kind) for kind in ("purelib", "platlib"))
    (site / "project_site_packages.pth").write_text("".join(f"{path}\n" for path in ours))
    home = scratch / "home"
    home.mkdir()
    return Installed(python, venv / "bin" / "driftwatch", site, home)


def test_the_wheel_lists_the_examples_from_its_own_copy(installed: Installed) -> None:
    probe = (
        "import json, sys, driftwatch, driftwatch.commands.demo as demo\n"
        "names = [example.name for example in demo.examples()]\n"
        "print(json.dumps({'package': driftwatch.__file__, 'examples': str(demo.EXAMPLES_DIR),"
        " 'names': names, 'modules': sorted(sys.modules)}))\n"
    )
    seen = json.loads(
        run([installed.python, "-c", probe], cwd=installed.home, env=fresh_env()).stdout
    )
    assert Path(seen["package"]).is_relative_to(installed.site), seen["package"]
    assert Path(seen["examples"]) == installed.site / "driftwatch" / "examples"
    # Listing the examples reads their source: neither they nor TensorFlow are imported, and
    # the checkout's editable install was never reached.
    imported = {name.partition(".")[0] for name in seen["modules"]}
    assert not imported & {"tensorflow", "keras", "common", *seen["names"]}
    assert not [name for name in imported if name.startswith("__editable__")]

    listed = run([installed.driftwatch, "demo", "--list"], cwd=installed.home, env=fresh_env())
    names = [line.split()[0] for line in listed.stdout.splitlines()]
    assert names == seen["names"] == [example.name for example in examples(EXAMPLES)]
    assert "slow_and_diverging" in names


@pytest.mark.tf
@pytest.mark.paired
def test_the_wheel_runs_an_example_under_the_demo(installed: Installed, tmp_path: Path) -> None:
    """``driftwatch demo train_keras`` until the hook's steps show, then Ctrl-C (SIGINT, which
    the demo passes on to the job): the demo still ends with its summary and report."""
    stderr = tmp_path / "stderr.txt"
    with stderr.open("w") as errors:
        demo = subprocess.Popen(
            [installed.driftwatch, "demo", "train_keras"],
            cwd=installed.home,
            env={**fresh_env(), "TMPDIR": str(tmp_path)},  # where the demo's directory goes
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            preexec_fn=as_from_a_terminal,  # the SIGINT it forwards must not be ignored
        )
    watchdog = threading.Timer(DEMO_DEADLINE, demo.kill)
    watchdog.start()
    try:
        assert demo.stdout is not None
        live = ""
        for line in demo.stdout:
            live += line
            if re.search(r"; step: [1-9]", line):
                break
        demo.send_signal(signal.SIGINT)
        summary = demo.stdout.read()
        demo.wait()
    finally:
        watchdog.cancel()
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    said = f"{live[-1500:]}{summary}\n{stderr.read_text()[-3000:]}"
    assert re.search(r"; step: [1-9]", live), said  # the hook works from the wheel
    assert demo.returncode == 128 + signal.SIGINT, said  # the job's status, as a shell has it
    assert re.search(r"steps: last step [1-9]", summary), said
    paths = dict(re.findall(r"^(findings|report|logs): (\S+)$", summary, re.MULTILINE))
    assert set(paths) == {"findings", "report", "logs"}, said
    assert all(Path(path).is_relative_to(tmp_path) for path in paths.values()), paths
    assert any(Path(paths["logs"]).rglob("events.out.tfevents.*")), paths["logs"]
    # The job the demo ran is the wheel's copy of the example.
    example = installed.site / "driftwatch" / "examples" / "train_keras.py"
    assert str(example) in Path(paths["report"]).read_text(encoding="utf-8")


def test_the_plain_install_brings_stack_dumps_and_nvml(installed: Installed) -> None:
    # Expected: py-spy and nvidia-ml-py are requirements of the wheel itself, not of an
    # extra; installed as pip installs them, doctor finds py-spy beside the environment's
    # Python and NVML's module (this machine has no driver: the library is what is missing).
    (metadata,) = installed.site.glob("driftwatch-*.dist-info/METADATA")
    required = {
        re.split(r"[<>=!~;\s]", line.removeprefix("Requires-Dist:").strip())[0].lower()
        for line in metadata.read_text(encoding="utf-8").splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    }
    assert {"py-spy", "nvidia-ml-py"} <= required, required
    pip: list[str | Path] = [sys.executable, "-m", "pip", "--python", installed.python]
    # Installed anew even though the checkout's environment, on its path, has them.
    run([*pip, "install", "--no-deps", "--ignore-installed", "py-spy", "nvidia-ml-py"])
    doctor = run([installed.driftwatch, "doctor"], cwd=installed.home, env=fresh_env())
    lines = {line.split()[1]: line for line in doctor.stdout.splitlines()}
    assert lines["py-spy"].startswith("ok"), lines["py-spy"]
    assert "not installed" not in lines["nvml"], lines["nvml"]
