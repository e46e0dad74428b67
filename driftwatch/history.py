"""The embedded history: each run's metadata, downsampled series and findings, in SQLite.

One database serves any number of runs at once (``attach`` and ``run`` record one, the
daemon one per target). A monitor hands each tick to its run's ``RunRecorder``, which turns
what changed in the store's downsampled tiers and in the findings into a batch and offers it
to a bounded queue without waiting; one writer thread per database commits the batches, many
to a transaction. When the queue is full the recorder keeps its place and sends the same
rows with its next batch, so a slow disk delays the history but never blocks a tick.

A run is the process it watches, ``(host, pid, create_time)``: the identity ``Target``
already uses to tell a reused PID. A restarted ``attach`` or daemon finds that row and
resumes it; a new process is a new run even under the same run name, because names are
labels people choose and repeat. (In the one bucket per tier that spans the restart, the
new monitor's part replaces what the old one had written of it.)

Size is bounded: each tier is kept as far back from the run's newest data as its
``TierSpec.history_seconds`` says (an hour of 10 s buckets, a day of 1 min buckets, the
whole run of 10 min buckets), and runs not seen for ``retention`` seconds are deleted.
"""

from __future__ import annotations

import json
import logging
import math
import os
import queue
import resource
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from driftwatch import __version__
from driftwatch.errors import HistoryError
from driftwatch.findings import Finding, Severity, worst_per_kind
from driftwatch.series import Labels, SeriesKey
from driftwatch.store import DEFAULT_TIERS, Bucket, Store, TierSpec
from driftwatch.target import TargetInfo
from driftwatch.units import human_bytes

if TYPE_CHECKING:
    from driftwatch.monitor import Snapshot

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
DEFAULT_RETENTION = 28 * 86400.0
FLUSH_SECONDS = 5.0
"""How often a recorder sends a batch: the most a SIGKILL can lose."""
QUEUE_BATCHES = 256
PRUNE_SECONDS = 600.0
"""How often (in run time) the writer drops a run's fine buckets that aged out."""
PRUNE_RUNS_SECONDS = 3600.0
"""How often (wall-clock) the writer deletes runs older than the retention."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    create_time REAL NOT NULL,  -- the process's start, unix seconds
    command TEXT NOT NULL,      -- JSON list, values of secret-looking flags redacted
    user TEXT NOT NULL,
    meta TEXT NOT NULL,         -- JSON object: versions of driftwatch, Python, TF, Keras
    first_seen REAL NOT NULL,
    last_seen REAL NOT NULL,
    ended TEXT                  -- why monitoring last ended; NULL while watched or if killed
);
CREATE INDEX IF NOT EXISTS runs_process ON runs (host, pid, create_time);
CREATE TABLE IF NOT EXISTS series (
    id INTEGER PRIMARY KEY,
    run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    labels TEXT NOT NULL,       -- JSON object
    UNIQUE (run_id, name, labels)
);
-- One row of a store tier; NULL stands for NaN.
CREATE TABLE IF NOT EXISTS buckets (
    series_id INTEGER NOT NULL REFERENCES series (id) ON DELETE CASCADE,
    width REAL NOT NULL,
    start REAL NOT NULL,
    count INTEGER NOT NULL,
    mean REAL, min REAL, max REAL, last REAL,
    PRIMARY KEY (series_id, width, start)
) WITHOUT ROWID;
-- Each kind of finding once per run: first seen, last seen, latest state.
CREATE TABLE IF NOT EXISTS findings (
    run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    kind TEXT NOT NULL,
    severity TEXT NOT NULL,
    since REAL NOT NULL,
    first_seen REAL NOT NULL,
    last_seen REAL NOT NULL,
    message TEXT NOT NULL,
    evidence TEXT NOT NULL,     -- JSON object
    PRIMARY KEY (run_id, kind)
);
-- When a kind started holding, changed severity, or stopped (severity NULL).
CREATE TABLE IF NOT EXISTS finding_changes (
    run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    kind TEXT NOT NULL,
    t REAL NOT NULL,
    severity TEXT
);
CREATE INDEX IF NOT EXISTS finding_changes_run ON finding_changes (run_id, t);
"""


