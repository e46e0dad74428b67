"""The wheel stands on its own: built from this tree and installed into a fresh virtual
environment, away from any checkout, its ``driftwatch demo`` lists and runs the examples, and
its plain install brings the stack dumps and NVML: a slowing job's finding names a stack dump
that its own py-spy took.

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
import time
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import pytest

from driftwatch.commands.demo import examples
from driftwatch.errors import HistoryError
from driftwatch.history.reader import HistoryReader
from tests.conftest import EXAMPLES, REPO, TF_ENV
from tests.jobs import ONE_THREAD, STOPPED, stop_job
from tests.test_capture_e2e import SLOWDOWNS
from tests.test_run import as_from_a_terminal

BUILT_FROM = ("pyproject.toml", "README.md", "driftwatch")
"""What the build reads: copied to a scratch directory, so the checkout gets no build/."""
DEMO_DEADLINE = 150.0
"""Seconds the demo may take to start its example, show steps and stop."""
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""The ``PATH`` the fresh environment's commands get: the system's directories, none of this
environment's, so that a py-spy they find is the fresh environment's own."""
SLOW_AFTER_SECONDS = 30.0
"""When the slowing job's steps slow down, after its first (``--slow-after-seconds``)."""
SLOWDOWN_DEADLINE = 150.0
"""Seconds the slowing job may take to start, slow down and have its stacks dumped."""


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
    quiet = {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    return {**env, **TF_ENV, **quiet, "PATH": SYSTEM_PATH}


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


@pytest.fixture(scope="module")
def plain_install(installed: Installed) -> Installed:
    """The fresh environment with py-spy and nvidia-ml-py installed into it as pip installs
    them, anew even though this environment, on its path, has them."""
    pip: list[str | Path] = [sys.executable, "-m", "pip", "--python", installed.python]
    run([*pip, "install", "--no-deps", "--ignore-installed", "py-spy", "nvidia-ml-py"])
    return installed


def test_the_plain_install_brings_stack_dumps_and_nvml(plain_install: Installed) -> None:
    # Expected: py-spy and nvidia-ml-py are requirements of the wheel itself, not of an
    # extra; installed as pip installs them, doctor finds py-spy beside the environment's
    # Python (not on the system's PATH) and NVML's module (this machine has no driver: the
    # library is what is missing).
    installed = plain_install
    (metadata,) = installed.site.glob("driftwatch-*.dist-info/METADATA")
    required = {
        re.split(r"[<>=!~;\s]", line.removeprefix("Requires-Dist:").strip())[0].lower()
        for line in metadata.read_text(encoding="utf-8").splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    }
    assert {"py-spy", "nvidia-ml-py"} <= required, required
    assert shutil.which("py-spy", path=SYSTEM_PATH) is None  # only the environment's is found
    doctor = run([installed.driftwatch, "doctor"], cwd=installed.home, env=fresh_env())
    lines = {line.split()[1]: line for line in doctor.stdout.splitlines()}
    beside = installed.python.parent / "py-spy"
    assert lines["py-spy"].startswith(f"ok  py-spy      {beside}:"), lines["py-spy"]
    assert "not installed" not in lines["nvml"], lines["nvml"]
    probe = "import pynvml; print(pynvml.__file__)"
    nvml = run([installed.python, "-c", probe], cwd=installed.home, env=fresh_env()).stdout
    assert Path(nvml.strip()).is_relative_to(installed.site), nvml  # the environment's own


def stacks_named(db: Path) -> tuple[str, str] | None:
    """The latest run's slowdown finding in the history ``db`` that names its stack dump:
    its kind and the dump's path; None while there is none. Fails the test when the finding
    says why the dump could not be made."""
    try:
        reader = HistoryReader(db)
    except HistoryError:
        return None  # not written yet
    try:
        runs = reader.runs()
        findings = reader.findings(runs[0].id) if runs else []
    finally:
        reader.close()
    for finding in findings:
        if finding.kind not in SLOWDOWNS:
            continue
        error = finding.evidence.get("capture_stack_error")
        assert error is None, f"{finding.kind}: {error}"
        stack = finding.evidence.get("capture_stack")
        if stack is not None:
            return finding.kind, str(stack)
    return None


def run_until_stacks_named(installed: Installed, job: list[str], root: Path) -> tuple[str, str]:
    """``job`` under the fresh environment's ``driftwatch run``, its history in
    ``root/history.db``, until that history's slowdown finding names a stack dump; then the
    job gets SIGTERM, as a scheduler stops one. The finding's kind and the dump's path."""
    db, findings = root / "history.db", root / "findings.jsonl"
    command = [str(installed.driftwatch), "run", "--listen", "127.0.0.1:0", "--db", str(db)]
    command += ["--findings", str(findings), "--", *job]
    deadline = time.monotonic() + SLOWDOWN_DEADLINE
    named: tuple[str, str] | None = None
    err = root / "stderr.txt"
    with (
        (root / "stdout.txt").open("w") as stdout,
        err.open("w") as stderr,
        subprocess.Popen(
            command,
            cwd=installed.home,
            env={**fresh_env(), **ONE_THREAD},  # the job keeps to one core
            stdout=stdout,
            stderr=stderr,
        ) as driftwatch,
    ):
        try:
            while driftwatch.poll() is None and named is None:
                assert time.monotonic() < deadline, f"no stack dump named in {SLOWDOWN_DEADLINE} s"
                time.sleep(0.5)
                named = stacks_named(db)
        finally:
            # Stopped whether the test goes on or fails here: no job is left behind.
            stopped = stop_job(driftwatch.pid, job)
            try:
                driftwatch.wait(timeout=60)
            finally:
                if driftwatch.poll() is None:
                    driftwatch.kill()
    reported = findings.read_text() if findings.exists() else ""
    said = f"{err.read_text()[-3000:]}\nfindings:\n{reported[-3000:]}"
    assert named is not None, said  # driftwatch ended before a dump was named
    assert stopped, said  # the job was still running
    assert driftwatch.returncode == STOPPED, said  # the job's status, as driftwatch passes it
    assert "Traceback" not in said, said
    return named


@pytest.mark.tf
@pytest.mark.paired  # any slowdown will do: a neighbour's only brings one sooner
def test_a_slowing_job_under_the_wheel_leaves_its_stacks_dumped_by_the_wheels_py_spy(
    plain_install: Installed, tmp_path: Path
) -> None:
    """The wheel's copy of ``train_keras.py``, its steps 10 ms slower (a few times their
    time) 30 s after its first, under the wheel's ``driftwatch run`` with its default flags
    (``--listen`` on a free port, ``--db`` and ``--findings`` in the test's directory) and
    the system's PATH, so the only py-spy it can find is the one pip put beside the fresh
    environment's Python; until the history's slowdown finding names its stack dump (on a
    busy host the host's own slowdown may come first: its dump is judged the same)."""
    installed = plain_install
    example = installed.site / "driftwatch" / "examples" / "train_keras.py"
    job = [str(installed.python), str(example), "--logdir", str(tmp_path / "logs")]
    job += ["--epochs", "100000", "--seconds", f"{SLOWDOWN_DEADLINE:g}"]  # ends by itself
    job += ["--slow-after-seconds", f"{SLOW_AFTER_SECONDS:g}", "--slow-seconds", "0.01"]
    kind, stack = run_until_stacks_named(installed, job, tmp_path)

    # Expected: the report of the wheel's driftwatch names the same dump, and it exists,
    # private, beside the history; it holds the job's Python stacks: py-spy's header with
    # the job's PID and command line (the wheel's copy of the example), and its main
    # thread's frames: the script's main, the hook's wrapper of fit (the job is hooked) and
    # Keras's fit (where the job spends its time; the callback that slows each step may or
    # may not be caught in it).
    report = json.loads(
        run(
            [installed.driftwatch, "report", "--json", "--db", tmp_path / "history.db"],
            cwd=installed.home,
            env=fresh_env(),
        ).stdout
    )
    slowdown = next(f for f in report["findings"] if f["kind"] == kind)
    assert slowdown["evidence"]["capture_stack"] == stack
    listed = [c for c in report["captures"] if c["what"] == "stack" and c["label"] == kind]
    assert [c["path"] for c in listed] == [stack], report["captures"]
    dump = Path(stack)
    assert dump.is_relative_to(tmp_path / "history.captures"), dump
    assert dump.is_file(), f"{dump} was never written"
    assert dump.stat().st_mode & 0o777 == 0o600
    text = dump.read_text(encoding="utf-8")
    pid = report["run"]["pid"]
    header = text.splitlines()[0]
    assert header.startswith(f"Process {pid}: {' '.join(job)}"), text[:2000]
    assert re.search(r'^Thread \S+ \([^)]*\): "MainThread"$', text, re.MULTILINE), text[:2000]
    for frame in (
        r"\w+\.fit \(keras/src/[\w/]+\.py:\d+\)",
        r"patch_loop\.<locals>\.loop \(driftwatch/hook/autolog\.py:\d+\)",
        r"main \(train_keras\.py:\d+\)",
    ):
        assert re.search(rf"^\s+{frame}$", text, re.MULTILINE), f"{frame}:\n{text[:3000]}"
