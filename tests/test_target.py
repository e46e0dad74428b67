from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from driftwatch.errors import ACCESS_HINT, TargetGone, TargetZombie
from driftwatch.target.access import (
    CAPABILITY_HINT,
    NO_ATTACH_HINT,
    SECURITY_MODULE_HINT,
    USER_NAMESPACE_HINT,
    Privileges,
    access_hint,
    privileges,
)
from driftwatch.target.process import Target, default_run_name, redact_command
from tests.conftest import WITHOUT_PTRACE, unused_pid, wait_for


def test_attach_reads_identity_of_a_live_process(sleeper: subprocess.Popen[bytes]) -> None:
    target = Target.attach(sleeper.pid)
    assert target.pid == sleeper.pid
    assert target.info.command == ("sleep", "300")
    assert target.info.create_time > 0
    target.check_alive()


def test_attach_to_a_missing_pid_says_so() -> None:
    pid = unused_pid()
    with pytest.raises(TargetGone, match=f"no process with PID {pid}"):
        Target.attach(pid)


@pytest.mark.parametrize("pid", [0, -5])
def test_attach_rejects_nonpositive_pids(pid: int) -> None:
    with pytest.raises(TargetGone):
        Target.attach(pid)


def test_attach_to_a_zombie_says_it_has_exited(zombie: subprocess.Popen[bytes]) -> None:
    with pytest.raises(TargetZombie, match="zombie"):
        Target.attach(zombie.pid)


def test_a_target_that_exits_is_gone(sleeper: subprocess.Popen[bytes]) -> None:
    target = Target.attach(sleeper.pid)
    sleeper.kill()
    sleeper.wait()
    with pytest.raises(TargetGone, match="has exited"):
        target.check_alive()


def test_a_killed_unreaped_target_is_a_zombie(sleeper: subprocess.Popen[bytes]) -> None:
    target = Target.attach(sleeper.pid)
    sleeper.kill()  # not reaped: the fixture waits for it afterwards
    wait_for(lambda: target.process.status() == psutil.STATUS_ZOMBIE, 10, "a zombie")
    with pytest.raises(TargetZombie, match="has exited"):
        target.check_alive()


def _spawn_with_pid(pid: int) -> subprocess.Popen[bytes]:
    """Start ``sleep`` with a chosen PID by setting the kernel's last PID (root only)."""
    for _ in range(50):
        try:
            with open("/proc/sys/kernel/ns_last_pid", "w") as last_pid:
                last_pid.write(str(pid - 1))
        except OSError as err:
            pytest.skip(f"cannot choose PIDs here ({err.strerror}): needs root and /proc/sys")
        child = subprocess.Popen(["sleep", "300"])
        if child.pid == pid:
            return child
        child.kill()
        child.wait()
    pytest.fail(f"could not get PID {pid} back after 50 tries")


def test_pid_reuse_is_detected(sleeper: subprocess.Popen[bytes]) -> None:
    target = Target.attach(sleeper.pid)
    sleeper.kill()
    sleeper.wait()
    time.sleep(0.05)  # start times have 10 ms resolution: make the impostor's differ
    impostor = _spawn_with_pid(target.pid)
    try:
        with pytest.raises(TargetGone, match="PID now belongs to another process"):
            target.check_alive()
    finally:
        impostor.kill()
        impostor.wait()