def default_db_path(environ: dict[str, str] | None = None) -> Path:
    """``$XDG_DATA_HOME/driftwatch/history.db``, else ``~/.local/share/driftwatch/history.db``."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "driftwatch" / "history.db"


def _connect(path: Path, *, read_only: bool) -> sqlite3.Connection:
    """A connection with driftwatch's settings; ``HistoryError`` for anything unusable."""
    try:
        if read_only:
            if not path.is_file():
                raise HistoryError(f"no history at {path} (attach and run record one)")
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        # Another driftwatch may be writing the same file; the writer thread can afford to wait.
        conn.execute(f"PRAGMA busy_timeout = {5000 if read_only else 30000}")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise HistoryError(f"history {path} was written by a newer driftwatch")
        if not read_only:
            conn.execute("PRAGMA foreign_keys = ON")
            if version == 0:
                conn.execute("PRAGMA auto_vacuum = INCREMENTAL")  # before the first table
                conn.execute("PRAGMA journal_mode = WAL")
                # IF NOT EXISTS: another driftwatch may be creating it at the same time.
                conn.executescript(f"BEGIN; {_SCHEMA} PRAGMA user_version = 1; COMMIT;")
            conn.execute("PRAGMA synchronous = NORMAL")  # WAL: durable at checkpoints
        elif version == 0:
            raise HistoryError(f"{path} holds no driftwatch history")
    except sqlite3.Error as err:
        raise HistoryError(f"cannot use the history {path}: {err}") from err
    except OSError as err:
        raise HistoryError(f"cannot use the history {path}: {err.strerror}") from err
    return conn


def _likely_cause(path: Path) -> str:
    """Why writes to ``path`` may fail, as far as this process can tell: size limit, space."""
    limit, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    if limit != resource.RLIM_INFINITY:
        return f" (file size limit {human_bytes(limit)}: ulimit -f)"
    try:
        free = os.statvfs(path.parent)
    except OSError:
        return ""
    if free.f_bavail * free.f_frsize < 16 * 2**20:
        return f" (no space left on {path.parent})"
    return ""


@dataclass(frozen=True, slots=True)
class _FindingState:
    finding: Finding
    first_seen: float
    last_seen: float


@dataclass(frozen=True, slots=True)
class _Batch:
    """What one recorder sends at once; the writer commits it in one transaction."""

    target: TargetInfo
    run: str
    t: float
    buckets: list[tuple[str, str, float, Bucket]]  # series, labels JSON, tier width, row
    findings: list[_FindingState]
    changes: list[tuple[str, float, str | None]]  # kind, when, severity (None: cleared)
    ended: str | None
    meta: dict[str, str]  # to merge into the run's metadata (versions, once known)


_STOP = object()


