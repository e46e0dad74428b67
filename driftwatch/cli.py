"""The ``driftwatch`` command: wiring only; the logic lives in the modules it calls."""

from __future__ import annotations

import logging
import math
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import FrameType
from typing import Annotated, TextIO

import typer
from rich.console import Console
from rich.live import Live

from driftwatch import __version__
from driftwatch.detect.basic import NonFiniteDetector, StallDetector
from driftwatch.doctor import run_checks
from driftwatch.errors import DriftwatchError, UsageError
from driftwatch.export.http import DEFAULT_HOST, DEFAULT_PORT, MetricsServer, parse_listen
from driftwatch.export.prometheus import metrics_app
from driftwatch.findings import Finding
from driftwatch.monitor import Monitor, Snapshot, watch
from driftwatch.sources.eventfiles import EventFileSource
from driftwatch.sources.nvml import NvmlSource
from driftwatch.sources.process import ProcessSource
from driftwatch.target import Target, default_run_name
from driftwatch.view import live_table, plain_line, summary

app = typer.Typer(
    name="driftwatch",
    help="Watch long TensorFlow/Keras training runs and say early when they drift.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

MIN_INTERVAL, MAX_INTERVAL = 0.05, 3600.0
EXIT_INTERRUPTED = 130


def _version(value: bool) -> None:
    if value:
        print(f"driftwatch {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Watch long TensorFlow/Keras training runs and say early when they drift."""


def _check_interval(interval: float) -> float:
    if not math.isfinite(interval) or not MIN_INTERVAL <= interval <= MAX_INTERVAL:
        raise UsageError(
            f"--interval {interval}: must be between {MIN_INTERVAL} and {MAX_INTERVAL:.0f} seconds"
        )
    return interval


def _check_logdirs(logdirs: list[Path]) -> list[Path]:
    for logdir in logdirs:
        if not logdir.is_dir():
            raise UsageError(f"--logdir {logdir}: no such directory")
    return logdirs


def _open_findings(path: Path) -> TextIO:
    try:
        return path.open("a", encoding="utf-8", buffering=1)
    except OSError as err:
        raise UsageError(f"--findings {path}: cannot open for writing: {err.strerror}") from err


@contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[dict[str, int]]:
    """Set ``stop`` on SIGINT/SIGTERM; yields a dict that records which signal arrived."""
    received: dict[str, int] = {}

    def handler(signum: int, frame: FrameType | None) -> None:
        received["signal"] = signum
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@app.command()
def attach(
    pid: Annotated[int, typer.Argument(help="PID of the training process to watch.")],
    interval: Annotated[float, typer.Option(help="Seconds between samples.")] = 2.0,
    listen: Annotated[
        str, typer.Option(help="HOST:PORT for /metrics (port 0: any free port).")
    ] = f"{DEFAULT_HOST}:{DEFAULT_PORT}",
    logdir: Annotated[
        list[Path] | None,
        typer.Option(help="TensorBoard log directory to watch (repeatable)."),
    ] = None,
    findings: Annotated[
        Path | None, typer.Option(help="Append findings to this file as JSON lines.")
    ] = None,
    run: Annotated[
        str | None, typer.Option(help="Run name for labels (default: the script's name).")
    ] = None,
) -> None:
    """Watch a running process that was started without driftwatch."""
    interval = _check_interval(interval)
    host, port = parse_listen(listen)
    logdirs = _check_logdirs(logdir or [])
    target = Target.attach(pid)
    run_name = run or default_run_name(list(target.info.command), target.info.name)
    console = Console()
    stop = threading.Event()

    with ExitStack() as stack:
        findings_file = stack.enter_context(_open_findings(findings)) if findings else None

        def report(finding: Finding) -> None:
            if findings_file is not None:
                findings_file.write(finding.to_json(run_name) + "\n")

        monitor = Monitor(
            run_name,
            target.info,
            [
                ProcessSource(target),
                EventFileSource(logdirs, target.open_paths),
                NvmlSource(target.pid),
            ],
            [NonFiniteDetector(), StallDetector()],
            on_finding=report,
        )
        server = MetricsServer(
            metrics_app(lambda: [monitor.snapshot]), host, port, f"watching {run_name}"
        )
        stack.callback(server.close)
        print(
            f"driftwatch: watching {run_name} (pid {pid}); metrics at {server.url}", file=sys.stderr
        )
        received = stack.enter_context(_stop_on_signals(stop))
        started = time.time()
        if console.is_terminal:
            live = stack.enter_context(Live(console=console, auto_refresh=False))

            def show(snapshot: Snapshot) -> None:
                live.update(live_table(snapshot, monitor.store, server.url), refresh=True)
        else:

            def show(snapshot: Snapshot) -> None:
                print(plain_line(snapshot, monitor.store), flush=True)

        reason = watch(monitor, interval, stop, show)
    ended = reason or f"driftwatch received {signal.Signals(received['signal']).name}"
    print(summary(monitor.snapshot, monitor.store, monitor.reported.values(), ended, started))
    if received.get("signal") == signal.SIGINT:
        raise typer.Exit(EXIT_INTERRUPTED)


@app.command()
def doctor() -> None:
    """Say which data sources work on this machine, and why not."""
    for check in run_checks():
        mark = "ok " if check.ok else "-- "
        print(f"{mark} {check.name:<11} {check.detail}")


def main() -> None:
    """Entry point: every expected error is one line on stderr and a non-zero exit."""
    logging.basicConfig(format="driftwatch: %(message)s", level=logging.WARNING)
    try:
        code = app(prog_name="driftwatch", standalone_mode=False)
    except typer.TyperException as err:  # bad flags and arguments, found by the parser
        ctx = getattr(err, "ctx", None)
        hint = f" (see {ctx.command_path} --help)" if ctx is not None else ""
        print(f"driftwatch: error: {err.format_message()}{hint}", file=sys.stderr)
        sys.exit(2)
    except typer.Abort:
        sys.exit(EXIT_INTERRUPTED)
    except DriftwatchError as err:
        print(f"driftwatch: error: {err}", file=sys.stderr)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
