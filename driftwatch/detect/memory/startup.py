"""When a memory signal's start-up climb (imports, model building, tracing) ended: from the
process's loading (file-backed memory and reads flat while it runs), where those series are
read, else from the signal's shape alone. Reasoning: docs/memory-start-and-end.md,
"When start-up ends".
"""

from __future__ import annotations

import math
import statistics
from collections import deque

STARTUP_MAX_SECONDS = 30.0
"""Longest a signal's climb from its first reading counts as start-up, in seconds."""
STARTUP_PACE_RISES = 3
"""Window rises that set a start-up climb's pace before a new pace can end it."""
STARTUP_FASTER = 2.0
"""Times the climb's median pace and its fastest later rise that is faster than start-up."""
STARTUP_KNEE = 2.0
"""Two windows are alike when neither rises more than this many times the other."""
STARTUP_SETTLED = 0.025
"""A window rising by less than this share of its level per second has settled."""
STARTUP_SLOWER = 3.0
"""A settled window also rises by less than the climb's median pace over this."""


class StartUp:
    """When a signal's start-up climb ended, from its shape alone (no step signal needed).

    Fed the floors of the narrowest windows as they close. The climb from the first reading
    lasts until two windows in a row, alike, rise slowly for the level (``STARTUP_SETTLED``)
    or faster than the climb did (``STARTUP_FASTER``): a new pace, not a lull or a lump of a
    lumpy climb. Growth from the first of them on is judged (docs/memory-start-and-end.md).
    """

    __slots__ = ("_changing", "_previous", "_rates", "ended_at")

    def __init__(self) -> None:
        self.ended_at = math.nan
        self._previous: tuple[float, float] | None = None  # (window start, floor)
        self._rates: list[float] = []
        # a window that may begin a new pace: ("faster" or "slower", its start, its rate)
        self._changing: tuple[str, float, float] | None = None

    def window_closed(self, start: float, floor: float) -> None:
        if not math.isnan(self.ended_at):
            return
        previous, self._previous = self._previous, (start, floor)
        if previous is None or not start > previous[0]:
            return
        rate = (floor - previous[1]) / (start - previous[0])
        pace = median = math.nan
        if len(self._rates) >= STARTUP_PACE_RISES:
            median = statistics.median(self._rates)
        later = self._rates[STARTUP_PACE_RISES:]
        if len(later) >= 2:
            # Faster than the climb's median pace and than its fastest window once the first
            # ones are past (they may hold the interpreter's and the libraries' jump).
            pace = STARTUP_FASTER * max(median, *later)
        # A new pace shows in two windows in a row (faster ones alike): one alone is a lump
        # or a lull, and joins the climb's pace once the next window says so.
        change = None
        if rate > pace:  # False while the pace is NaN
            change = "faster"
        elif rate <= STARTUP_SETTLED * abs(floor) and rate <= max(median, 0.0) / STARTUP_SLOWER:
            change = "slower"  # False while the pace is NaN: a climb's first lumps are small
        pending = self._changing
        if (
            pending is not None
            and change == pending[0]
            and (change == "slower" or _alike(rate, pending[2]))
        ):
            self.ended_at = pending[1]
            return
        if pending is not None:
            self._rates.append(pending[2])
        if change is None:
            self._rates.append(rate)
            self._changing = None
        else:
            self._changing = (change, previous[0], rate)


def _alike(rate: float, other: float) -> bool:
    """Neither rises more than ``STARTUP_KNEE`` times the other."""
    return max(rate, other) <= STARTUP_KNEE * min(rate, other)