def test_another_users_process_without_privileges_is_access_denied(
    nobodys_sleeper: subprocess.Popen[bytes],
) -> None:
    code = (
        "import sys\n"
        "from driftwatch.errors import TargetAccessDenied\n"
        "from driftwatch.target.process import Target\n"
        "try:\n"
        f"    Target.attach({nobodys_sleeper.pid})\n"
        "except TargetAccessDenied as err:\n"
        "    print(err); sys.exit(3)\n"
    )
    probe = subprocess.run(
        [*WITHOUT_PTRACE, sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert probe.returncode == 3, probe.stderr
    assert "permission denied" in probe.stdout
    assert CAPABILITY_HINT in probe.stdout  # root already: the capability is what is missing


ROOT_WITH_EVERYTHING = Privileges(
    root=True, ptrace_capable=True, same_user_namespace=True, ptrace_scope=1
)


@pytest.mark.parametrize(
    ("facts", "attaching", "hint"),
    [
        (replace(ROOT_WITH_EVERYTHING, root=False, ptrace_capable=False), False, ACCESS_HINT),
        (replace(ROOT_WITH_EVERYTHING, ptrace_capable=False), False, CAPABILITY_HINT),
        (replace(ROOT_WITH_EVERYTHING, same_user_namespace=False), False, USER_NAMESPACE_HINT),
        (replace(ROOT_WITH_EVERYTHING, ptrace_scope=3), True, NO_ATTACH_HINT),
        (replace(ROOT_WITH_EVERYTHING, ptrace_scope=3), False, SECURITY_MODULE_HINT),
        (ROOT_WITH_EVERYTHING, True, SECURITY_MODULE_HINT),
    ],
)
def test_a_refusal_says_which_privilege_is_missing(
    facts: Privileges, attaching: bool, hint: str
) -> None:
    # Expected: an ordinary user is told to become the target's user or root; root is told
    # the one privilege it lacks, in the order the kernel checks them; Yama's scope matters
    # only to attaching (stack dumps), not to reading /proc.
    assert access_hint(facts, attaching) == hint
    assert ("sudo" in hint) == (not facts.root)


def test_this_process_reads_its_own_privileges() -> None:
    facts = privileges(os.getpid())
    assert facts.root == (os.geteuid() == 0)
    assert facts.same_user_namespace
    if not facts.root:
        assert access_hint(facts) == ACCESS_HINT


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["python", "train.py", "--password=hunter2"], ["python", "train.py", "--password=***"]),
        (
            ["python", "train.py", "--api-key", "abc", "--lr", "0.1"],
            ["python", "train.py", "--api-key", "***", "--lr", "0.1"],
        ),
        (["run", "--WANDB_TOKEN=x", "--tokens=5"], ["run", "--WANDB_TOKEN=***", "--tokens=***"]),
        (["python", "train.py", "--epochs", "3"], ["python", "train.py", "--epochs", "3"]),
        (["t", "--token", "abc", "--password"], ["t", "--token", "***", "--password"]),
        (
            ["t", "-p", "--db-passwd", "x", "--passphrase=y"],
            ["t", "-p", "--db-passwd", "***", "--passphrase=***"],
        ),
        (
            ["t", "--aws-access-key-id=AK", "--private_key", "k"],
            ["t", "--aws-access-key-id=***", "--private_key", "***"],
        ),
        (
            ["t", "--credentials=a.json", "--authorization", "Bearer x"],
            ["t", "--credentials=***", "--authorization", "***"],
        ),
        (
            [
                "env",
                "AWS_SECRET_ACCESS_KEY=s",
                "HF_TOKEN=t",
                "db_password=p",
                "OMP_NUM_THREADS=4",
                "python",
            ],
            [
                "env",
                "AWS_SECRET_ACCESS_KEY=***",
                "HF_TOKEN=***",
                "db_password=***",
                "OMP_NUM_THREADS=4",
                "python",
            ],
        ),
        (
            ["t", "--db=postgres://alice:hunter2@db:5432/x", "https://ghp_abc@github.com/o/r"],
            ["t", "--db=postgres://***@db:5432/x", "https://***@github.com/o/r"],
        ),
        (
            ["t", "--url", "https://h/upload?run=1&api_key=k&x=2", "https://h/a@b"],
            ["t", "--url", "https://h/upload?run=1&api_key=***&x=2", "https://h/a@b"],
        ),
        (
            ["t", "--data", "/mnt/tokens", "key=value", "a@b.c"],
            ["t", "--data", "/mnt/tokens", "key=value", "a@b.c"],
        ),
    ],
)
def test_redact_command_hides_secret_flag_values(argv: list[str], expected: list[str]) -> None:
    assert redact_command(argv) == expected


