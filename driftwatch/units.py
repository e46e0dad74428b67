"""Numbers as people read them, in messages and views."""

from __future__ import annotations

import math
import time


def human_bytes(value: float) -> str:
    """``1.5 GiB``; ``-`` when unknown."""
    if not math.isfinite(value):
        return "-"
    sign = "-" if value < 0 else ""
    value = abs(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{sign}{value:.0f} {unit}" if unit == "B" else f"{sign}{value:.1f} {unit}"
        value /= 1024
    return f"{sign}{value:.1f} TiB"


PER_MINUTE_BELOW = 1.0
"""Growth, in items per second, under which a count's rate is told per minute."""
PER_HOUR_BELOW = 1.0 / 60
"""Growth, in items per second, under which it is told per hour."""


def human_count(value: float) -> str:
    """A count as read: ``4,552``; ``-`` when unknown."""
    return f"{value:,.0f}" if math.isfinite(value) else "-"


def count_rate(slope: float) -> str:
    """A count's growth, given in items a second, per second, minute or hour: ``300/s``,
    ``12/min``, ``5.2/h``; ``-`` when unknown."""
    if not math.isfinite(slope):
        return "-"
    if abs(slope) >= PER_MINUTE_BELOW:
        return f"{slope:,.3g}/s"
    if abs(slope) >= PER_HOUR_BELOW:
        return f"{slope * 60:.3g}/min"
    return f"{slope * 3600:.3g}/h"


def human_seconds(value: float) -> str:
    """``12.3 ms``, ``4.2 s``, ``17.0 min``, ``5.1 h``, ``3.2 days``; ``-`` when unknown."""
    if not math.isfinite(value):
        return "-"
    if value < 1:
        return f"{value * 1000:.1f} ms"
    if value < 120:
        return f"{value:.1f} s"
    if value < 7200:
        return f"{value / 60:.1f} min"
    if value < 172800:
        return f"{value / 3600:.1f} h"
    return f"{value / 86400:.1f} days"


def clock(t: float) -> str:
    """The local time of day of a unix time, ``14:03:27``."""
    return time.strftime("%H:%M:%S", time.localtime(t))


MIB = 1 << 20
"""Bytes in a mebibyte."""
DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_duration(text: str) -> float:
    """Seconds in ``90s``, ``30m``, ``12h``, ``28d`` or ``4w``; ``ValueError`` otherwise."""
    number, unit = text[:-1], text[-1:]
    if unit not in DURATION_UNITS:
        raise ValueError(f"{text!r} needs a unit: s, m, h, d or w (e.g. 28d)")
    seconds = float(number) * DURATION_UNITS[unit]
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"{text!r} is not a positive duration")
    return seconds


def local_time(t: float) -> str:
    """The local date and time of a unix time, ``2025-06-01 14:03:27``."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def local_clock(t: float, day_of: float) -> str:
    """The local time of a unix time, ``14:03:27``, with its date first where it is not the
    day of ``day_of`` (``2025-06-02 00:03:27``)."""
    local = time.localtime(t)
    if local[:3] == time.localtime(day_of)[:3]:
        return time.strftime("%H:%M:%S", local)
    return local_time(t)


RATE_UNITS = ((3600.0, "h", "hour"), (60.0, "min", "minute"), (1.0, "s", "second"))
"""The units a rate is stated in: seconds in each, its symbol and its name."""


def rate_unit(span: float) -> tuple[float, str, str]:
    """The unit to state a rate seen over ``span`` seconds in: the longest that fits in the
    span, so that a few minutes' trend is not stated as thousands of percent an hour."""
    for unit in RATE_UNITS:
        if span >= unit[0]:
            return unit
    return RATE_UNITS[-1]
