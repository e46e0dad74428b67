"""The history database's tables, and opening it: for the writer (creating the tables in a
new file) or for reading (a file that must already hold a history)."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from driftwatch.errors import HistoryError

SCHEMA_VERSION = 1
"""The ``user_version`` of a database with these tables."""

SCHEMA = """
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
"""The tables and indexes, created in a new database."""


def default_db_path(environ: dict[str, str] | None = None) -> Path:
    """``$XDG_DATA_HOME/driftwatch/history.db``, else ``~/.local/share/driftwatch/history.db``."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "driftwatch" / "history.db"


@contextmanager
def _usable(path: Path) -> Iterator[None]:
    """Turns SQLite's and the file system's errors into ``HistoryError``."""
    try:
        yield
    except sqlite3.Error as err:
        raise HistoryError(f"cannot use the history {path}: {err}") from err
    except OSError as err:
        raise HistoryError(f"cannot use the history {path}: {err.strerror}") from err


def _version(conn: sqlite3.Connection, path: Path) -> int:
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version > SCHEMA_VERSION:
        raise HistoryError(f"history {path} was written by a newer driftwatch")
    return version


def connect_for_writing(path: Path) -> sqlite3.Connection:
    """A connection for the writer thread; creates the database and its tables if new.

    ``HistoryError`` for anything unusable.
    """
    with _usable(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        # Another driftwatch may be writing the same file; the writer thread can afford to wait.
        conn.execute("PRAGMA busy_timeout = 30000")
        version = _version(conn, path)
        conn.execute("PRAGMA foreign_keys = ON")
        if version == 0:
            conn.execute("PRAGMA auto_vacuum = INCREMENTAL")  # before the first table
            conn.execute("PRAGMA journal_mode = WAL")
            # IF NOT EXISTS: another driftwatch may be creating it at the same time.
            conn.executescript(f"BEGIN; {SCHEMA} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;")
        conn.execute("PRAGMA synchronous = NORMAL")  # WAL: durable at checkpoints
    return conn


def connect_for_reading(path: Path) -> sqlite3.Connection:
    """A read-only connection to an existing history; ``HistoryError`` for anything unusable."""
    with _usable(path):
        if not path.is_file():
            raise HistoryError(f"no history at {path} (attach and run record one)")
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
        conn.execute("PRAGMA busy_timeout = 5000")
        if _version(conn, path) == 0:
            raise HistoryError(f"{path} holds no driftwatch history")
    return conn
