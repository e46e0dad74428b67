"""Consecutive fixed-width windows of one series: their means, floors and reading counts.

The memory detectors judge each signal's windows at several widths; the event-file detector
judges a file's size the same way.
"""

from __future__ import annotations

import math
from collections import deque


class WindowMeans:
    """Consecutive fixed-width windows of one series: the newest ``points`` means and floors.

    A window's floor is its lowest reading. Memory that is garbage-collected, or a probe
    that lands mid-step and sees activations on top, lifts the mean of some windows but not
    their floors, while memory that is kept (a leak) lifts every floor: trends and jumps are
    judged on floors, levels and limits on means. A floor says this only of windows that hold
    several readings: ``readings`` counts them.
    """

    __slots__ = (
        "_count",
        "_floor",
        "_start",
        "_sum",
        "floors",
        "means",
        "readings",
        "version",
        "width",
    )

    def __init__(self, width: float, points: int) -> None:
        self.width = width
        self.means: deque[tuple[float, float]] = deque(maxlen=points)  # (window start, mean)
        self.floors: deque[float] = deque(maxlen=points)  # the same windows' lowest readings
        self.readings: deque[int] = deque(maxlen=points)  # and how many readings they hold
        self.version = 0  # counts closed windows: analyses of ``means`` can be cached on it
        self._start = math.nan
        self._sum = 0.0
        self._floor = math.inf
        self._count = 0

    def add(self, t: float, value: float) -> None:
        if not math.isfinite(value):
            return
        start = math.floor(t / self.width) * self.width
        if start > self._start or math.isnan(self._start):
            if self._count:
                self.means.append((self._start, self._sum / self._count))
                self.floors.append(self._floor)
                self.readings.append(self._count)
                self.version += 1
            self._start, self._sum, self._floor, self._count = start, 0.0, math.inf, 0
        self._sum += value
        self._floor = min(self._floor, value)
        self._count += 1

    @property
    def open_is_full(self) -> bool:
        """Whether the window still filling holds as many readings as the last closed one:
        its floor is as good as final (the next reading closes it)."""
        return bool(self.readings) and self._count >= self.readings[-1]

    def windows(self, *, with_open: bool = False) -> list[tuple[float, float, float, int]]:
        """(start, mean, floor, readings) of the kept windows, oldest first; ``with_open``:
        the window still filling too (a run that ended will close it no more)."""
        closed = [
            (t, mean, floor, count)
            for (t, mean), floor, count in zip(self.means, self.floors, self.readings, strict=True)
        ]
        if with_open and self._count:
            closed.append((self._start, self._sum / self._count, self._floor, self._count))
        return closed
