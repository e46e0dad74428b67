"""Capture requests: the one message that goes from the monitor to the hook.

The channel itself runs hook to monitor only. To ask the hook for a TensorFlow Profiler
trace, a monitor replaces the small JSON file ``request_path(channel)`` beside the channel
(atomically, as a whole): ``{"id": 3, "steps": 5, "label": "abrupt_slowdown"}``. The hook
looks at it only when it probes (every ``probe_every_steps`` steps or
``probe_every_seconds`` seconds: one ``stat`` then, never anything per step), handles each
id once, writes the trace into ``traces_dir(channel)/<id>/`` and answers with ``CAPTURE``
records in the channel (``driftwatch.channel.wire``).

Stdlib only: both the training process and the monitor import it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from driftwatch.channel.paths import ChannelError, request_path, write_atomically

MAX_REQUEST_BYTES = 4096
"""A larger request file is ignored: the hook never reads an unbounded file."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """Trace ``steps`` steps; ``label`` names the capture (a finding's kind, or reference)."""

    id: int
    steps: int
    label: str


def write_request(channel: Path, request: TraceRequest) -> None:
    """Replace the request beside ``channel``; ``ChannelError`` if it cannot be written.

    Readable by all (mode 0644) in the channel's private directory: a monitor running as
    root writes it for a job of another user.
    """
    target = request_path(channel)
    text = json.dumps({"id": request.id, "steps": request.steps, "label": request.label})
    try:
        write_atomically(target, text, mode=0o644)
    except OSError as err:
        raise ChannelError(f"cannot write the capture request {target}: {err}") from err


class RequestWatch:
    """The hook's end: ``poll()`` is the newest request not seen before, or None.

    One ``stat`` per call; the file is read only when it changed.
    """

    def __init__(self, channel: Path) -> None:
        self.path = request_path(channel)
        self._seen: tuple[int, int] | None = None  # (mtime_ns, inode) of the last file read
        self._last_id = 0

    def poll(self) -> TraceRequest | None:
        try:
            info = os.stat(self.path)
        except OSError:
            return None
        if (info.st_mtime_ns, info.st_ino) == self._seen:
            return None
        self._seen = (info.st_mtime_ns, info.st_ino)
        request = read_request(self.path)
        if request is None or request.id <= self._last_id:
            return None
        self._last_id = request.id
        return request


def read_request(path: Path) -> TraceRequest | None:
    """The request in ``path``; None if it is missing or malformed."""
    try:
        with open(path, "rb") as file:
            text = file.read(MAX_REQUEST_BYTES + 1)
        fields = json.loads(text) if len(text) <= MAX_REQUEST_BYTES else None
    except (OSError, ValueError):
        return None
    if not isinstance(fields, dict):
        return None
    id_, steps, label = fields.get("id"), fields.get("steps"), fields.get("label", "")
    if not isinstance(id_, int) or not isinstance(steps, int) or not isinstance(label, str):
        return None
    if id_ < 1 or steps < 1:
        return None
    return TraceRequest(id_, steps, label)