class History:
    """One history database and its writer thread; ``recorder()`` per run being watched."""

    def __init__(
        self,
        path: Path,
        retention: float = DEFAULT_RETENTION,
        tiers: Sequence[TierSpec] = DEFAULT_TIERS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self.retention = retention
        self._horizons = {
            t.width_seconds: t.history_seconds for t in tiers if math.isfinite(t.history_seconds)
        }
        self._clock = clock
        self._conn = _connect(path, read_only=False)
        self._queue: queue.Queue[_Batch | object] = queue.Queue(QUEUE_BATCHES)
        # Ids of the runs being watched and of their series; forgotten when a run ends, so a
        # daemon that sees many processes come and go keeps only the live ones.
        self._run_ids: dict[TargetInfo, int] = {}
        self._series_ids: dict[int, dict[tuple[str, str], int]] = {}
        self._pruned_at: dict[int, float] = {}
        self.failed: str | None = None
        """Why the history stopped being written; ``None`` while it works."""
        self.deferred = 0
        """Batches the full queue turned away (their rows went with a later batch)."""
        self._host = socket.gethostname()
        self._runs_pruned_at = -math.inf
        try:
            self._prune_runs()
        except sqlite3.Error as err:
            self._conn.close()
            raise HistoryError(f"cannot use the history {path}: {err}") from err
        self._writer = threading.Thread(target=self._write_loop, name="history", daemon=True)
        self._writer.start()

    def recorder(self, run: str, target: TargetInfo) -> RunRecorder:
        """A recorder for the run watching ``target``; resumes its history if it has one."""
        return RunRecorder(self, run, target)

    def offer(self, batch: _Batch, wait: bool = False) -> bool:
        """Queue ``batch`` for the writer; unless ``wait``, ``False`` if it must come again."""
        try:
            self._queue.put(batch, block=wait)
        except queue.Full:
            if not self.deferred:
                log.warning("history: the writer is behind (slow disk?); batches are deferred")
            self.deferred += 1
            return False
        return True

    def close(self) -> None:
        """Write what is queued, then close the database."""
        self._queue.put(_STOP)
        self._writer.join()
        self._conn.close()

    def _write_loop(self) -> None:
        while True:
            batches = [self._queue.get()]
            while len(batches) < QUEUE_BATCHES and not self._queue.empty():
                batches.append(self._queue.get_nowait())
            stop = batches[-1] is _STOP
            pending = [b for b in batches if isinstance(b, _Batch)]
            if pending and self.failed is None:
                self._commit(pending)
            if stop:
                return

    def _commit(self, batches: list[_Batch]) -> None:
        try:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                for batch in batches:
                    self._write(batch)
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")
            if self._clock() >= self._runs_pruned_at + PRUNE_RUNS_SECONDS:
                self._prune_runs()
        except sqlite3.Error as err:
            self.failed = f"{err}{_likely_cause(self.path)}"
            log.warning(
                "history stopped: cannot write %s: %s; monitoring goes on without it",
                self.path,
                self.failed,
            )
        except Exception as err:  # a bug here must neither end monitoring nor hang close()
            self.failed = f"internal error: {err!r}"
            log.exception("history stopped: internal error; monitoring goes on without it")

    def _write(self, batch: _Batch) -> None:
        run_id = self._run_id(batch)
        conn = self._conn
        conn.execute(
            "UPDATE runs SET last_seen = max(last_seen, ?), ended = ? WHERE id = ?",
            (batch.t, batch.ended, run_id),
        )
        if batch.meta:
            conn.execute(
                "UPDATE runs SET meta = json_patch(meta, ?) WHERE id = ?",
                (json.dumps(batch.meta), run_id),
            )
        conn.executemany(
            "INSERT OR REPLACE INTO buckets VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                (self._series_id(run_id, name, labels), width, *row)
                for name, labels, width, row in batch.buckets
            ),
        )
        conn.executemany(
            "INSERT INTO findings VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO UPDATE SET "
            "severity = excluded.severity, last_seen = excluded.last_seen, "
            "message = excluded.message, evidence = excluded.evidence",
            (
                (
                    run_id,
                    s.finding.kind,
                    s.finding.severity.value,
                    s.finding.since,
                    s.first_seen,
                    s.last_seen,
                    s.finding.message,
                    json.dumps(dict(s.finding.evidence)),
                )
                for s in batch.findings
            ),
        )
        conn.executemany(
            "INSERT INTO finding_changes VALUES (?, ?, ?, ?)",
            ((run_id, kind, t, severity) for kind, t, severity in batch.changes),
        )
        if batch.t >= self._pruned_at.get(run_id, -math.inf) + PRUNE_SECONDS:
            self._prune_buckets(run_id, batch.t)
        if batch.ended is not None:
            del self._run_ids[batch.target]
            self._series_ids.pop(run_id, None)
            self._pruned_at.pop(run_id, None)

    def _run_id(self, batch: _Batch) -> int:
        target = batch.target
        run_id = self._run_ids.get(target)
        if run_id is not None:
            return run_id
        row = self._conn.execute(
            "SELECT id FROM runs WHERE host = ? AND pid = ? AND abs(create_time - ?) < 0.01",
            (self._host, target.pid, target.create_time),
        ).fetchone()
        if row is not None:
            run_id = int(row[0])
            self._conn.execute("UPDATE runs SET name = ? WHERE id = ?", (batch.run, run_id))
            log.info("history: resuming run %s (#%d)", batch.run, run_id)
        else:
            meta = {"driftwatch": __version__}
            cursor = self._conn.execute(
                "INSERT INTO runs (name, host, pid, create_time, command, user, meta, "
                "first_seen, last_seen) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    batch.run,
                    self._host,
                    target.pid,
                    target.create_time,
                    json.dumps(list(target.command)),
                    target.username,
                    json.dumps(meta),
                    batch.t,
                    batch.t,
                ),
            )
            assert cursor.lastrowid is not None
            run_id = cursor.lastrowid
        self._run_ids[target] = run_id
        return run_id

    def _series_id(self, run_id: int, name: str, labels: str) -> int:
        known = self._series_ids.setdefault(run_id, {})
        series_id = known.get((name, labels))
        if series_id is None:
            key = (run_id, name, labels)
            self._conn.execute(
                "INSERT OR IGNORE INTO series (run_id, name, labels) VALUES (?, ?, ?)", key
            )
            (series_id,) = self._conn.execute(
                "SELECT id FROM series WHERE run_id = ? AND name = ? AND labels = ?", key
            ).fetchone()
            known[(name, labels)] = series_id
        return series_id

    def _prune_buckets(self, run_id: int, now: float) -> None:
        """Drop the run's buckets of fine tiers older than the tiers' history horizons."""
        for width, horizon in self._horizons.items():
            self._conn.execute(
                "DELETE FROM buckets WHERE width = ? AND start < ? AND series_id IN "
                "(SELECT id FROM series WHERE run_id = ?)",
                (width, now - horizon, run_id),
            )
        self._pruned_at[run_id] = now

    def _prune_runs(self) -> None:
        """Delete runs last seen more than ``retention`` ago, and give their space back."""
        now = self._clock()
        cursor = self._conn.execute("DELETE FROM runs WHERE last_seen < ?", (now - self.retention,))
        self._runs_pruned_at = now
        if cursor.rowcount:
            self._conn.execute("PRAGMA incremental_vacuum")
            log.info("history: removed %d run(s) older than the retention", cursor.rowcount)


