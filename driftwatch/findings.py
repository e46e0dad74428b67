"""What driftwatch says when a run goes bad: a kind, a severity, since when, and evidence.

``KINDS`` is the table of the kinds of finding, as ``SERIES`` is of the series: a detector
that reports a new kind adds a row here, with its alert and runbook section.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from driftwatch.causes import RankedCause


class Severity(enum.Enum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        """0 for info, 2 for critical: worse is higher."""
        return _RANKS[self]


_RANKS = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}


@dataclass(frozen=True, slots=True)
class KindSpec:
    """What a kind of finding is called and where a person reads what to do about it."""

    title: str
    severity: Severity  # the severity it is reported at unless its evidence raises it
    runbook: str | None  # anchor of its section in docs/runbook.md: its alert's name, lowercased


KINDS: dict[str, KindSpec] = {
    "gradual_slowdown": KindSpec("Gradual slowdown", Severity.WARNING, "driftwatchgradualslowdown"),
    "abrupt_slowdown": KindSpec("Abrupt slowdown", Severity.WARNING, "driftwatchabruptslowdown"),
    "periodic_stall": KindSpec("Periodic stalls", Severity.INFO, "driftwatchperiodicstall"),
    "slow_callbacks": KindSpec(
        "Time outside the train step", Severity.WARNING, "driftwatchslowcallbacks"
    ),
    "host_memory_drift": KindSpec(
        "Host memory drift", Severity.WARNING, "driftwatchhostmemorydrift"
    ),
    "worker_memory_drift": KindSpec(
        "Worker processes' memory drift", Severity.WARNING, "driftwatchworkermemorydrift"
    ),
    "tf_memory_drift": KindSpec(
        "TensorFlow allocator memory drift", Severity.WARNING, "driftwatchtfmemorydrift"
    ),
    "gpu_memory_drift": KindSpec("GPU memory drift", Severity.WARNING, "driftwatchgpumemorydrift"),
    "memory_step": KindSpec("One-off memory step", Severity.INFO, "driftwatchmemorystep"),
    "fd_exhaustion": KindSpec(
        "Open descriptors growing towards their limit", Severity.WARNING, "driftwatchfdexhaustion"
    ),
    "disk_exhaustion": KindSpec(
        "A filesystem the job writes to filling up", Severity.WARNING, "driftwatchdiskexhaustion"
    ),
    "zombie_children": KindSpec(
        "Unreaped child processes piling up", Severity.WARNING, "driftwatchzombiechildren"
    ),
    "thread_exhaustion": KindSpec(
        "Threads growing towards their limit", Severity.WARNING, "driftwatchthreadexhaustion"
    ),
    "event_file_growth": KindSpec(
        "Event-file bytes per step growing", Severity.WARNING, "driftwatcheventfilegrowth"
    ),
    "upload_growth": KindSpec(
        "Uploads per step growing", Severity.WARNING, "driftwatchuploadgrowth"
    ),
    "event_file_unrotated": KindSpec(
        "Event file never rotated", Severity.WARNING, "driftwatcheventfileunrotated"
    ),
    "nonfinite": KindSpec("Non-finite values", Severity.CRITICAL, "driftwatchnonfinite"),
    "stalled": KindSpec("No training steps", Severity.WARNING, "driftwatchstalled"),
    "straggling_rank": KindSpec("Straggling rank", Severity.WARNING, "driftwatchstragglingrank"),
    "input_bound": KindSpec("Waiting for input", Severity.INFO, "driftwatchinputbound"),
    "low_gpu_utilization": KindSpec(
        "Low GPU utilization", Severity.WARNING, "driftwatchlowgpuutilization"
    ),
    # Stated by ``driftwatch analyze`` only, never live: no alert, no runbook section.
    "recording_gap": KindSpec("Gap in the recording", Severity.INFO, None),
}
"""Every kind of finding driftwatch reports: the detectors' and ``analyze``'s own."""

JUDGED_AT_END = "judged_at_end"
"""Evidence field of a finding a run's end judged over data no live window could (its value
says over what)."""
WHOLE_RUN = "whole run"
"""``JUDGED_AT_END`` of a finding judged over all of the run."""
CAPTURE_EVIDENCE = "capture_"
"""Prefix of the evidence fields that name captured evidence (paths: never news by
themselves, see ``Finding.diagnosis``)."""
CAPTURE_ERROR = "_error"
"""Suffix of the capture evidence fields that say why a capture could not be made
(``capture_stack_error``)."""

Diagnosis = tuple[Severity, frozenset[tuple[str, str]]]
"""A finding's severity and the evidence that names things, such as a leak's class."""


@dataclass(frozen=True, slots=True)
class Finding:
    kind: str
    severity: Severity
    since: float  # unix seconds: when the problem started, as best the evidence says
    message: str  # what, since when, how fast, the likely cause and what to try
    evidence: Mapping[str, float | str] = field(default_factory=dict)
    causes: tuple[RankedCause, ...] = ()  # slowdowns and stalls: likely causes, best first

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"{self.kind!r} is no kind of finding: give it a row in KINDS")

    @property
    def diagnosis(self) -> Diagnosis:
        """What a reader acts on: the severity and the evidence that names things (a leak's
        class); the numbers move at every evaluation, a change here is news."""
        named = frozenset(
            (k, v)
            for k, v in self.evidence.items()
            if isinstance(v, str) and not k.startswith(CAPTURE_EVIDENCE)
        )
        return self.severity, named

    def evidence_record(self) -> dict[str, object]:
        """The evidence as JSON holds it, the ranked causes under ``causes``."""
        record: dict[str, object] = dict(self.evidence)
        if self.causes:
            record["causes"] = [cause.to_dict() for cause in self.causes]
        return record

    def to_json(self, run: str, rank: str = "") -> str:
        """One JSON line, the format of ``--findings`` and ``analyze --json``; ``rank``: the
        run's process's rank in a distributed job, a field only where it has one."""
        record = {
            "run": run,
            "kind": self.kind,
            "severity": self.severity.value,
            "since": self.since,
            "message": self.message,
            "evidence": self.evidence_record(),
        }
        if rank:
            record["rank"] = rank
        return json.dumps(record, sort_keys=True)


def worst_per_kind(findings: Iterable[Finding]) -> dict[str, Finding]:
    """Each kind's most severe finding (the first of equals): several devices or files may
    hold a finding of one kind at once, and a run speaks of each kind as one finding."""
    worst: dict[str, Finding] = {}
    for finding in findings:
        held = worst.get(finding.kind)
        if held is None or finding.severity.rank > held.severity.rank:
            worst[finding.kind] = finding
    return worst
