"""Why a process may not be watched, said so that the reader knows what to change.

Reading another user's ``/proc/PID/{environ,io,fd}`` takes ptrace read access; dumping its
stacks takes ptrace attach access. An ordinary user gets both by running as the target's
user or as root. Root itself can lack them: without the ``SYS_PTRACE`` capability (a
container's default), for a process in another user namespace (a rootless container), under
Yama's ``ptrace_scope`` 3 (no attaching at all), or when a security module refuses. A PID
that this process cannot see at all may belong to another PID namespace.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from driftwatch.errors import ACCESS_HINT, TargetAccessDenied

CAP_SYS_PTRACE = 19
"""The bit of ``CAP_SYS_PTRACE`` in the capability masks of ``/proc/PID/status``."""
PF_KTHREAD = 0x00200000
"""The flag of ``/proc/PID/stat``'s ninth field that marks a kernel thread."""
INITIAL_PID_NAMESPACE = 0xEFFFFFFC
"""The inode number of the kernel's initial PID namespace (``PROC_PID_INIT_INO``)."""
NO_ATTACH_SCOPE = 3
"""Yama's ``ptrace_scope`` under which no process, root included, may attach to another."""

CAPABILITY_HINT = (
    "driftwatch runs as root but without the SYS_PTRACE capability, which reading another "
    "user's process takes: add it (docker run --cap-add SYS_PTRACE; Kubernetes: "
    "securityContext.capabilities.add: [SYS_PTRACE])"
)
USER_NAMESPACE_HINT = (
    "the process is in another user namespace (a rootless container?), where this root has "
    "no privileges: run driftwatch inside that container, or as the user that started it"
)
NO_ATTACH_HINT = (
    "kernel.yama.ptrace_scope is 3, which forbids attaching to any process, as root too "
    "(it can be lowered only by a reboot)"
)
SECURITY_MODULE_HINT = (
    "driftwatch runs as root with SYS_PTRACE, so a security module (AppArmor, SELinux) or a "
    "seccomp profile refused it: its denial is in the kernel log (dmesg) or the audit log"
)
PID_NAMESPACE_HINT = (
    "driftwatch runs in a PID namespace of its own (a container?) and sees only the "
    "processes in it: share the host's (docker run --pid=host; Kubernetes: hostPID: true)"
)


@dataclass(frozen=True)
class Privileges:
    """What this process may do to another: the facts that decide which hint applies."""

    root: bool
    ptrace_capable: bool  # CAP_SYS_PTRACE in the effective set
    same_user_namespace: bool  # False only when the target's is known to differ
    ptrace_scope: int  # Yama's; 0 without Yama


def _status_field(pid: int | str, name: str) -> str:
    """The value of ``name`` in ``/proc/PID/status``, or an empty string."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                key, _, value = line.partition(":")
                if key == name:
                    return value.strip()
    except OSError:
        pass
    return ""


def _ptrace_scope() -> int:
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope", encoding="ascii") as scope:
            return int(scope.read())
    except (OSError, ValueError):
        return 0


def _same_user_namespace(pid: int) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/ns/user") == os.readlink("/proc/self/ns/user")
    except OSError:
        return True  # not readable: nothing known to differ


def privileges(pid: int) -> Privileges:
    """This process's privileges over process ``pid``, read from ``/proc``."""
    effective = int(_status_field("self", "CapEff") or "0", 16)
    return Privileges(
        root=os.geteuid() == 0,
        ptrace_capable=bool(effective >> CAP_SYS_PTRACE & 1),
        same_user_namespace=_same_user_namespace(pid),
        ptrace_scope=_ptrace_scope(),
    )


def access_hint(facts: Privileges, attaching: bool = False) -> str:
    """What to change so that access is granted: for an ordinary user, become the target's
    user or root; for root, the privilege it lacks. ``attaching``: the access wanted is
    ptrace attach (stack dumps), which Yama's scope also restricts."""
    if not facts.root:
        return ACCESS_HINT
    if not facts.ptrace_capable:
        return CAPABILITY_HINT
    if not facts.same_user_namespace:
        return USER_NAMESPACE_HINT
    if attaching and facts.ptrace_scope >= NO_ATTACH_SCOPE:
        return NO_ATTACH_HINT
    return SECURITY_MODULE_HINT


def denied(pid: int, what: str, attaching: bool = False) -> TargetAccessDenied:
    """The error for reading ``what`` of process ``pid`` refused, with what to change."""
    return TargetAccessDenied(pid, what, access_hint(privileges(pid), attaching))


def in_own_pid_namespace() -> bool:
    """Whether this process runs in a PID namespace below the host's: the host's is the
    kernel's first, always numbered ``INITIAL_PID_NAMESPACE``."""
    try:
        return os.readlink("/proc/self/ns/pid") != f"pid:[{INITIAL_PID_NAMESPACE}]"
    except OSError:
        return False


def no_such_process(pid: int) -> str:
    """What to say of a PID that names no process this process can see."""
    if in_own_pid_namespace():
        return f"no process with PID {pid} here; {PID_NAMESPACE_HINT}"
    return f"no process with PID {pid}"


def is_kernel_thread(stat: bytes) -> bool:
    """Whether ``/proc/PID/stat``'s content ``stat`` is a kernel thread's."""
    fields = stat[stat.rindex(b")") + 2 :].split(maxsplit=7)
    return bool(int(fields[6]) & PF_KTHREAD)
