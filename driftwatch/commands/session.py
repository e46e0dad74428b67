"""A watch session: what surrounds the monitors of ``attach``, ``run``, ``demo``, the daemon
and the hook's own server, built once and closed in order.

A session opens the findings file, the history database and the metrics server, and makes
the monitor of each run it watches with them; ``watch_one`` adds the live view. Signal
handling is here too, so that no command installs handlers of its own.
"""

from __future__ import annotations

import os
import signal
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import FrameType, TracebackType
from typing import TextIO

from rich.console import Console
from rich.live import Live

from driftwatch.capture.capturer import capturer_for
from driftwatch.channel.env import rank_from, run_name_from
from driftwatch.channel.paths import process_channel, remove_channel
from driftwatch.commands.launch import (
    StderrPump,
    child_environment,
    exit_code,
    forwarding_signals,
    how_it_ended,
    launch,
)
from driftwatch.detect.catalog import default_engine
from driftwatch.errors import DriftwatchError, TargetGone, UsageError
from driftwatch.export.http import MetricsServer
from driftwatch.export.prometheus import metrics_app
from driftwatch.findings import Finding
from driftwatch.history.writer import DEFAULT_RETENTION, History
from driftwatch.runtime.monitor import Monitor, watch
from driftwatch.runtime.ranks import with_board
from driftwatch.runtime.snapshot import Sink, Snapshot
from driftwatch.sources import Source, default_sources
from driftwatch.target.process import Target, TargetInfo
from driftwatch.view.terminal import LiveView, PlainView, render_summary

PRINT_SLACK = 0.9
"""A plain line is printed once this share of the interval has passed since the last one."""


