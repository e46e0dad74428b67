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
