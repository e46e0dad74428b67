"""Host source: what the machine does to the target, to tell "the job got slower" from "the
machine got busier": its cgroup's CPU throttling (``cpu.stat``) and the node's pressure-stall
information (``/proc/pressure/{cpu,io,memory}``).

Either reading may be missing here (a kernel without PSI, a cgroup without the CPU controller,
a container that cannot see them): that reading is switched off with one quiet log line and
the other carries on; only when both are missing is the source off. A cgroup without a CPU
quota cannot be throttled: its counters are stored only once a quota is set.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable
from pathlib import Path

from driftwatch.errors import SourceUnavailable
from driftwatch.series import Sample

log = logging.getLogger(__name__)

PRESSURE_DIR = Path("/proc/pressure")
"""Where the kernel publishes the node's pressure-stall information (Linux 4.20+, CONFIG_PSI)."""
PRESSURE_RESOURCES = ("cpu", "io", "memory")
"""The resources whose stalls are read, each a file of ``PRESSURE_DIR``."""
MICROSECONDS = 1e-6
"""Seconds per microsecond: PSI totals and cgroup v2 ``throttled_usec`` count these."""
NANOSECONDS = 1e-9
"""Seconds per nanosecond: cgroup v1 ``throttled_time`` counts these."""
READ_INTERVAL_SECONDS = 5.0
"""Least time between two readings in seconds, however often the target is sampled."""
PRESSURE_SHARE_SECONDS = 1.0
"""Seconds for which a ``NodePressure`` reading serves every target sampled after it: the
files are the node's, the same for all of a daemon's targets."""
QUOTA_LOOKUP_SECONDS = 60.0
"""Seconds between two looks for a CPU quota on the target's cgroups while none is set."""

_ESCAPE = re.compile(r"\\([0-7]{3})")
_PRESSURE_LINE = re.compile(r"^(some|full)\s.*\btotal=(\d+)\s*$")


def _unescape(field: str) -> str:
    """A path field of ``mountinfo``, whose spaces and tabs the kernel writes as ``\\040``."""
    return _ESCAPE.sub(lambda match: chr(int(match.group(1), 8)), field)


def cgroup_directory(cgroup: str, mountinfo: str, controller: str) -> tuple[Path, Path] | None:
    """Where the hierarchy holding ``controller`` is mounted here, and the directory of a
    process's cgroup in it, from the process's ``/proc/PID/cgroup`` and this process's
    ``/proc/self/mountinfo``; None if it is not mounted here.

    A cgroup v1 hierarchy that carries ``controller`` wins over the v2 one (on a hybrid
    machine the v2 hierarchy has no CPU controller). A mount of a subtree (a container's
    ``/sys/fs/cgroup`` without a cgroup namespace) is followed: its mount root is taken off
    the process's path.
    """
    paths: dict[str, str] = {}  # "v1" or "v2" -> the process's path in that hierarchy
    for line in cgroup.splitlines():
        if line.count(":") < 2:
            continue
        number, controllers, path = line.split(":", 2)
        if number == "0" and controllers == "":
            paths.setdefault("v2", path)
        elif controller in controllers.split(","):
            paths["v1"] = path
    found: dict[str, tuple[Path, Path]] = {}
    for line in mountinfo.splitlines():
        fields, _, tail = line.partition(" - ")
        parts, described = fields.split(), tail.split()
        if len(parts) < 5 or len(described) < 3:
            continue
        root, point = _unescape(parts[3]), _unescape(parts[4])
        version = {"cgroup": "v1", "cgroup2": "v2"}.get(described[0])
        if version == "v1" and controller not in described[2].split(","):
            continue
        if version is None or version not in paths or version in found:
            continue
        inside = Path(paths[version])
        if root != "/" and inside.is_relative_to(root):
            inside = inside.relative_to(root)
        found[version] = (Path(point), Path(point) / str(inside).lstrip("/"))
    return found.get("v1", found.get("v2"))


CPU_STAT_FIELDS = {
    "nr_periods": ("cgroup_cpu_periods", 1.0),
    "nr_throttled": ("cgroup_cpu_throttled_periods", 1.0),
    "throttled_usec": ("cgroup_cpu_throttled_seconds", MICROSECONDS),  # cgroup v2
    "throttled_time": ("cgroup_cpu_throttled_seconds", NANOSECONDS),  # cgroup v1
}
"""The throttling fields of ``cpu.stat`` (either version): the series each feeds, and the
factor that turns it into the series' unit."""


