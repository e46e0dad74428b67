"""The capturer: on a slowdown, stall or leak finding, a stack dump and a profiler trace.

It runs beside one monitor: ``annotate`` is called with each tick's findings before they
are announced, recorded or published, and names in their evidence the captures that exist
(``capture_stack``, ``capture_trace``, ``capture_logdir``), once they do, or why one could
not be made (``capture_stack_error``, ``capture_trace_error``); as a sink, ``close`` waits
for what is under way. A stack dump runs on a thread of its own (py-spy takes a fraction of a
second, and a tick must not wait); a trace is asked of the hook (``driftwatch.channel.requests``)
and copied here once the hook says it is done. One reference trace is asked for early in a
hooked run, after warm-up. Limits and their reasons: docs/capture.md.
"""

from __future__ import annotations

import logging
import shutil
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import psutil

from driftwatch.capture.descriptors import describe_descriptors
from driftwatch.capture.stack import dump_stacks
from driftwatch.capture.store import (
    REFERENCE,
    enforce_caps,
    make_run_dir,
    run_dir,
    stack_path,
    trace_logdir,
    trace_path,
)
from driftwatch.channel.paths import ChannelError, traces_dir
from driftwatch.channel.requests import TraceRequest, write_request
from driftwatch.channel.wire import CaptureStatus
from driftwatch.errors import CaptureUnavailable, DriftwatchError
from driftwatch.findings import CAPTURE_ERROR, CAPTURE_EVIDENCE, Finding, Severity
from driftwatch.runtime.snapshot import Snapshot
from driftwatch.runtime.store import Store
from driftwatch.sources.hook import CaptureAnswer, HookSource
from driftwatch.target.process import TargetInfo

log = logging.getLogger(__name__)

CAPTURE_KINDS = frozenset(
    {
        "abrupt_slowdown",
        "gradual_slowdown",
        "periodic_stall",
        "stalled",
        "host_memory_drift",
        "tf_memory_drift",
        "gpu_memory_drift",
        "thread_exhaustion",
        "fd_exhaustion",
    }
)
"""Kinds of finding that capture evidence (slowdowns, stalls, leaks; a thread leak's stack
dump shows each leaked thread's target and what it waits in; a descriptor leak's dump begins
with what the descriptors point to), at warning or worse."""
DESCRIPTOR_KINDS = frozenset({"fd_exhaustion"})
"""Kinds whose dump begins with the job's open descriptors, grouped (``describe_descriptors``)."""
MIN_GAP_SECONDS = 60.0
"""Seconds between two captures of one run, at least (the reference aside)."""
KIND_AGAIN_SECONDS = 6 * 3600.0
"""A kind that keeps holding is captured again after this many seconds."""
MAX_CAPTURES_PER_RUN = 20
"""Captures (a stack dump and a trace count as one) one run takes at most."""
TRACE_STEPS = 5
"""Steps a profiler trace covers."""
REFERENCE_AFTER_STEPS = 200
"""The reference trace is asked for once the hook has counted this many steps..."""
REFERENCE_AFTER_SECONDS = 10.0
"""...and this many seconds have passed since the hook's channel was first read."""
ANSWER_TIMEOUT_SECONDS = 600.0
"""A trace request the hook has not answered after this long is given up."""
STACK_KEY, TRACE_KEY, LOGDIR_KEY, REFERENCE_KEY = (
    "capture_stack",
    "capture_trace",
    "capture_logdir",
    "capture_reference",
)
"""The evidence fields that name a finding's captures, once they exist."""
STACK_ERROR_KEY, TRACE_ERROR_KEY = (
    f"{CAPTURE_EVIDENCE}stack{CAPTURE_ERROR}",
    f"{CAPTURE_EVIDENCE}trace{CAPTURE_ERROR}",
)
"""The evidence fields that say why a finding's capture could not be made."""


@dataclass
class _Pending:
    """A trace asked of the hook: for which label, where it goes, when it was asked."""

    label: str
    destination: Path
    asked: float