QUIET_SECONDS = 2.0
"""Seconds a process must load nothing (no file-backed memory, no reads) to have started."""
QUIET_CPU_SECONDS = 1.0
"""CPU seconds it must have run in that time: a process starved of CPU loads nothing either."""
QUIET_GROWTH_BYTES = 64 * 1024 * 1024.0
"""Or the watched memory it added in that time, in bytes: growing, it is not starved."""
QUIET_FILE_BYTES = 256 * 1024.0
"""File-backed resident memory, in bytes, that may come in that time: none really does."""
QUIET_READ_BYTES = 1024 * 1024.0
"""Bytes read through system calls in that time that count as reading nothing."""
STARTUP_MAX_CPU_SECONDS = 20.0
"""CPU seconds after which a process that still loads is past its start-up (one that reads
its data from files never stops reading): a TensorFlow start-up took 3-6 here."""
STARTUP_MAX_LOADING_SECONDS = 120.0
"""Longest start-up, in seconds, of a process whose loading is read: one that barely runs
(waiting on a device or a lock) may never use ``STARTUP_MAX_CPU_SECONDS``."""
LOADING_SERIES = ("cpu_seconds", "read_syscall_bytes", "rss_file_bytes")
"""The process's series that tell it is loading, in the order of ``Loading``'s rows."""