def parse_cpu_stat(text: str) -> dict[str, float]:
    """The throttling counters of a cgroup's ``cpu.stat`` (v1 or v2) by series; empty when it
    has none (a v2 cgroup whose CPU controller is not enabled reports usage only)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in CPU_STAT_FIELDS and value.strip().isdigit():
            series, factor = CPU_STAT_FIELDS[name]
            values[series] = int(value) * factor
    return values


def quota_set(directory: Path) -> bool:
    """Whether the cgroup at ``directory`` has a CPU bandwidth limit (quota) of its own."""
    for name in ("cpu.max", "cpu.cfs_quota_us"):  # v2, v1
        try:
            text = (directory / name).read_text()
        except OSError:
            continue
        quota = text.split()[0] if text.split() else "max"
        return quota not in ("max", "-1")
    return False


def counting_cgroups(directory: Path, top: Path) -> list[Path]:
    """``directory`` and its ancestors up to ``top`` whose ``cpu.stat`` has throttling
    counters, nearest first. Each counts only the throttling of its own quota: a pod's quota
    throttles its container while the container's counters stay at 0."""
    levels = [directory, *(p for p in directory.parents if p.is_relative_to(top))]
    found = []
    for level in levels:
        try:
            if parse_cpu_stat((level / "cpu.stat").read_text()):
                found.append(level)
        except OSError:
            continue
    return found


def parse_pressure(text: str) -> dict[str, float]:
    """The stalled time since boot in seconds of a ``/proc/pressure/*`` file, by line kind
    (``some``, and ``full`` where the kernel writes it); lines it does not recognise are left
    out. Its ``avg10``/``avg60``/``avg300`` averages are not read: rates of the totals give the
    same over any window."""
    found = {}
    for line in text.splitlines():
        match = _PRESSURE_LINE.match(line.strip())
        if match:
            found[match.group(1)] = int(match.group(2)) * MICROSECONDS
    return found


