from __future__ import annotations

import subprocess
import sys
import uuid

import psutil
import pytest

from driftwatch.channel.paths import stamp
from driftwatch.daemon import discovery
from driftwatch.daemon.discovery import REREAD_COMMANDS_EVERY_SCANS, ProcessTable
from tests.conftest import wait_for

WAIT_FOR_A_LINE = "import os, sys; sys.stdin.readline(); os.execvp(sys.argv[1], sys.argv[1:])"
"""Runs the command in its arguments (``exec``, same PID) once a line comes on stdin."""


def listed(table: ProcessTable, pid: int) -> tuple[int, int, str] | None:
    """The process ``pid`` as one scan of ``table`` lists it: PID, start stamp, command."""
    for found, create_time, command in table():
        if found == pid:
            return found, stamp(create_time), command
    return None


def as_psutil_lists(pid: int) -> tuple[int, int, str]:
    process = psutil.Process(pid)
    return pid, stamp(process.create_time()), " ".join(process.cmdline())


def test_the_process_table_lists_processes_as_psutil_does(
    sleeper: subprocess.Popen[bytes],
) -> None:
    table = ProcessTable()
    for _ in range(2):  # the command lines read, then remembered
        assert listed(table, sleeper.pid) == as_psutil_lists(sleeper.pid)
        assert listed(table, psutil.Process().pid) == as_psutil_lists(psutil.Process().pid)


def exec_later(command: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WAIT_FOR_A_LINE, *command], stdin=subprocess.PIPE, text=True
    )


def test_a_process_that_execs_another_program_is_listed_with_its_new_command_at_once() -> None:
    tag = f"300.{uuid.uuid4().int % 10**6:06d}"
    child = exec_later(["sleep", tag])
    try:
        table = ProcessTable()
        wait_for(lambda: listed(table, child.pid) is not None, 10, "the child listed")
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        # The exec done: its new name is set a moment before its new arguments.
        wait_for(lambda: psutil.Process(child.pid).cmdline() == ["sleep", tag], 10, "the exec")
        assert listed(table, child.pid) == (*as_psutil_lists(child.pid)[:2], f"sleep {tag}")
    finally:
        child.kill()
        child.wait()


def test_a_process_caught_without_arguments_in_its_exec_is_listed_at_the_next_scan(
    sleeper: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Expected: a scan that reads an empty command line (an exec between its new name and its
    # new arguments) lists nothing for it, and the next scan reads it again: it is listed
    # then, not only once every command line is re-read.
    real = discovery._command_line
    in_exec = [True]

    def command_line(pid: int) -> str:
        return "" if pid == sleeper.pid and in_exec[0] else real(pid)

    monkeypatch.setattr(discovery, "_command_line", command_line)
    table = ProcessTable()
    assert listed(table, sleeper.pid) is None
    in_exec[0] = False
    assert listed(table, sleeper.pid) == as_psutil_lists(sleeper.pid)


def test_a_program_that_execs_one_of_the_same_name_is_listed_anew_within_the_reread() -> None:
    tag = f"{uuid.uuid4().int % 10**6:06d}"
    then = [sys.executable, "-c", "import time; time.sleep(300)", tag]
    child = exec_later(then)
    try:
        table = ProcessTable()
        wait_for(lambda: listed(table, child.pid) is not None, 10, "the child listed")
        before = psutil.Process(child.pid).name()
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        wait_for(lambda: psutil.Process(child.pid).cmdline() == then, 10, "the exec")
        assert psutil.Process(child.pid).name() == before  # nothing tells the exec but this
        commands = [listed(table, child.pid) for _ in range(REREAD_COMMANDS_EVERY_SCANS)]
        assert commands[-1] == as_psutil_lists(child.pid)
        assert commands[0] != commands[-1]  # remembered until the full re-read
    finally:
        child.kill()
        child.wait()
