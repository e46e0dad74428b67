"""Sources turn the outside world into ``Sample``s for one target.

A source raises ``TargetGone`` when the target is gone (monitoring ends) and
``SourceUnavailable`` when it cannot work here (that source is switched off, once, with its
reason; the others carry on). Every other foreign exception is translated inside the source.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from driftwatch.channel.paths import process_channel
from driftwatch.series import Sample
from driftwatch.sources.disk import DiskSource
from driftwatch.sources.eventfiles import EventFileSource
from driftwatch.sources.hook import HookSource
from driftwatch.sources.host import HostSource, NodePressure
from driftwatch.sources.job import JobSource
from driftwatch.sources.nvml import NvmlSource
from driftwatch.sources.process import ProcessSource
from driftwatch.target.process import Target


class Source(Protocol):
    name: str

    def sample(self, now: float) -> list[Sample]:
        """Read the current values; ``now`` is the wall-clock time stamped on them."""
        ...

    def close(self) -> None:
        """Release files and handles; called once when monitoring ends."""
        ...


@runtime_checkable
class Draining(Protocol):
    """A source that holds data the target wrote before it exited, read by ``drain``;
    other sources are read once more with ``sample``."""

    def drain(self, now: float) -> list[Sample]:
        """Everything left to read, now that the target has exited: no time budget."""
        ...


def default_sources(
    target: Target,
    logdirs: Sequence[Path],
    channel: Path | None = None,
    pressure: NodePressure | None = None,
) -> list[Source]:
    """Every source for one target; the hook's steps, when it has one, beat event files'.
    ``pressure``: the node's pressure files as shared among a daemon's targets.

    The hook's channel is the file ``channel``, by default the one the target's hook creates
    where its own environment says, named as the target sees itself (in a container: under
    its own root, by its PID there).
    """
    if channel is None:
        channel = process_channel(
            target.own_pid, target.info.create_time, target.environ(), target.info.uid, target.root
        )
    hook = HookSource(channel, target.info.uid)
    return [
        ProcessSource(target),  # first: it notices a reused PID before the others read
        JobSource(target),
        hook,
        EventFileSource(logdirs, target.open_paths, track_steps=lambda: not hook.connected),
        DiskSource(target, list(logdirs)),
        NvmlSource(target.pid),
        HostSource(target.pid, pressure=pressure),
    ]
