"""Naming processes across PID namespaces, against real processes in a real new namespace."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from driftwatch.sources import default_sources
from driftwatch.sources.hook import HookSource
from driftwatch.target.pidns import ProcessId, find_process, identify
from driftwatch.target.process import Target
from tests.conftest import (
    CONTAINED_HOOK,
    in_pid_namespace,
    needs_pid_namespaces,
    unused_pid,
    wait_for,
)

IDENTIFY_ITSELF = """
import json, os, sys
from driftwatch.target.pidns import identify
print(json.dumps(identify(os.getpid())), flush=True)
sys.stdin.readline()
"""


def test_this_process_is_named_and_found_under_its_own_pid() -> None:
    me = identify(os.getpid())
    with open("/proc/self/stat") as file:
        ticks = int(file.read().rsplit(")", 1)[1].split()[19])
    namespace = os.readlink("/proc/self/ns/pid")
    assert me == ProcessId(os.getpid(), ticks, int(namespace.removeprefix("pid:[")[:-1]))
    assert find_process(me) == os.getpid()


def test_a_reused_pid_or_an_exited_process_is_not_found() -> None:
    me = identify(os.getpid())
    assert find_process(me._replace(start_ticks=me.start_ticks - 1)) is None
    assert find_process(me._replace(pid=unused_pid())) is None
    assert find_process(me._replace(namespace=1)) is None


@needs_pid_namespaces
def test_a_process_in_another_pid_namespace_is_found_under_the_pid_seen_here() -> None:
    with in_pid_namespace(IDENTIFY_ITSELF) as (contained, pid):
        assert contained.stdout is not None
        itself = ProcessId(*json.loads(contained.stdout.readline()))
        assert itself.pid == 1  # as a container's first process
        assert itself.namespace != identify(os.getpid()).namespace
        assert identify(pid) == itself  # the same name, read from outside
        assert find_process(itself) == pid
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: find_process(itself) is None, 10, "the process to be gone")


@needs_pid_namespaces
def test_attach_finds_the_channel_of_a_job_in_its_own_pid_and_mount_namespaces(
    tmp_path: Path,
) -> None:
    """As ``driftwatch attach`` from the node: the job's channel lies on a mount only it sees,
    named by its PID in its namespace."""
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    env = {"DRIFTWATCH_RUNTIME_DIR": str(runtime)}
    with in_pid_namespace(CONTAINED_HOOK, str(runtime), "tmpfs", env=env) as (contained, pid):
        assert contained.stdout is not None
        assert contained.stdout.readline() == "hooked\n"
        assert not list(runtime.iterdir())  # not here: on the job's own tmpfs
        target = Target.attach(pid)
        assert (target.own_pid, target.root) == (1, f"/proc/{pid}/root")
        sources = default_sources(target, [])
        hook = next(s for s in sources if isinstance(s, HookSource))
        series = {sample.series for sample in hook.sample(0.0)}
        assert hook.connected
        for source in sources:
            source.close()
    assert {"step_seconds", "runtime_info"} <= series
