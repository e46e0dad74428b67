"""The daemon's configuration: its TOML file (docs/daemon.md) and the command line's options."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from driftwatch.errors import UsageError
from driftwatch.runtime.monitor import check_interval

DEFAULT_INTERVAL = 2.0
"""Seconds between two discoveries, and between two samples of a settled target."""


@dataclass(frozen=True, slots=True)
class Rule:
    """Watch processes whose command line ``pattern`` finds, with these TensorBoard logdirs."""

    pattern: re.Pattern[str]
    logdirs: tuple[Path, ...] = ()


@dataclass(frozen=True, slots=True)
class Config:
    """What the daemon does; re-read from its sources on ``SIGHUP``."""

    interval: float = DEFAULT_INTERVAL
    rules: tuple[Rule, ...] = ()
    channel_dirs: tuple[Path, ...] = ()
    """Directories with hook channels beyond the usual per-user ones."""

    def rule_for(self, command: str) -> Rule | None:
        """The first rule whose pattern finds ``command``."""
        return next((rule for rule in self.rules if rule.pattern.search(command)), None)


def _compile(pattern: str, where: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as err:
        raise UsageError(f"{where}: bad regular expression {pattern!r}: {err}") from err


def _paths(value: object, where: str) -> tuple[Path, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise UsageError(f"{where}: expected a list of paths")
    return tuple(Path(item) for item in value)


def _check_keys(table: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise UsageError(
            f"{where}: unknown key {unknown[0]!r} (expected {', '.join(sorted(allowed))})"
        )


def _read_config_file(path: Path) -> Config:
    """Parse the TOML configuration file (docs/daemon.md); ``UsageError`` saying what is wrong."""
    try:
        with path.open("rb") as file:
            table = tomllib.load(file)
    except OSError as err:
        raise UsageError(f"--config {path}: cannot read it: {err.strerror}") from err
    except tomllib.TOMLDecodeError as err:
        raise UsageError(f"--config {path}: not valid TOML: {err}") from err
    _check_keys(table, {"interval", "channel_dirs", "match"}, str(path))
    interval = table.get("interval", DEFAULT_INTERVAL)
    if not isinstance(interval, (int, float)) or isinstance(interval, bool):
        raise UsageError(f"{path}: interval must be a number of seconds")
    matches = table.get("match", [])
    if not isinstance(matches, list) or not all(isinstance(m, dict) for m in matches):
        raise UsageError(f"{path}: match must be an array of tables ([[match]])")
    rules = []
    for number, match in enumerate(matches, 1):
        where = f"{path}: match #{number}"
        _check_keys(match, {"pattern", "logdirs"}, where)
        if not isinstance(match.get("pattern"), str):
            raise UsageError(f"{where}: needs a pattern (a regular expression)")
        rules.append(
            Rule(_compile(match["pattern"], where), _paths(match.get("logdirs", []), where))
        )
    return Config(
        check_interval(float(interval), f"{path}: interval"),
        tuple(rules),
        _paths(table.get("channel_dirs", []), f"{path}: channel_dirs"),
    )


def load_config(
    path: Path | None, matches: Sequence[str] = (), interval: float | None = None
) -> Config:
    """The configuration file at ``path`` (if any) plus the command line's options.

    ``--match`` patterns add to the file's rules; ``--interval`` overrides the file's.
    """
    config = _read_config_file(path) if path is not None else Config()
    rules = tuple(Rule(_compile(m, "--match")) for m in matches) + config.rules
    return Config(
        config.interval if interval is None else check_interval(interval),
        rules,
        config.channel_dirs,
    )
