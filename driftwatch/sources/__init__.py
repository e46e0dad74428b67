"""Sources turn the outside world into ``Sample``s for one target.

A source raises ``TargetGone`` when the target is gone (monitoring ends) and
``SourceUnavailable`` when it cannot work here (that source is switched off, once, with its
reason; the others carry on). Every other foreign exception is translated inside the source.
"""

from __future__ import annotations

from typing import Protocol

from driftwatch.series import Sample


class Source(Protocol):
    name: str

    def sample(self, now: float) -> list[Sample]:
        """Read the current values; ``now`` is the wall-clock time stamped on them."""
        ...

    def close(self) -> None:
        """Release files and handles; called once when monitoring ends."""
        ...
