"""The straggler of a synchronous data-parallel job: the rank the others wait for.

Every rank of such a job ends its step at the same all-reduce, so every rank steps at the
slowest one's pace and step times cannot tell them apart. How long each waits there for the
others can: the rank that arrives last waits least. This detector compares this rank's
share of step time waiting at its collectives (``collective_wait_share``, timed by the hook)
with its peers' (``peer_collective_wait_share{peer}``, posted by their monitors on this node:
``driftwatch.runtime.ranks``), each averaged over the newest ``WINDOW_SECONDS``, each reading
weighted by the time it stands for. This rank is
the straggler while it waits least and the peer that waits most waits ``STRAGGLER_GAP`` more
of each step, for ``SUSTAINED_SECONDS``: a one-off stall of a rank moves a minute's means by
far less, so chronic lag is told from it. Its finding says by how much it holds the others
back and what its own signals say of why (its input wait; the cause ranker adds what moved
when it began). Reasoning and figures: docs/ranks.md, "Stragglers".
"""

from __future__ import annotations

import math
from collections import deque

from driftwatch.detect import Evaluation
from driftwatch.detect.input_bound import INPUT_BOUND_SHARE, INPUT_FIXES
from driftwatch.findings import KINDS, Finding
from driftwatch.series import Sample
from driftwatch.units import clock

STRAGGLER_GAP = 0.2
"""Share of each step by which the peer that waits most waits more than this rank (0-1):
the ``DriftwatchStraggler`` rule's bar."""
WINDOW_SECONDS = 60.0
"""Newest span of readings (one per hook probe, each rank's) averaged, in seconds."""
SUSTAINED_SECONDS = 30.0
"""Time the gap must hold before this rank is named, in seconds."""
MIN_READINGS = 3
"""Readings a rank needs in the window to be compared (the first covers no time)."""
MAX_READINGS = 1024
"""Most readings kept per rank, whatever the window holds."""

OWN = "collective_wait_share"
PEERS = "peer_collective_wait_share"
INPUT = "input_wait_share"
STEP = "step_seconds"


class _Readings:
    """One rank's readings of a share over the newest ``WINDOW_SECONDS``, each standing for
    the time since the one before (a probe's reading covers the steps since the previous)."""

    __slots__ = ("values",)

    def __init__(self) -> None:
        self.values: deque[tuple[float, float, float]] = deque(maxlen=MAX_READINGS)

    def add(self, t: float, value: float) -> None:
        values = self.values
        if values and t <= values[-1][0]:
            return  # out of order or read twice
        seconds = t - values[-1][0] if values else 0.0
        values.append((t, value, seconds))

    def mean(self, now: float) -> float:
        """The time-weighted mean of the readings in the window (NaN with fewer than
        ``MIN_READINGS``)."""
        values = self.values
        while values and values[0][0] < now - WINDOW_SECONDS:
            values.popleft()
        if len(values) < MIN_READINGS:
            return math.nan
        weight = sum(seconds for _, _, seconds in values)
        if weight <= 0:
            return sum(value for _, value, _ in values) / len(values)
        return sum(value * seconds for _, value, seconds in values) / weight


class StragglerDetector:
    """This rank waits least at its collectives, by far, while its peers wait for it."""

    name = "straggling_rank"
    series = frozenset({OWN, PEERS, INPUT, STEP})

    def __init__(self) -> None:
        self._own = _Readings()
        self._peers: dict[str, _Readings] = {}
        self._input = _Readings()
        self._step = (math.nan, -math.inf)  # the newest step's seconds and time
        self._since = math.nan  # when the gap was first seen holding, this time

    def observe(self, sample: Sample) -> None:
        if not math.isfinite(sample.value):
            return
        if sample.series == OWN:
            self._own.add(sample.t, sample.value)
        elif sample.series == PEERS:
            peer = dict(sample.labels).get("peer", "?")
            self._peers.setdefault(peer, _Readings()).add(sample.t, sample.value)
        elif sample.series == INPUT:
            self._input.add(sample.t, sample.value)
        elif sample.t >= self._step[1]:
            self._step = (sample.value, sample.t)

    def evaluate(self, now: float) -> Evaluation:
        own = self._own.mean(now)
        peers = {peer: readings.mean(now) for peer, readings in self._peers.items()}
        peers = {peer: share for peer, share in peers.items() if math.isfinite(share)}
        if not (peers and math.isfinite(own)) or own > min(peers.values()):
            self._since = math.nan
            return Evaluation(0.0)
        waiting = max(peers, key=lambda peer: peers[peer])
        gap = peers[waiting] - own
        score = gap / STRAGGLER_GAP
        if gap < STRAGGLER_GAP:
            self._since = math.nan
            return Evaluation(score)
        if math.isnan(self._since):
            self._since = now
        if now - self._since < SUSTAINED_SECONDS:
            return Evaluation(score)
        return Evaluation(score, (self._finding(own, waiting, peers[waiting], now),))

    def _finding(self, own: float, waiting: str, theirs: float, now: float) -> Finding:
        gap = theirs - own
        step = self._step[0]
        evidence: dict[str, float | str] = {
            "collective_wait_share": own,
            "peer_collective_wait_share": theirs,
            "waiting_peer": waiting,
            "share_held_back": gap,
        }
        held = f"{gap:.0%} of each step"
        if math.isfinite(step):
            evidence["step_seconds"] = step
            held += f" ({gap * step * 1e3:.0f} ms of {step * 1e3:.0f})"
        text = (
            f"this rank holds back the other ranks of its job since {clock(self._since)}: it "
            f"waits at its collectives for {own:.0%} of each step while {waiting} waits "
            f"for {theirs:.0%}, so the others wait for it, about {held}. "
        )
        input_share = self._input.mean(now)
        if math.isfinite(input_share):
            evidence["input_wait_share"] = input_share
            text += f"It waits for its own input for {input_share:.0%} of each step"
            text += f" ({input_share * step * 1e3:.0f} ms)" if math.isfinite(step) else ""
        else:
            text += "Its own input wait is not measured"
        if input_share >= INPUT_BOUND_SHARE:
            text += (
                ": where the other ranks wait less for theirs, its input pipeline holds the "
                f"job back. {INPUT_FIXES}"
            )
        else:
            text += ": look at its host (CPU contention, throttling), its device and its memory."
        spec = KINDS["straggling_rank"]
        return Finding("straggling_rank", spec.severity, self._since, text, evidence)