@pytest.mark.parametrize(
    ("argv", "name"),
    [
        (["/usr/bin/python3", "-u", "/jobs/train_resnet.py", "--lr", "1"], "train_resnet"),
        (["python", "-m", "trainer.task"], "task"),
        (["/opt/bin/trainer"], "trainer-bin"),
    ],
)
def test_default_run_name(argv: list[str], name: str) -> None:
    assert default_run_name(argv, "trainer-bin") == name


def test_open_paths_are_the_files_a_process_has_open(tmp_path: Path) -> None:
    kept, unlinked = tmp_path / "events.out.tfevents.1", tmp_path / "unlinked"
    code = (
        "import os, socket, sys, time\n"
        "kept, unlinked = open(sys.argv[1], 'w'), open(sys.argv[2], 'w')\n"
        "os.unlink(sys.argv[2])\n"
        "sock, pipe = socket.socket(), os.pipe()\n"
        "print('ready', flush=True)\n"
        "time.sleep(300)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(kept), str(unlinked)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"
        target = Target.attach(child.pid)
        paths = target.open_paths()
        assert os.path.realpath(kept) in paths
        assert all(p.startswith("/") and "unlinked" not in p for p in paths), paths
    finally:
        child.kill()
        child.wait()
    with pytest.raises(TargetGone):
        target.open_paths()


def test_one_read_of_stat_tells_cpu_threads_and_memory_as_psutil_does(
    sleeper: subprocess.Popen[bytes],
) -> None:
    target = Target.attach(sleeper.pid)
    process = psutil.Process(sleeper.pid)
    # Once asleep, nothing it reports moves (it may still be loading at first).
    wait_for(lambda: target.read_stat().rss_bytes == process.memory_info().rss, 10, "same RSS")
    stat = target.read_stat()
    cpu = process.cpu_times()
    assert stat.cpu_seconds == pytest.approx(cpu.user + cpu.system)
    assert stat.threads == process.num_threads() == 1
    assert stat.rss_bytes == process.memory_info().rss > 0


def test_open_paths_find_new_descriptors_at_once_and_reused_numbers_at_the_full_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A descriptor number not seen before has its link read at once; one closed and reused
    for another file between two calls is read again at the next full read of the links
    (every ``LINKS_REREAD_SECONDS``, set to 0 here)."""
    first, second, third = (tmp_path / f"events.out.tfevents.{i}" for i in range(3))
    code = (
        "import sys\n"
        "one = open(sys.argv[1], 'w')\n"
        "print(one.fileno(), flush=True)\n"
        "sys.stdin.readline()\n"
        "two = open(sys.argv[2], 'w')\n"
        "print(two.fileno(), flush=True)\n"
        "sys.stdin.readline()\n"
        "one.close()\n"
        "three = open(sys.argv[3], 'w')\n"
        "print(three.fileno(), flush=True)\n"
        "sys.stdin.readline()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(first), str(second), str(third)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None
    assert child.stdout is not None
    try:
        reused = child.stdout.readline()
        target = Target.attach(child.pid)
        assert os.path.realpath(first) in target.open_paths()
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline() != reused
        assert os.path.realpath(second) in target.open_paths()  # a new number: read at once
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline() == reused  # the first file's number, now the third's
        # As many descriptors as before: not listed again until the full read.
        assert os.path.realpath(first) in target.open_paths()
        monkeypatch.setattr("driftwatch.target.process.LINKS_REREAD_SECONDS", 0.0)
        paths = target.open_paths()
        assert os.path.realpath(third) in paths
        assert os.path.realpath(first) not in paths
    finally:
        child.kill()
        child.wait()
