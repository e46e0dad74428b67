"""Where captures live, what they are called, and the caps on their size.

The one derivation of their paths: ``<history>.captures/<host>-<pid>-<stamp>/`` beside the
history database ``<history>.db``, one directory per run (a run is ``(host, pid,
create_time)``, as in the history), holding

- ``stack-<label>-<time>.txt``: a py-spy dump of every Python thread;
- ``profile/plugins/profile/<label>-<time>/*.xplane.pb``: a TensorFlow Profiler trace, in
  the layout TensorBoard's profile plugin reads (``tensorboard --logdir <run dir>/profile``).

``label`` is the kind of the finding that caused it, or ``reference``; ``time`` is UTC,
``20261124T081957.123Z``. The writer (``driftwatch.capture.capturer``) and the report
(``driftwatch.report``) both find them here.
"""

from __future__ import annotations

import calendar
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from driftwatch.channel.paths import stamp

log = logging.getLogger(__name__)

RUN_CAP_BYTES = 256 * 2**20
"""Bytes of captures one run keeps at most (256 MiB); its oldest go first, the reference last."""
TOTAL_CAP_BYTES = 2 * 2**30
"""Bytes of captures one history keeps across runs (2 GiB); the least recent runs go first."""
REFERENCE = "reference"
"""The label of the capture taken early in a run, to compare with."""
STACK_PREFIX = "stack-"
PROFILE_DIR = "profile"
"""The TensorBoard logdir of a run's traces, inside its capture directory."""

_NAME = re.compile(r"^(?P<label>[a-z_]+)-(?P<time>\d{8}T\d{6})\.(?P<ms>\d{3})Z(?:\.txt)?$")


@dataclass(frozen=True, slots=True)
class Capture:
    """One capture on disk: ``what`` is ``stack`` or ``trace``."""

    what: str
    label: str
    t: float  # unix seconds, when it was taken
    path: Path  # the dump's file, or the trace's directory
    bytes: int

    def to_dict(self) -> dict[str, object]:
        return {
            "what": self.what,
            "label": self.label,
            "t": self.t,
            "path": str(self.path),
            "bytes": self.bytes,
        }


def captures_root(db: Path) -> Path:
    """The directory of every run's captures, beside the history ``db``."""
    return db.with_name(f"{db.stem}.captures")


def run_dir(db: Path, host: str, pid: int, create_time: float) -> Path:
    """The capture directory of the run ``(host, pid, create_time)`` of the history ``db``."""
    return captures_root(db) / f"{host}-{pid}-{stamp(create_time)}"


def trace_logdir(directory: Path) -> Path:
    """The TensorBoard logdir of the traces in the run capture directory ``directory``."""
    return directory / PROFILE_DIR


def capture_name(label: str, t: float) -> str:
    """``<label>-<UTC time to the millisecond>Z``."""
    ms = int(t * 1000) % 1000
    return f"{label}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime(t))}.{ms:03d}Z"


def stack_path(directory: Path, label: str, t: float) -> Path:
    return directory / f"{STACK_PREFIX}{capture_name(label, t)}.txt"


def trace_path(directory: Path, label: str, t: float) -> Path:
    return trace_logdir(directory) / "plugins" / "profile" / capture_name(label, t)


def _parse(name: str) -> tuple[str, float] | None:
    found = _NAME.match(name)
    if found is None:
        return None
    seconds = calendar.timegm(time.strptime(found["time"], "%Y%m%dT%H%M%S"))
    return found["label"], seconds + int(found["ms"]) / 1000


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def list_captures(directory: Path) -> list[Capture]:
    """The captures in the run capture directory ``directory``, oldest first."""
    found: list[Capture] = []
    try:
        for entry in directory.iterdir():
            if entry.name.startswith(STACK_PREFIX) and entry.is_file():
                parsed = _parse(entry.name.removeprefix(STACK_PREFIX))
                if parsed is not None:
                    found.append(Capture("stack", *parsed, entry, _size(entry)))
        traces = directory / PROFILE_DIR / "plugins" / "profile"
        if traces.is_dir():
            for entry in traces.iterdir():
                parsed = _parse(entry.name)
                if parsed is not None and entry.is_dir():
                    found.append(Capture("trace", *parsed, entry, _size(entry)))
    except OSError as err:
        log.debug("cannot list the captures in %s: %s", directory, err)
    return sorted(found, key=lambda c: c.t)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def enforce_caps(
    directory: Path, run_cap: int = RUN_CAP_BYTES, total_cap: int = TOTAL_CAP_BYTES
) -> list[Path]:
    """Drop captures until the run ``directory`` holds at most ``run_cap`` bytes (its oldest
    first, the reference last) and its root at most ``total_cap`` (other runs' directories,
    least recently changed first); what was dropped."""
    dropped: list[Path] = []
    captures = list_captures(directory)
    held = sum(c.bytes for c in captures)
    # Oldest first, the reference after every other capture.
    for capture in sorted(captures, key=lambda c: (c.label == REFERENCE, c.t)):
        if held <= run_cap:
            break
        _remove(capture.path)
        dropped.append(capture.path)
        held -= capture.bytes
    try:
        others = [d for d in directory.parent.iterdir() if d.is_dir() and d != directory]
    except OSError:
        others = []
    sizes = {d: _size(d) for d in others}
    total = held + sum(sizes.values())
    for other in sorted(others, key=lambda d: d.stat().st_mtime):
        if total <= total_cap:
            break
        _remove(other)
        dropped.append(other)
        total -= sizes[other]
    for path in dropped:
        log.info("driftwatch: capture %s dropped (size caps, see docs/capture.md)", path)
    return dropped


def make_run_dir(directory: Path) -> Path:
    """Create the run capture directory (private: stacks show code and arguments)."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(directory.parent, 0o700)
    return directory
