"""The other ranks of a distributed job on this node, as their monitors post them.

A straggler shows only across ranks: every rank of a synchronous data-parallel job steps at
the slowest one's pace, and what tells them apart is how long each waits at its collectives
for the others (``collective_wait_share``). Each rank's monitor posts its newest reading to
a file of its own, ``ranks/RUN/RANK`` beside the hooks' channels (the runtime directory its
target's hook uses), and reads its peers' there as ``peer_collective_wait_share{rank}``, which
``driftwatch.detect.ranks`` compares with its own. Ranks under ``driftwatch run`` each, and
those of one daemon, so meet on their node; ranks on other nodes are compared by Prometheus
(the ``DriftwatchStraggler`` rule). Reasoning: docs/ranks.md, "Stragglers".
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path
from urllib.parse import quote, unquote

from driftwatch.errors import SourceUnavailable
from driftwatch.runtime.snapshot import Snapshot
from driftwatch.series import Sample
from driftwatch.sources import Source
from driftwatch.sources.hook import HookSource

log = logging.getLogger(__name__)

POSTED = {"collective_wait_share": "peer_collective_wait_share"}
"""The series a rank posts, and the series its peers read it as."""
STALE_SECONDS = 60.0
"""A peer's post older than this, in seconds, is not read: that rank has ended or hangs."""


class RankBoard:
    """Posts this run's newest readings of ``POSTED`` under ``root``/RUN/RANK after each tick
    (``post``, from the snapshot: its run and rank) and reads its peers' as samples
    (``sample``, a source's read); posts nothing for a process without a rank."""

    name = "ranks"

    def __init__(self, root: Path) -> None:
        self._root = root
        self._mine: Path | None = None  # this rank's file, once it has posted
        self._posting = True  # until a post fails (said once)
        self._posted: dict[str, float] = {}  # the time of the newest reading posted, by series
        self._read: dict[tuple[str, str], float] = {}  # newest time read, by (peer, series)

    def post(self, snapshot: Snapshot) -> None:
        """Write this rank's newest reading of each posted series, once one came since the
        previous post (a file replaced whole: a reader never sees half of it)."""
        if not (snapshot.rank and self._posting):
            return
        newest: dict[str, tuple[float, float]] = {}
        for series in POSTED:
            history = snapshot.store.get((series, ()))
            latest = None if history is None else history.latest()
            if latest is not None:
                newest[series] = latest
        if all(tv[0] <= self._posted.get(s, -math.inf) for s, tv in newest.items()):
            return
        if self._mine is None:
            self._mine = self._root / quote(snapshot.run, safe="") / quote(snapshot.rank, safe="")
        try:
            self._mine.parent.mkdir(parents=True, exist_ok=True)
            partial = self._mine.with_name(f".{self._mine.name}.{os.getpid()}")
            partial.write_text(json.dumps({s: list(tv) for s, tv in newest.items()}))
            partial.replace(self._mine)
        except OSError as err:  # the others go without this rank: said once
            log.warning("driftwatch: cannot post this rank's readings in %s: %s", self._root, err)
            self._posting = False
            return
        self._posted.update({series: tv[0] for series, tv in newest.items()})

    def sample(self, now: float) -> list[Sample]:
        """The readings the other ranks posted since the previous read, each at its own time;
        none until this rank has posted (it knows its run and rank then)."""
        if self._mine is None:
            return []
        try:
            posts = [p for p in self._mine.parent.iterdir() if not p.name.startswith(".")]
        except FileNotFoundError:
            return []
        except OSError as err:
            raise SourceUnavailable(f"cannot read the other ranks' posts: {err}") from err
        samples: list[Sample] = []
        for path in posts:
            if path == self._mine:
                continue
            samples += self._peer_samples(path, now)
        return samples

    def _peer_samples(self, path: Path, now: float) -> list[Sample]:
        """The new readings of one peer's post (none from a post that went, is stale or is
        not one of ours)."""
        try:
            readings = json.loads(path.read_text())
            posted = {s: (float(readings[s][0]), float(readings[s][1])) for s in POSTED}
        except (OSError, ValueError, LookupError, TypeError):
            return []  # removed as its rank ended, or not one of ours
        peer = unquote(path.name)
        samples = []
        for series, (t, value) in posted.items():
            key = (peer, series)
            if now - t <= STALE_SECONDS and t > self._read.get(key, -math.inf):
                self._read[key] = t
                samples.append(Sample(POSTED[series], value, t, (("peer", peer),)))
        return samples

    def close(self) -> None:
        """Take this rank's post away: it has ended (a post that cannot be removed goes
        stale)."""
        if self._mine is not None:
            with suppress(OSError):
                self._mine.unlink(missing_ok=True)


def with_board(sources: Sequence[Source], rank: str) -> list[Source]:
    """``sources``, and for a rank of a distributed job the board of the ranks whose hooks
    keep their channels beside its hook's."""
    hooks = [source for source in sources if isinstance(source, HookSource)]
    if not (rank and hooks):
        return list(sources)
    return [*sources, RankBoard(hooks[0].path.parent / "ranks")]