class RunRecorder:
    """Turns one run's ticks into batches for its ``History``; never blocks, never raises."""

    def __init__(self, history: History, run: str, target: TargetInfo) -> None:
        self._history = history
        self._run = run
        self._target = target
        self._sent: dict[tuple[SeriesKey, float], int] = {}  # buckets closed and sent per tier
        self._holding: dict[str, _FindingState] = {}
        self._changed: dict[str, _FindingState] = {}  # since the last batch
        self._changes: list[tuple[str, float, str | None]] = []
        self._next_send = -math.inf
        self._meta_sent = False

    def record(self, snapshot: Snapshot, store: Store) -> None:
        """Note the tick's findings; every ``FLUSH_SECONDS`` of run time, send a batch."""
        self._note_findings(snapshot)
        if snapshot.t >= self._next_send:
            self._send(snapshot.t, store, None)

    def finish(self, snapshot: Snapshot, store: Store, ended: str) -> None:
        """Send everything up to the last tick, with why monitoring ended (may wait)."""
        self._send(snapshot.t, store, ended)

    def _note_findings(self, snapshot: Snapshot) -> None:
        now = snapshot.t
        worst = worst_per_kind(snapshot.findings)
        for kind, finding in worst.items():
            before = self._holding.get(kind)
            if before is None or before.finding.severity is not finding.severity:
                self._changes.append((kind, now, finding.severity.value))
            first_seen = before.first_seen if before is not None else now
            self._holding[kind] = self._changed[kind] = _FindingState(finding, first_seen, now)
        for kind in [k for k in self._holding if k not in worst]:
            del self._holding[kind]
            self._changes.append((kind, now, None))

    def _send(self, now: float, store: Store, ended: str | None) -> None:
        if self._history.failed is not None:
            return
        buckets: list[tuple[str, str, float, Bucket]] = []
        sent: dict[tuple[SeriesKey, float], int] = {}
        meta: dict[str, str] = {}
        for key, series in store:
            name, labels = key
            if name == "runtime_info" and not self._meta_sent:
                meta = {label: value for label, value in labels if value}
            labels_json = _labels_json(labels)
            for tier in series.tiers:
                rows = tier.closed_since(self._sent.get((key, tier.width), 0))
                current = tier.open_bucket()
                if current is not None:
                    rows.append(current)
                buckets.extend((name, labels_json, tier.width, row) for row in rows)
                sent[(key, tier.width)] = tier.closed
        batch = _Batch(
            self._target,
            self._run,
            now,
            buckets,
            list(self._changed.values()),
            list(self._changes),
            ended,
            meta,
        )
        if self._history.offer(batch, wait=ended is not None):
            self._meta_sent = self._meta_sent or bool(meta)
            self._sent.update(sent)
            self._changed.clear()
            self._changes.clear()
            self._next_send = now + FLUSH_SECONDS


def _labels_json(labels: Labels) -> str:
    return json.dumps(dict(labels), sort_keys=True)


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


class HistoryReader:
    """Read-only access to a history database, for ``driftwatch report``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._conn = _connect(path, read_only=True)

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
        return [
            StoredFinding(
                kind,
                Severity(severity),
                since,
                first_seen,
                last_seen,
                message,
                json.loads(evidence),
                changes.get(kind, []),
            )
            for kind, severity, since, first_seen, last_seen, message, evidence in self._query(
                "SELECT kind, severity, since, first_seen, last_seen, message, evidence "
                "FROM findings WHERE run_id = ? ORDER BY first_seen, kind",
                run_id,
            )
        ]

    def close(self) -> None:
        self._conn.close()
