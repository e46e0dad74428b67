"""What a process's open descriptors point to, grouped so that a leak shows as one line:
files of one directory told apart only by the numbers in their names (``batch-17.log``,
``batch-18.log``) are one group, as are sockets, pipes and each kind of anonymous inode.
Read from ``/proc/PID/fd``, which needs what ``attach`` needs (the same user, or root).
"""

from __future__ import annotations

import os
import re
from collections import Counter

from driftwatch.errors import CaptureUnavailable, TargetGone

DESCRIPTOR_GROUPS = 20
"""Groups a listing names, the largest first; the rest are counted together."""
_NUMBERS = re.compile(r"\d+")


def descriptor_group(target: str) -> str:
    """The group of a descriptor's target: the digits of a file's name (not of its
    directory) as ``*`` (``/run/7/logs/batch-*.log``), of any other target all of them
    (``socket:[*]``)."""
    if target.startswith("/"):
        directory, name = os.path.split(target)
        return os.path.join(directory, _NUMBERS.sub("*", name))
    return _NUMBERS.sub("*", target)


def _targets(pid: int) -> list[str]:
    """What each open descriptor of ``pid`` points to (those closed while read are left
    out)."""
    directory = f"/proc/{pid}/fd"
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, ProcessLookupError) as err:
        raise TargetGone(pid, f"process {pid} is gone") from err
    except OSError as err:
        raise CaptureUnavailable(f"no descriptor listing of process {pid}: {err}") from err
    targets = []
    for name in names:
        try:
            targets.append(os.readlink(f"{directory}/{name}"))
        except OSError:
            continue
    return targets


def describe_descriptors(pid: int) -> str:
    """The open descriptors of ``pid`` by group, the largest first, each with an example."""
    targets = _targets(pid)
    groups = Counter(descriptor_group(t) for t in targets)
    examples: dict[str, str] = {}
    for target in targets:
        examples.setdefault(descriptor_group(target), target)
    lines = [
        f"Open descriptors of process {pid}: {len(targets):,}, by what they point to "
        "(numbers as *):"
    ]
    for group, count in groups.most_common(DESCRIPTOR_GROUPS):
        example = examples[group]
        shown = f"{group}  (e.g. {example})" if example != group else group
        lines.append(f"{count:>9,}  {shown}")
    rest = sum(groups.values()) - sum(c for _, c in groups.most_common(DESCRIPTOR_GROUPS))
    if rest:
        lines.append(f"{rest:>9,}  in {len(groups) - DESCRIPTOR_GROUPS:,} smaller groups")
    return "\n".join(lines) + "\n"
