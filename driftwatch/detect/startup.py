"""When a memory signal's start-up climb (imports, model building, tracing) ended, from its
shape alone. Reasoning and experiments: docs/detectors.md, "Start-up, from the signal's own
shape".
"""

from __future__ import annotations

import math
import statistics

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
    lumpy climb. Growth from the first of them on is judged (docs/detectors.md).
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