@contextmanager
def handling_signals(
    on_stop: Callable[[], None], on_reload: Callable[[], None] | None = None
) -> Iterator[list[int]]:
    """``SIGINT`` and ``SIGTERM`` call ``on_stop``, ``SIGHUP`` calls ``on_reload`` (when
    given); yields the list of stop signals received. The previous handlers come back."""
    received: list[int] = []

    def stop(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        on_stop()

    handlers: dict[signal.Signals, Callable[[int, FrameType | None], None]] = {
        signal.SIGINT: stop,
        signal.SIGTERM: stop,
    }
    if on_reload is not None:
        handlers[signal.SIGHUP] = lambda signum, frame: on_reload()
    previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
    try:
        yield received
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class FindingsLog:
    """``--findings``: each finding appended to the file as a JSON line, as it is reported."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._file: TextIO | None = None
        if path is not None:
            try:
                self._file = path.open("a", encoding="utf-8", buffering=1)
            except OSError as err:
                raise UsageError(
                    f"--findings {path}: cannot open for writing: {err.strerror}"
                ) from err

    def write(self, run: str, finding: Finding, rank: str = "") -> None:
        if self._file is not None:
            self._file.write(finding.to_json(run, rank) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


@dataclass(frozen=True)
class SessionOptions:
    """Where a session serves and keeps what it finds (checked)."""

    host: str
    port: int
    findings: Path | None = None
    db: Path | None = None  # None: no history
    retention: float = DEFAULT_RETENTION
    tls: ssl.SSLContext | None = None


class Session:
    """The findings file, the history and the metrics server of one ``driftwatch`` process;
    ``snapshots`` is what the server exports at each scrape; ``run``: the one run it
    watches, if it watches one."""

    def __init__(
        self,
        options: SessionOptions,
        description: str,
        snapshots: Callable[[], Iterable[Snapshot]],
        run: str | None = None,
    ) -> None:
        self._run = run
        with ExitStack() as stack:
            self.findings = FindingsLog(options.findings)
            stack.callback(self.findings.close)
            self.history = None if options.db is None else History(options.db, options.retention)
            if self.history is not None:
                stack.callback(self.history.close)
            self.server = MetricsServer(
                metrics_app(snapshots),
                options.host,
                options.port,
                description,
                options.tls,
            )
            self._closing = stack.pop_all()

    @property
    def url(self) -> str:
        return self.server.url

    def where(self) -> str:
        """Where the history and the metrics are, for a line on stderr."""
        history = "" if self.history is None else f"history in {self.history.path}; "
        return f"{history}metrics at {self.url}"

    def monitor(
        self,
        run: str,
        target: TargetInfo,
        sources: Sequence[Source],
        sinks: Sequence[Sink] = (),
        rank: str = "",
    ) -> Monitor:
        """The monitor of ``run`` (``rank`` of it, in a distributed job), reporting to the
        findings file, recording its history and publishing to ``sinks``; with a history,
        evidence is captured beside it at drift."""
        history = self.history
        capturer = None if history is None else capturer_for(history.path, target, sources)
        sources = with_board(sources, rank)
        return Monitor(
            run,
            target,
            sources,
            default_engine(),
            on_finding=partial(self.findings.write, run, rank=rank),
            recorder=None if history is None else history.recorder(run, target),
            sinks=sinks if capturer is None else [*sinks, capturer],
            annotator=capturer,
            rank=rank,
        )

    def close(self, quietly: bool = False) -> None:
        """Stop serving, then close the findings file and the history (after every run has
        handed over its rest); unless ``quietly``, say where the history is."""
        self.server.close()
        self._closing.close()
        history = self.history
        if quietly or history is None or history.failed is not None:
            return
        of, run = ("", "") if self._run is None else (f" of {self._run}", f" {self._run}")
        print(
            f"driftwatch: history{of} in {history.path} (driftwatch report --db {history.path}"
            f"{run})",
            file=sys.stderr,
        )

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close(quietly=error is not None)


@dataclass(frozen=True)
class WatchOptions:
    """What ``attach`` and ``run`` watch, and how often (checked)."""

    interval: float
    logdirs: list[Path]
    run: str | None
    rank: str | None = None


@dataclass(frozen=True)
class WatchResult:
    """How watching one run went: its monitor, why it ended (``None``: stopped) and when
    watching started."""

    monitor: Monitor
    ended: str | None
    started: float


def name_of_run(target: Target) -> tuple[str, str]:
    """The run name and rank of a process attached to: its ``$DRIFTWATCH_RUN``, else its
    script's name, and ``rank_from`` its environment (also when that may not be read: no
    rank then)."""
    try:
        environ = target.environ()
    except DriftwatchError:
        environ = {}
    return run_name_from(environ, list(target.info.command), target.info.name), rank_from(environ)


def watch_one(
    options: SessionOptions,
    run: str,
    target: TargetInfo,
    sources: Sequence[Source],
    interval: float,
    stop: threading.Event,
    rank: str = "",
) -> WatchResult:
    """Watch one run (``rank`` of it, in a distributed job) with a session of its own, the
    live view (a table on a terminal, else a plain line per ``interval``) and ``/metrics``,
    until it exits or ``stop`` is set."""
    monitor: Monitor | None = None

    def snapshots() -> list[Snapshot]:
        return [] if monitor is None else [monitor.snapshot]

    with Session(options, f"watching {run}", snapshots, run) as session, ExitStack() as stack:
        view = _view(stack, session.url, interval)
        monitor = session.monitor(run, target, sources, [view], rank)
        print(f"driftwatch: watching {run} (pid {target.pid}); {session.where()}", file=sys.stderr)
        started = time.time()
        ended = watch(monitor, interval, stop)
    return WatchResult(monitor, ended, started)


def _view(stack: ExitStack, url: str, interval: float) -> Sink:
    """A table on a terminal, else a plain line per ``interval``."""
    console = Console()
    if console.is_terminal:
        return LiveView(stack.enter_context(Live(console=console, auto_refresh=False)), url)
    return PlainView(interval * PRINT_SLACK)


def watch_job(
    command: list[str],
    watch: WatchOptions,
    serve: SessionOptions,
    hook: bool,
    cpu_allocator_stats: bool,
) -> int:
    """Start ``command``, watch it until it exits, print the summary; its exit code."""
    run_name = watch.run or run_name_from(os.environ, command, Path(command[0]).name)
    rank = watch.rank or rank_from(os.environ)
    env = child_environment(dict(os.environ), hook, run_name, rank)
    if cpu_allocator_stats:
        env["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
    child = launch(command, env)
    assert child.stderr is not None
    pump = StderrPump(child.stderr, sys.stderr.buffer)
    with forwarding_signals(child):
        try:
            target = Target.attach(child.pid)
            sources = [*default_sources(target, watch.logdirs), pump]
            watched = watch_one(
                serve, run_name, target.info, sources, watch.interval, threading.Event(), rank
            )
        except TargetGone:  # it finished before driftwatch could start watching
            child.wait()
            pump.close()
            return exit_code(child.returncode)
        child.wait()
    # The job is gone: its channel has no reader left to serve.
    remove_channel(process_channel(child.pid, target.info.create_time, env, target.info.uid))
    print_summary(watched, how_it_ended(child.pid, child.returncode))
    return exit_code(child.returncode)


def print_summary(watched: WatchResult, ended: str) -> None:
    """Print what ``watched`` found, and why it ended."""
    monitor = watched.monitor
    print(render_summary(monitor.snapshot, monitor.reported.values(), ended, watched.started))
