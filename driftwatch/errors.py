"""driftwatch's exception hierarchy.

Every foreign exception (psutil, NVML, tensorboard, sockets) is translated at the boundary
where it happens into one of these, raised ``from`` the original so the cause is kept.
The CLI turns any ``DriftwatchError`` into one line on stderr and a non-zero exit.
"""

from __future__ import annotations


class DriftwatchError(Exception):
    """Base of every error driftwatch raises on purpose."""


class UsageError(DriftwatchError):
    """A flag or configuration value is malformed (bad interval, bad address, ...)."""


class ListenError(DriftwatchError):
    """The metrics listener could not be started (port in use, address not local, ...)."""


class TargetError(DriftwatchError):
    """Something about the watched process; ``pid`` names it."""

    def __init__(self, pid: int, message: str) -> None:
        super().__init__(message)
        self.pid = pid


class TargetGone(TargetError):
    """The process does not exist (any more), or its PID now belongs to another process."""


class TargetZombie(TargetGone):
    """The process has exited but its parent has not reaped it yet."""


ACCESS_HINT = (
    "run driftwatch as the same user as the target, or with sudo; "
    "in a container add the SYS_PTRACE capability (Kubernetes: also hostPID: true)"
)


class TargetNotWatchable(TargetError):
    """The process is not one a training job can be: a kernel thread, say."""


class TargetAccessDenied(TargetError):
    """The operating system refused to let driftwatch read the process; ``hint`` says what to
    change (by default, for an ordinary user)."""

    def __init__(self, pid: int, what: str, hint: str = ACCESS_HINT) -> None:
        super().__init__(pid, f"permission denied reading {what} of process {pid}: {hint}")


class SourceUnavailable(DriftwatchError):
    """A data source cannot work on this machine or for this target; the rest keeps going."""


class HistoryError(DriftwatchError):
    """The history database cannot be opened or read (corrupt, unreadable, not found)."""


class CaptureUnavailable(DriftwatchError):
    """Evidence could not be captured (py-spy missing or failing, a trace refused); the
    monitoring goes on without it."""
