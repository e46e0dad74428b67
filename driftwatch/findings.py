"""What driftwatch says when a run goes bad: a kind, a severity, since when, and evidence."""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field


class Severity(enum.Enum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


@dataclass(frozen=True, slots=True)
class Finding:
    kind: str
    severity: Severity
    since: float  # unix seconds: when the problem started, as best the evidence says
    message: str  # what, since when, how fast, the likely cause and what to try
    evidence: Mapping[str, float | str] = field(default_factory=dict)

    def to_json(self, run: str) -> str:
        """One JSON line, the format of ``--findings`` and ``analyze --json``."""
        return json.dumps(
            {
                "run": run,
                "kind": self.kind,
                "severity": self.severity.value,
                "since": self.since,
                "message": self.message,
                "evidence": dict(self.evidence),
            },
            sort_keys=True,
        )