class Loading:
    """When a process stopped loading: its file-backed resident memory (``RssFile``: shared
    libraries mapped, their code run for the first time) and the bytes it reads (modules
    imported) both flat for ``QUIET_SECONDS`` in which it ran ``QUIET_CPU_SECONDS`` or its
    watched memory grew by ``QUIET_GROWTH_BYTES`` (a growing process is not starved). A
    start-up imports and maps; a training loop, leaking or not, runs code it has run before
    (docs/memory-start-and-end.md, "When start-up ends"). A job that reads its data
    from files never looks settled here: its start-up ends by its shape, a step or
    ``STARTUP_MAX_CPU_SECONDS``. Where these series are read, they rule rather than the
    signal's shape: a climb slowed by a busy host looks settled while it is still importing.
    A process that loads again after such a stretch (a pause in a start-up slowed by a busy
    host) has not started: start-up resumes, until the next quiet stretch or a cap
    (``STARTUP_MAX_CPU_SECONDS``, ``STARTUP_MAX_LOADING_SECONDS``), after which it has ended
    for good.
    """

    __slots__ = (
        "_after_end",
        "_appended",
        "_capped",
        "_first_cpu",
        "_first_t",
        "_latest",
        "_level",
        "_low_cpu",
        "_low_level",
        "_rows",
        "decided_at",
        "ended_at",
    )

    def __init__(self) -> None:
        self.ended_at = math.nan
        """When start-up ended (the quiet stretch's start, or a cap); NaN: not yet, or resumed."""
        self.decided_at = math.nan
        """When that was known (the quiet stretch's end)."""
        # (time, bytes read, file-backed bytes) of the readings since the end was known, from
        # the newest one at least QUIET_SECONDS old: the base a new load is measured from
        self._after_end: deque[tuple[float, float, float]] = deque()
        self._capped = False  # past the caps: ended for good
        self._first_cpu = math.nan
        self._first_t = math.nan
        self._latest: dict[str, tuple[float, float]] = {}
        self._level = 0.0  # the watched memory's latest reading
        # (time, CPU seconds, bytes read, file-backed bytes, watched memory) of readings
        # that held all three loading series
        self._rows: deque[tuple[float, float, float, float, float]] = deque(maxlen=1024)
        # The lowest CPU time and memory level among the rows, as (row number, value) with
        # values rising: a reading that no row could be the base of costs no scan of them (a
        # process that never runs a CPU second, such as a sleep, would scan 1024 each time).
        self._appended = 0
        self._low_cpu: deque[tuple[int, float]] = deque()
        self._low_level: deque[tuple[int, float]] = deque()

    @property
    def seen(self) -> bool:
        """Whether every loading series has been read at one time at least once."""
        return not math.isnan(self._first_cpu)

    def level(self, value: float) -> None:
        """The latest reading of the memory the detector watches (RSS): a stretch in which
        it grew by ``QUIET_GROWTH_BYTES`` needs no CPU time to prove the process ran."""
        if math.isfinite(value):
            self._level = value

    def reading(self, series: str, t: float, value: float) -> None:
        """One reading of a ``LOADING_SERIES`` series."""
        if self._capped or not math.isfinite(value):
            return
        self._latest[series] = (t, value)
        if len(self._latest) < len(LOADING_SERIES):
            return
        if any(self._latest[name][0] != t for name in LOADING_SERIES):
            return
        cpu, reads, file = (self._latest[name][1] for name in LOADING_SERIES)
        if math.isnan(self._first_cpu):
            self._first_cpu, self._first_t = cpu, t
        elif (
            cpu - self._first_cpu >= STARTUP_MAX_CPU_SECONDS
            or t - self._first_t >= STARTUP_MAX_LOADING_SECONDS
        ):
            self._capped = True
            if math.isnan(self.ended_at):
                self.ended_at = self.decided_at = t
            return
        if not math.isnan(self.ended_at) and not self._loads_again(t, reads, file):
            return
        self._row(t, cpu, reads, file)

    def _loads_again(self, t: float, reads: float, file: float) -> bool:
        """Whether the process, past the quiet stretch that ended its start-up, read or
        mapped more in ``QUIET_SECONDS`` than such a stretch allows (a training loop's
        file-backed memory creeps by a few hundred KiB in as many seconds, as rarely run
        library code is first touched): then start-up resumes, its end to be found again in
        the readings from here."""
        after = self._after_end
        while len(after) > 1 and after[1][0] <= t - QUIET_SECONDS:
            after.popleft()
        _, read_then, file_then = after[0]
        after.append((t, reads, file))
        if file - file_then < QUIET_FILE_BYTES and reads - read_then < QUIET_READ_BYTES:
            return False
        self.ended_at = self.decided_at = math.nan
        after.clear()
        self._rows.clear()
        self._low_cpu.clear()
        self._low_level.clear()
        return True

    def _row(self, t: float, cpu: float, reads: float, file: float) -> None:
        """A reading of every loading series at ``t``: start-up ended at the newest row
        quiet enough before it if neither the file-backed memory nor the reads grew since."""
        rows = self._rows
        level = self._level
        rows.append((t, cpu, reads, file, level))
        first = self._appended + 1 - len(rows)  # the number of the oldest row kept
        low_cpu = _lowest(self._low_cpu, self._appended, cpu, first)
        low_level = _lowest(self._low_level, self._appended, level, first)
        self._appended += 1
        if low_cpu > cpu - QUIET_CPU_SECONDS and low_level > level - QUIET_GROWTH_BYTES:
            return  # no row is far enough below in CPU time nor in memory to be the base
        base = self._base(t, cpu, level)
        if base is None:
            return
        while rows[0] is not base:  # older rows are never a newer reading's base
            rows.popleft()
        if file - base[3] < QUIET_FILE_BYTES and reads - base[2] < QUIET_READ_BYTES:
            self.ended_at, self.decided_at = base[0], t
            self._after_end.append((t, reads, file))

    def _base(
        self, t: float, cpu: float, level: float
    ) -> tuple[float, float, float, float, float] | None:
        """The newest row at least ``QUIET_SECONDS`` and ``QUIET_CPU_SECONDS`` (or
        ``QUIET_GROWTH_BYTES`` of growth) before the reading at ``t``; None if none is."""
        for row in reversed(self._rows):
            if row[0] <= t - QUIET_SECONDS and (
                row[1] <= cpu - QUIET_CPU_SECONDS or row[4] <= level - QUIET_GROWTH_BYTES
            ):
                return row
        return None


def _lowest(low: deque[tuple[int, float]], number: int, value: float, first: int) -> float:
    """Add row ``number``'s ``value`` to ``low`` (rising values with their row numbers) and
    drop the rows before ``first``; the lowest value of the rows from ``first`` on."""
    while low and low[-1][1] >= value:
        low.pop()
    low.append((number, value))
    while low[0][0] < first:
        low.popleft()
    return low[0][1]
