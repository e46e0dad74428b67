"""Reading runs back from a history database, for ``driftwatch report``."""

from __future__ import annotations

import json
import math
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from driftwatch.causes import CAUSES, RankedCause
from driftwatch.errors import HistoryError
from driftwatch.findings import Severity
from driftwatch.history.schema import connect_for_reading
from driftwatch.series import SeriesKey


@dataclass(frozen=True, slots=True)
class RunRecord:
    """A run as the history knows it."""

    id: int
    name: str
    host: str
    pid: int
    create_time: float
    command: list[str]
    user: str
    meta: dict[str, str]
    first_seen: float
    last_seen: float
    ended: str | None


@dataclass(frozen=True, slots=True)
class StoredBucket:
    """One bucket of a tier, as stored; NaN where the store had no finite value."""

    start: float
    width: float
    count: float
    mean: float
    min: float
    max: float
    last: float


@dataclass(frozen=True, slots=True)
class StoredFinding:
    kind: str
    severity: Severity  # the latest
    since: float
    first_seen: float
    last_seen: float
    message: str
    evidence: dict[str, float | str]
    changes: list[tuple[float, Severity | None]]  # when it started, changed, stopped (None)
    causes: tuple[RankedCause, ...] = ()  # slowdowns and stalls: likely causes, best first


def _evidence_and_causes(text: str) -> tuple[dict[str, float | str], tuple[RankedCause, ...]]:
    """A stored finding's evidence, and its ranked causes (those this version knows)."""
    evidence = json.loads(text)
    listed = evidence.pop("causes", [])
    causes = tuple(
        RankedCause(c["cause"], float(c["score"]), c.get("numbers", {}), c.get("detail", ""))
        for c in listed
        if isinstance(c, dict) and c.get("cause") in CAUSES
    )
    return evidence, causes


class HistoryReader:
    """Read-only access to a history database, for ``driftwatch report``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._conn = connect_for_reading(path)

    def _query(self, sql: str, *args: object) -> list[sqlite3.Row]:
        try:
            return self._conn.execute(sql, args).fetchall()
        except sqlite3.Error as err:
            raise HistoryError(f"cannot read the history {self.path}: {err}") from err

    def runs(self) -> list[RunRecord]:
        """Every run, the one whose process started last first."""
        rows = self._query(
            "SELECT id, name, host, pid, create_time, command, user, meta, first_seen, "
            "last_seen, ended FROM runs ORDER BY create_time DESC, id DESC"
        )
        return [
            RunRecord(
                id=row[0],
                name=row[1],
                host=row[2],
                pid=row[3],
                create_time=row[4],
                command=json.loads(row[5]),
                user=row[6],
                meta=json.loads(row[7]),
                first_seen=row[8],
                last_seen=row[9],
                ended=row[10],
            )
            for row in rows
        ]

    def run(self, selector: str | None) -> RunRecord:
        """The run numbered ``selector``, else the latest named so; the latest run if ``None``."""
        runs = self.runs()
        if not runs:
            raise HistoryError(f"the history {self.path} holds no runs yet")
        if selector is None:
            return runs[0]
        for run in runs:
            if str(run.id) == selector:
                return run
        for run in runs:
            if run.name == selector:
                return run
        names = ", ".join(sorted({r.name for r in runs}))
        raise HistoryError(f"no run {selector!r} in {self.path} (it has: {names})")

    def series(self, run_id: int) -> dict[SeriesKey, list[StoredBucket]]:
        """Each series of the run over its whole span, at the finest resolution kept.

        The coarser tiers fill in only before the finer ones begin.
        """
        tiers: dict[SeriesKey, dict[float, list[StoredBucket]]] = {}
        for name, labels, *row in self._query(
            "SELECT s.name, s.labels, b.start, b.width, b.count, b.mean, b.min, b.max, b.last "
            "FROM buckets b JOIN series s ON s.id = b.series_id WHERE s.run_id = ? "
            "ORDER BY s.name, s.labels, b.width, b.start",
            run_id,
        ):
            key = (name, tuple(sorted(json.loads(labels).items())))
            start, width, count, mean, low, high, last = (
                math.nan if v is None else float(v) for v in row
            )
            bucket = StoredBucket(start, width, count, mean, low, high, last)
            tiers.setdefault(key, {}).setdefault(bucket.width, []).append(bucket)
        stitched: dict[SeriesKey, list[StoredBucket]] = {}
        for key, by_width in tiers.items():
            merged: list[StoredBucket] = []
            for width in sorted(by_width):  # finest first, each coarser one before it
                boundary = merged[0].start if merged else math.inf
                merged[:0] = [b for b in by_width[width] if b.start + width <= boundary]
            stitched[key] = merged
        return stitched

    def findings(self, run_id: int) -> list[StoredFinding]:
        """Every kind of finding the run had, in the order they were first seen."""
        changes: dict[str, list[tuple[float, Severity | None]]] = {}
        for kind, t, severity in self._query(
            "SELECT kind, t, severity FROM finding_changes WHERE run_id = ? ORDER BY t", run_id
        ):
            changes.setdefault(kind, []).append((t, Severity(severity) if severity else None))
        stored = []
        for kind, severity, since, first_seen, last_seen, message, evidence in self._query(
            "SELECT kind, severity, since, first_seen, last_seen, message, evidence "
            "FROM findings WHERE run_id = ? ORDER BY first_seen, kind",
            run_id,
        ):
            numbers, causes = _evidence_and_causes(evidence)
            stored.append(
                StoredFinding(
                    kind,
                    Severity(severity),
                    since,
                    first_seen,
                    last_seen,
                    message,
                    numbers,
                    changes.get(kind, []),
                    causes,
                )
            )
        return stored

    def close(self) -> None:
        self._conn.close()