class NodePressure:
    """The node's pressure files, each read once for every target sampled within
    ``share_seconds`` (``time.monotonic``) of the first: a daemon's targets, sampled one
    after another, share one reading (0: each target reads them itself)."""

    def __init__(
        self,
        pressure_dir: Path = PRESSURE_DIR,
        share_seconds: float = PRESSURE_SHARE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory = pressure_dir
        self._share_seconds = share_seconds
        self._clock = clock
        self._texts: dict[str, str | OSError] = {}
        self._read_at = -math.inf

    def text(self, resource: str) -> str:
        """The file of ``resource``, as read within ``share_seconds``; its ``OSError`` if it
        could not be read."""
        now = self._clock()
        if not now - self._read_at < self._share_seconds:
            self._texts, self._read_at = {}, now
        held = self._texts.get(resource)
        if held is None:
            try:
                held = (self.directory / resource).read_text()
            except OSError as err:
                held = err
            self._texts[resource] = held
        if isinstance(held, OSError):
            raise held
        return held


class HostSource:
    """The target's cgroup CPU throttling and the node's pressure stalls, as counters.

    ``pressure``: the node's pressure files as a daemon shares them among its targets
    (default: read by this source alone, from ``pressure_dir``)."""

    name = "host"

    def __init__(
        self,
        pid: int,
        pressure_dir: Path = PRESSURE_DIR,
        proc: Path = Path("/proc"),
        interval: float = READ_INTERVAL_SECONDS,
        pressure: NodePressure | None = None,
    ) -> None:
        self.pid = pid
        self._interval = interval
        self._read_at = -math.inf
        self._node = pressure if pressure is not None else NodePressure(pressure_dir, 0.0)
        self._pressure_dir = self._node.directory
        self._proc = proc
        self._pressure_on = True
        self._cpu_stat: Path | None = None
        self._cpu_stat_on = True
        self._quota_looked_at = -math.inf
        self._no_quota_logged = False

    def sample(self, now: float) -> list[Sample]:
        if now - self._read_at < self._interval:
            return []
        self._read_at = now
        samples = self._throttling(now) + self._pressure(now)
        if not (self._pressure_on or self._cpu_stat_on):
            raise SourceUnavailable(
                "neither the node's pressure-stall information nor the target's cgroup "
                "cpu.stat can be read here: host contention is not monitored"
            )
        return samples

    def _off(self, what: str, why: str) -> None:
        log.info("%s not monitored: %s", what, why)

    def _throttling(self, now: float) -> list[Sample]:
        if not self._cpu_stat_on:
            return []
        if self._cpu_stat is None:
            if now - self._quota_looked_at < QUOTA_LOOKUP_SECONDS:
                return []
            self._quota_looked_at = now
            self._cpu_stat = self._find_cpu_stat()
            if self._cpu_stat is None:
                return []
        try:
            values = parse_cpu_stat(self._cpu_stat.read_text())
        except OSError as err:  # the cgroup was removed (the job's container ended)
            self._cpu_stat_on = False
            self._off("CPU throttling", f"{self._cpu_stat}: {err.strerror}")
            return []
        return [Sample(series, value, now) for series, value in values.items()]

    def _find_cpu_stat(self) -> Path | None:
        """The ``cpu.stat`` of the nearest of the target's cgroups with a CPU quota; None
        while none has one (nothing can throttle it: no counters worth storing)."""
        try:
            cgroup = (self._proc / str(self.pid) / "cgroup").read_text()
            mountinfo = (self._proc / "self" / "mountinfo").read_text()
        except OSError as err:
            self._cpu_stat_on = False
            self._off("CPU throttling", f"its cgroup cannot be read ({err.strerror})")
            return None
        located = cgroup_directory(cgroup, mountinfo, "cpu")
        levels = [] if located is None else counting_cgroups(located[1], located[0])
        if not levels:
            self._cpu_stat_on = False
            self._off(
                "CPU throttling",
                "no cpu.stat with throttling counters for the target's cgroup "
                "(no CPU controller mounted or enabled, or not visible here)",
            )
            return None
        found = next((level / "cpu.stat" for level in levels if quota_set(level)), None)
        if found is None and not self._no_quota_logged:
            self._no_quota_logged = True
            self._off(
                "CPU throttling",
                f"no CPU quota on the target's cgroup or its ancestors ({levels[0]}): nothing "
                f"throttles it (looked for again every {QUOTA_LOOKUP_SECONDS:.0f} s)",
            )
        return found

    def _pressure(self, now: float) -> list[Sample]:
        if not self._pressure_on:
            return []
        samples = []
        for resource in PRESSURE_RESOURCES:
            path = self._pressure_dir / resource
            try:
                lines = parse_pressure(self._node.text(resource))
            except OSError as err:  # no CONFIG_PSI, psi=0 on the kernel command line
                if resource == PRESSURE_RESOURCES[0]:
                    self._pressure_on = False
                    self._off("pressure-stall information", f"{path}: {err.strerror}")
                    return []
                continue
            labels = (("resource", resource),)
            if resource == "cpu":
                lines.pop("full", None)  # the kernel writes zeros there for the whole node
            for kind, seconds in lines.items():
                samples.append(Sample(f"pressure_{kind}_seconds", seconds, now, labels))
        return samples

    def close(self) -> None:
        """Nothing to release: every file is opened and closed within a reading."""


def describe(
    pid: int | str = "self", pressure_dir: Path = PRESSURE_DIR, proc: Path = Path("/proc")
) -> tuple[bool, str]:
    """For ``driftwatch doctor``: whether host contention can be read here, for a process in
    the cgroup of ``pid`` (this process's by default): the cgroup version and its CPU
    throttling counters and quota, and the node's pressure-stall information."""
    present = [r for r in PRESSURE_RESOURCES if (pressure_dir / r).is_file()]
    psi = (
        f"pressure stalls (PSI) of {', '.join(present)}"
        if present
        else f"no pressure-stall information ({pressure_dir} missing: kernel before 4.20, "
        "or CONFIG_PSI off / psi=0)"
    )
    try:
        cgroup = (proc / str(pid) / "cgroup").read_text()
        mountinfo = (proc / "self" / "mountinfo").read_text()
    except OSError as err:
        return bool(present), f"{psi}; the cgroup cannot be read ({err.strerror})"
    located = cgroup_directory(cgroup, mountinfo, "cpu")
    if located is None:
        return bool(present), f"{psi}; no cgroup CPU controller mounted here: no throttling"
    mount, directory = located
    version = "v2" if (mount / "cgroup.controllers").is_file() else "v1"
    levels = counting_cgroups(directory, mount)
    if not levels:
        throttling = f"cgroup {version} at {mount}, without throttling counters: no throttling"
    else:
        quota = next((level for level in levels if quota_set(level)), None)
        throttling = f"cgroup {version} CPU throttling counters readable" + (
            f", CPU quota at {quota}"
            if quota is not None
            else " (no CPU quota here: nothing throttles a job in this cgroup)"
        )
    return bool(present) or bool(levels), f"{psi}; {throttling}"