class Capturer:
    """Captures evidence for one run into ``directory`` (``driftwatch.capture.store``).

    ``pid``: the target as this machine sees it (py-spy's); ``hook``: its hook source, if
    any (traces need the hook).
    """

    def __init__(
        self,
        directory: Path,
        pid: int,
        hook: HookSource | None,
        dump: Callable[[int], str] = dump_stacks,
    ) -> None:
        self.directory = directory
        self._pid = pid
        self._hook = hook
        self._dump = dump
        self._evidence: dict[str, dict[str, str]] = {}  # kind: its capture fields, as they land
        self._captured: dict[str, float] = {}  # kind: when it was last captured
        self._last = -float("inf")
        self._count = 0
        self._pending: dict[int, _Pending] = {}
        self._last_id = 0
        self._hook_seen: float | None = None
        self._reference_asked = False
        self._reference = ""  # the reference trace's path, once it exists
        self._threads: list[threading.Thread] = []
        self._said: set[str] = set()  # messages already logged (each once)
        self._lock = threading.Lock()  # guards _evidence against the stack threads
        self._dumping = threading.Lock()

    # -- called by the monitor, before findings are announced --------------------------

    def annotate(self, now: float, findings: list[Finding], store: Store) -> list[Finding]:
        """Start the captures ``findings`` call for; the findings with their capture fields."""
        self._collect(now)
        self._maybe_reference(now, store)
        for finding in findings:
            if self._due(finding, now) and self._alive():
                self._capture(finding.kind, now)
        if not self._evidence:
            return findings
        return [self._annotated(finding) for finding in findings]

    def _due(self, finding: Finding, now: float) -> bool:
        if finding.kind not in CAPTURE_KINDS or finding.severity.rank < Severity.WARNING.rank:
            return False
        if now - self._captured.get(finding.kind, -float("inf")) < KIND_AGAIN_SECONDS:
            return False
        return now - self._last >= MIN_GAP_SECONDS and self._count < MAX_CAPTURES_PER_RUN

    def _alive(self) -> bool:
        """Whether the target still runs: a run judged at its end has nothing to capture."""
        try:
            return psutil.Process(self._pid).status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def _annotated(self, finding: Finding) -> Finding:
        with self._lock:
            fields = dict(self._evidence.get(finding.kind, {}))
        if not fields:
            return finding
        if self._reference:
            fields[REFERENCE_KEY] = self._reference
        return replace(finding, evidence={**finding.evidence, **fields})

    # -- starting captures -------------------------------------------------------------

    def _capture(self, kind: str, now: float) -> None:
        self._captured[kind] = now
        self._last = now
        self._count += 1
        try:
            make_run_dir(self.directory)
        except OSError as err:
            message = f"no captures: cannot create {self.directory}: {err.strerror}"
            self._say(message)
            self._note(kind, {STACK_ERROR_KEY: message}, dropped=(STACK_KEY,))
            return
        stack = stack_path(self.directory, kind, now)
        thread = threading.Thread(
            target=self._dump_to, args=(kind, stack), name="driftwatch-capture", daemon=True
        )
        self._threads.append(thread)
        thread.start()
        self._ask_trace(kind, now)

    def _note(self, kind: str, fields: dict[str, str], dropped: Sequence[str] = ()) -> None:
        """Set ``fields`` and remove ``dropped`` in the capture evidence of ``kind``."""
        with self._lock:
            evidence = self._evidence.setdefault(kind, {})
            for key in dropped:
                evidence.pop(key, None)
            evidence.update(fields)

    def _dump_to(self, kind: str, path: Path) -> None:
        try:
            with self._dumping:  # one at a time: a process has one tracer (ptrace) at once
                text = self._dump_text(kind)
            path.write_text(text, encoding="utf-8")
            path.chmod(0o600)
        except (DriftwatchError, OSError) as err:
            message = str(err) if isinstance(err, DriftwatchError) else f"no stack dump: {err}"
            self._say(message)
            self._note(kind, {STACK_ERROR_KEY: message}, dropped=(STACK_KEY,))
            return
        log.info("driftwatch: stacks of process %d in %s", self._pid, path)
        self._note(kind, {STACK_KEY: str(path)}, dropped=(STACK_ERROR_KEY,))
        enforce_caps(self.directory)

    def _dump_text(self, kind: str) -> str:
        """The stacks; for ``DESCRIPTOR_KINDS``, the open descriptors first (and the stacks
        if they can be had: the listing needs no py-spy)."""
        if kind not in DESCRIPTOR_KINDS:
            return self._dump(self._pid)
        listing = describe_descriptors(self._pid)
        try:
            stacks = self._dump(self._pid)
        except CaptureUnavailable as err:
            stacks = f"{err}\n"
        return f"{listing}\n{stacks}"

    def _maybe_reference(self, now: float, store: Store) -> None:
        hook = self._hook
        if self._reference_asked or hook is None or not hook.connected:
            return
        if self._hook_seen is None:
            self._hook_seen = now
        steps = store.get(("train_step", ()))
        latest = steps.latest() if steps is not None else None
        if latest is None or latest[1] < REFERENCE_AFTER_STEPS:
            return
        if now - self._hook_seen < REFERENCE_AFTER_SECONDS:
            return
        self._reference_asked = True
        try:
            make_run_dir(self.directory)
        except OSError as err:
            self._say(f"no captures: cannot create {self.directory}: {err.strerror}")
            return
        self._ask_trace(REFERENCE, now)

    def _ask_trace(self, label: str, now: float) -> None:
        """Ask the hook for a trace, unless there is no hook to ask or a trace is under way;
        it is named in the evidence once the hook has written it."""
        hook = self._hook
        if hook is None or not hook.connected or self._pending:
            return
        request = TraceRequest(max(self._last_id + 1, int(now)), TRACE_STEPS, label)
        destination = trace_path(self.directory, label, now)
        try:
            write_request(hook.path, request)
        except ChannelError as err:
            self._failed(_Pending(label, destination, now), str(err))
            return
        self._last_id = request.id
        self._pending[request.id] = _Pending(label, destination, now)

    # -- the hook's answers --------------------------------------------------------------

    def _collect(self, now: float) -> None:
        answers = self._hook.take_answers() if self._hook is not None else []
        for answer in answers:
            pending = self._pending.get(answer.id)
            if pending is None or answer.status is CaptureStatus.STARTED:
                continue
            del self._pending[answer.id]
            self._land(answer, pending)
        for id_, pending in list(self._pending.items()):
            if now - pending.asked > ANSWER_TIMEOUT_SECONDS:
                del self._pending[id_]
                self._failed(pending, "the hook did not answer (is it an older driftwatch?)")

    def _land(self, answer: CaptureAnswer, pending: _Pending) -> None:
        """Copy a finished trace from beside the channel into the run's captures."""
        assert self._hook is not None
        if answer.status is CaptureStatus.FAILED:
            self._failed(pending, answer.error)
            return
        source = traces_dir(self._hook.path) / str(answer.id)
        runs = sorted((source / "plugins" / "profile").glob("*/"))
        try:
            if not runs:
                raise FileNotFoundError(f"the profiler wrote nothing under {source}")
            shutil.copytree(runs[-1], pending.destination)
        except OSError as err:
            self._failed(pending, str(err))
            return
        finally:
            shutil.rmtree(source, ignore_errors=True)
        log.info(
            "driftwatch: profiler trace of %d steps in %s (tensorboard --logdir %s)",
            answer.steps,
            pending.destination,
            trace_logdir(self.directory),
        )
        if pending.label == REFERENCE:
            self._reference = str(pending.destination)
        else:
            fields = {TRACE_KEY: str(pending.destination)}
            fields[LOGDIR_KEY] = str(trace_logdir(self.directory))
            self._note(pending.label, fields, dropped=(TRACE_ERROR_KEY,))
        enforce_caps(self.directory)

    def _failed(self, pending: _Pending, why: str) -> None:
        message = f"no profiler trace ({pending.label}): {why}"
        self._say(message)
        if pending.label != REFERENCE:
            self._note(pending.label, {TRACE_ERROR_KEY: message}, (TRACE_KEY, LOGDIR_KEY))

    def _say(self, message: str) -> None:
        """Log ``message`` once: a capture problem is told, never repeated, never raised."""
        if message not in self._said:
            self._said.add(message)
            log.warning("%s", message)

    # -- as a sink -----------------------------------------------------------------------

    def publish(self, snapshot: Snapshot) -> None:
        """Nothing: the captures start in ``annotate``, before the findings are announced."""

    def settle(self) -> None:
        """Wait for the stack dumps under way, and take in the traces the hook finished."""
        for thread in self._threads:
            thread.join()
        self._collect(time.time())

    def close(self, snapshot: Snapshot, ended: str) -> None:
        """Settle: what the monitor did not wait for before its sinks closed."""
        self.settle()


def capturer_for(db: Path, target: TargetInfo, sources: Sequence[object]) -> Capturer:
    """The capturer of the run ``target`` whose history is ``db``, with its hook source if
    ``sources`` has one."""
    hook = next((s for s in sources if isinstance(s, HookSource)), None)
    directory = run_dir(db, socket.gethostname(), target.pid, target.create_time)
    return Capturer(directory, target.pid, hook)
