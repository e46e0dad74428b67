"""Writing the history: one ``History`` (a writer thread) per database, one ``RunRecorder``
(a monitor's sink) per run being watched.

One database serves any number of runs at once (``attach`` and ``run`` record one, the
daemon one per target). A monitor publishes each tick to its run's ``RunRecorder``, which
turns what changed in the store's downsampled tiers and in the findings into a batch and
offers it to a bounded queue without waiting; one writer thread per database commits the
batches, many to a transaction: the recorders send at the same multiples of ``FLUSH_SECONDS``,
and the writer gathers for ``GATHER_SECONDS`` what comes together (a daemon's 8 runs: one
transaction every 5 s, not 8). When the queue is full the recorder keeps its place and
sends the same rows with its next batch, so a slow disk delays the history but never blocks
a tick.

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
from dataclasses import dataclass, replace
from pathlib import Path

from driftwatch import __version__
from driftwatch.errors import HistoryError
from driftwatch.findings import Finding, worst_per_kind
from driftwatch.history.schema import connect_for_writing
from driftwatch.runtime.snapshot import Snapshot
from driftwatch.runtime.store import DEFAULT_TIERS, Bucket, StoreView, TierSpec
from driftwatch.series import Labels, SeriesKey
from driftwatch.target.process import TargetInfo
from driftwatch.units import human_bytes

log = logging.getLogger(__name__)

DEFAULT_RETENTION = 28 * 86400.0
"""Seconds a run not seen since is kept (28 days)."""
FLUSH_SECONDS = 5.0
"""How often a recorder sends a batch, at multiples of it in run time (all of a daemon's runs
in one tick): with ``GATHER_SECONDS``, the most a SIGKILL can lose."""
GATHER_SECONDS = 0.1
"""How long the writer waits after a batch comes for those of the same tick's other runs, so
that they share one transaction (and the sampler does not wake the writer once a run)."""
QUEUE_BATCHES = 256
"""Batches the writer's queue holds; beyond, recorders defer theirs."""
PRUNE_SECONDS = 600.0
"""How often (in run time) the writer drops a run's fine buckets that aged out."""
PRUNE_RUNS_SECONDS = 3600.0
"""How often (wall-clock) the writer deletes runs older than the retention."""


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
        self._conn = connect_for_writing(path)
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
            if batches[0] is not _STOP:
                time.sleep(GATHER_SECONDS)  # the other runs' batches of the same tick
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
        known = self._series_ids.setdefault(run_id, {})
        # An upsert: a bucket written before (the open one, at every flush) is updated in
        # place, where INSERT OR REPLACE deleted it and checked the foreign key twice (a
        # quarter of the writer's time).
        conn.executemany(
            "INSERT INTO buckets VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO UPDATE SET "
            "count = excluded.count, mean = excluded.mean, min = excluded.min, "
            "max = excluded.max, last = excluded.last",
            (
                (known.get((name, labels)) or self._series_id(run_id, name, labels), width, *row)
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
                    json.dumps(s.finding.evidence_record()),
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
    """A monitor's sink: turns one run's snapshots into batches for its ``History``; never
    blocks a tick, never raises."""

    def __init__(self, history: History, run: str, target: TargetInfo) -> None:
        self._history = history
        self._run = run
        self._target = target
        self._sent: dict[SeriesKey, list[int]] = {}  # buckets closed and sent, per tier
        self._labels_json: dict[SeriesKey, str] = {}
        self._holding: dict[str, _FindingState] = {}
        self._ended: dict[str, _FindingState] = {}  # each kind's last state once it ended
        self._changed: dict[str, _FindingState] = {}  # since the last batch
        self._changes: list[tuple[str, float, str | None]] = []
        self._next_send = -math.inf
        self._meta_sent = False
        self._rank_sent = False  # the snapshots' rank (of a distributed job) is in the metadata

    def publish(self, snapshot: Snapshot) -> None:
        """Note the tick's findings; every ``FLUSH_SECONDS`` of run time, send a batch."""
        self._note_findings(snapshot)
        if snapshot.t >= self._next_send:
            self._send(snapshot.t, snapshot.store, None, snapshot.rank)

    def close(self, snapshot: Snapshot, ended: str) -> None:
        """Send everything up to the last tick, with why monitoring ended (may wait); the
        last snapshot's findings, and those that ended before it, are noted again with the
        evidence that landed since (an ended one stays ended: only its evidence changes)."""
        self._note_findings(snapshot)
        for finding in snapshot.ended_findings:
            state = self._ended.get(finding.kind)
            if state is not None and finding.evidence != state.finding.evidence:
                self._changed[finding.kind] = replace(state, finding=finding)
        self._send(snapshot.t, snapshot.store, ended, snapshot.rank)

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
            self._ended[kind] = self._holding.pop(kind)
            self._changes.append((kind, now, None))

    def _send(self, now: float, store: StoreView, ended: str | None, rank: str) -> None:
        if self._history.failed is not None:
            return
        buckets: list[tuple[str, str, float, Bucket]] = []
        sent: dict[SeriesKey, list[int]] = {}
        meta: dict[str, str] = {}
        ranked = {"rank": rank} if rank and not self._rank_sent else {}
        for key, series in store:
            name, labels = key
            if name == "runtime_info" and not self._meta_sent:
                meta = {label: value for label, value in labels if value}
            labels_json = self._labels_json.get(key)
            if labels_json is None:
                labels_json = self._labels_json[key] = _labels_json(labels)
            done = self._sent.get(key)
            closed = sent[key] = [tier.closed for tier in series.tiers]
            for index, tier in enumerate(series.tiers):
                since = done[index] if done else 0
                rows = tier.closed_since(since) if closed[index] > since else []
                # A coarser tier's open bucket lies within the finest tier's span, where the
                # reader takes the finest: it is sent once closed, or when the run ends.
                current = tier.open_bucket() if index == 0 or ended is not None else None
                if current is not None:
                    rows.append(current)
                width = tier.width
                buckets += [(name, labels_json, width, row) for row in rows]
        batch = _Batch(
            self._target,
            self._run,
            now,
            buckets,
            list(self._changed.values()),
            list(self._changes),
            ended,
            ranked | meta,
        )
        if self._history.offer(batch, wait=ended is not None):
            self._meta_sent = self._meta_sent or bool(meta)
            self._rank_sent = self._rank_sent or bool(ranked)
            self._sent.update(sent)
            self._changed.clear()
            self._changes.clear()
            # The next multiple of FLUSH_SECONDS: every run's recorder sends in the same tick.
            self._next_send = (math.floor(now / FLUSH_SECONDS) + 1) * FLUSH_SECONDS


def _labels_json(labels: Labels) -> str:
    return json.dumps(dict(labels), sort_keys=True)
