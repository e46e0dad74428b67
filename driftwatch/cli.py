"""The ``driftwatch`` command: wiring only; the logic lives in the modules it calls."""

from __future__ import annotations

import logging
import math
import os
import signal
import ssl
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Annotated, TextIO

import typer
from rich.console import Console
from rich.live import Live

from driftwatch import __version__, bundle
from driftwatch.analyze import analyze as analyze_path
from driftwatch.channel import channel_path, remove_channel, runtime_dir
from driftwatch.daemon import Daemon, handling_signals, load_config
from driftwatch.demo import DEFAULT_EXAMPLE, examples, find_example
from driftwatch.detect.catalog import default_engine
from driftwatch.doctor import run_checks
from driftwatch.errors import DriftwatchError, TargetGone, UsageError
from driftwatch.export.http import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    MetricsServer,
    TlsConfig,
    parse_listen,
)
from driftwatch.export.prometheus import metrics_app
from driftwatch.findings import Finding
from driftwatch.history.reader import HistoryReader
from driftwatch.history.schema import default_db_path
from driftwatch.history.writer import DEFAULT_RETENTION, History
from driftwatch.launch import StderrPump, child_environment, exit_code, forwarding_signals, launch
from driftwatch.monitor import Monitor, check_interval, watch
from driftwatch.report import build as build_report
from driftwatch.report import to_json as report_json
from driftwatch.report import to_text as report_text
from driftwatch.report.html import render as render_html
from driftwatch.snapshot import Snapshot
from driftwatch.sources import Source, default_sources
from driftwatch.target import Target, default_run_name
from driftwatch.units import parse_duration
from driftwatch.view import live_table, plain_line, summary

app = typer.Typer(
    name="driftwatch",
    help="Watch long TensorFlow/Keras training runs and say early when they drift.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

EXIT_INTERRUPTED = 130
PRINT_SLACK = 0.9
"""A plain line is printed once this share of --interval has passed since the last one."""


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
def _stopping_on_signals(stop: threading.Event) -> Iterator[list[int]]:
    """Set ``stop`` on SIGINT/SIGTERM; yields the list of signals received."""
    received: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _check_retention(retention: str) -> float:
    try:
        return parse_duration(retention)
    except ValueError as err:
        raise UsageError(f"--retention {err}") from err


@dataclass(frozen=True)
class WatchOptions:
    """The options ``attach`` and ``run`` share, checked."""

    interval: float
    host: str
    port: int
    logdirs: list[Path]
    findings: Path | None
    run: str | None
    db: Path
    retention: float
    tls: ssl.SSLContext | None  # checked: its files load

    @classmethod
    def parse(
        cls,
        interval: float,
        listen: str,
        logdirs: list[Path] | None,
        findings: Path | None,
        run: str | None,
        db: Path | None,
        retention: str,
        tls: tuple[Path | None, Path | None, Path | None],
    ) -> WatchOptions:
        host, port = parse_listen(listen)
        return cls(
            check_interval(interval),
            host,
            port,
            _check_logdirs(logdirs or []),
            findings,
            run,
            db or default_db_path(),
            _check_retention(retention),
            _tls_context(*tls),
        )


def _tls_context(
    cert: Path | None, key: Path | None, client_ca: Path | None
) -> ssl.SSLContext | None:
    if cert is None and key is None:
        if client_ca is not None:
            raise UsageError("--tls-client-ca needs --tls-cert and --tls-key")
        return None
    if cert is None or key is None:
        raise UsageError("--tls-cert and --tls-key go together: give both")
    return TlsConfig(cert, key, client_ca).context()


def _watch(
    target: Target,
    run_name: str,
    options: WatchOptions,
    extra_sources: list[Source],
    stop: threading.Event,
) -> tuple[Monitor, str | None, float]:
    """Monitor ``target`` with the live view and ``/metrics`` until it exits or ``stop``.

    Returns the monitor, why monitoring ended (``None``: stopped) and when it started.
    """
    console = Console()
    with ExitStack() as stack:
        findings_file = (
            stack.enter_context(_open_findings(options.findings)) if options.findings else None
        )

        def report(finding: Finding) -> None:
            if findings_file is not None:
                findings_file.write(finding.to_json(run_name) + "\n")

        history = History(options.db, options.retention)
        stack.callback(history.close)
        monitor = Monitor(
            run_name,
            target.info,
            default_sources(target, options.logdirs) + extra_sources,
            default_engine(),
            on_finding=report,
            recorder=history.recorder(run_name, target.info),
        )
        server = MetricsServer(
            metrics_app(lambda: [monitor.snapshot]),
            options.host,
            options.port,
            f"watching {run_name}",
            options.tls,
        )
        stack.callback(server.close)
        print(
            f"driftwatch: watching {run_name} (pid {target.pid}); history in {history.path}; "
            f"metrics at {server.url}",
            file=sys.stderr,
        )
        started = time.time()
        if console.is_terminal:
            live = stack.enter_context(Live(console=console, auto_refresh=False))

            def show(snapshot: Snapshot) -> None:
                live.update(live_table(snapshot, monitor.store, server.url), refresh=True)
        else:
            printed = -math.inf

            def show(snapshot: Snapshot) -> None:
                # A line per --interval, however fast sampling goes.
                nonlocal printed
                if snapshot.t - printed >= options.interval * PRINT_SLACK:
                    printed = snapshot.t
                    print(plain_line(snapshot, monitor.store), flush=True)

        reason = watch(monitor, options.interval, stop, show)
    if history.failed is None:
        print(
            f"driftwatch: history of {run_name} in {history.path} "
            f"(driftwatch report --db {history.path} {run_name})",
            file=sys.stderr,
        )
    return monitor, reason, started


IntervalOption = Annotated[
    float,
    typer.Option(
        help="Seconds between samples and between printed lines; sampling is faster "
        "(0.5 s) in a job's first 5 minutes and while memory or event files grow fast."
    ),
]
ListenOption = Annotated[str, typer.Option(help="HOST:PORT for /metrics (port 0: any free port).")]
LogdirOption = Annotated[
    list[Path] | None, typer.Option(help="TensorBoard log directory to watch (repeatable).")
]
FindingsOption = Annotated[
    Path | None, typer.Option(help="Append findings to this file as JSON lines.")
]
RunOption = Annotated[
    str | None, typer.Option(help="Run name for labels (default: the script's name).")
]
DbOption = Annotated[
    Path | None,
    typer.Option(
        help="History database (default: $XDG_DATA_HOME/driftwatch/history.db, "
        "else ~/.local/share/driftwatch/history.db)."
    ),
]
RetentionOption = Annotated[
    str, typer.Option(help="Delete runs from the history once not seen for this long (e.g. 28d).")
]
TlsCertOption = Annotated[
    Path | None, typer.Option(help="Serve /metrics over HTTPS with this PEM certificate (chain).")
]
TlsKeyOption = Annotated[Path | None, typer.Option(help="The PEM private key of --tls-cert.")]
TlsClientCaOption = Annotated[
    Path | None,
    typer.Option(help="Require scrapers' client certificates signed by this CA (file or dir)."),
]
DEFAULT_LISTEN = f"{DEFAULT_HOST}:{DEFAULT_PORT}"
DEFAULT_RETENTION_TEXT = f"{DEFAULT_RETENTION / 86400:.0f}d"


@app.command()
def attach(
    pid: Annotated[int, typer.Argument(help="PID of the training process to watch.")],
    interval: IntervalOption = 2.0,
    listen: ListenOption = DEFAULT_LISTEN,
    logdir: LogdirOption = None,
    findings: FindingsOption = None,
    run: RunOption = None,
    db: DbOption = None,
    retention: RetentionOption = DEFAULT_RETENTION_TEXT,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    tls_client_ca: TlsClientCaOption = None,
) -> None:
    """Watch a running process that was started without driftwatch."""
    tls = (tls_cert, tls_key, tls_client_ca)
    options = WatchOptions.parse(interval, listen, logdir, findings, run, db, retention, tls)
    target = Target.attach(pid)
    run_name = options.run or default_run_name(list(target.info.command), target.info.name)
    stop = threading.Event()
    with _stopping_on_signals(stop) as received:
        monitor, reason, started = _watch(target, run_name, options, [], stop)
    ended = reason or f"driftwatch received {signal.Signals(received[0]).name}"
    print(summary(monitor.snapshot, monitor.store, monitor.reported.values(), ended, started))
    if received and received[0] == signal.SIGINT:
        raise typer.Exit(EXIT_INTERRUPTED)


@app.command(context_settings={"allow_interspersed_args": False})
def run(
    command: Annotated[list[str], typer.Argument(help="The command to run, after --.")],
    interval: IntervalOption = 2.0,
    listen: ListenOption = DEFAULT_LISTEN,
    logdir: LogdirOption = None,
    findings: FindingsOption = None,
    run: RunOption = None,
    db: DbOption = None,
    retention: RetentionOption = DEFAULT_RETENTION_TEXT,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    tls_client_ca: TlsClientCaOption = None,
    hook: Annotated[
        bool, typer.Option(help="Inject the in-process hook into Keras's fit (no code change).")
    ] = True,
    cpu_allocator_stats: Annotated[
        bool,
        typer.Option(
            help="Make TensorFlow's CPU allocator keep statistics (TF_CPU_ALLOCATOR_USE_BFC), "
            "so TF memory is reported on CPU too. It changes the allocator the job uses."
        ),
    ] = False,
) -> None:
    """Run a training command under driftwatch, with the hook injected; exit with its code."""
    tls = (tls_cert, tls_key, tls_client_ca)
    options = WatchOptions.parse(interval, listen, logdir, findings, run, db, retention, tls)
    raise typer.Exit(_run_job(command, options, hook, cpu_allocator_stats))


def _run_job(
    command: list[str], options: WatchOptions, hook: bool, cpu_allocator_stats: bool
) -> int:
    """Start ``command``, watch it until it exits, print the summary; its exit code."""
    run_name = options.run or default_run_name(command, Path(command[0]).name)
    env = child_environment(dict(os.environ), hook, run_name)
    if cpu_allocator_stats:
        env["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
    child = launch(command, env)
    assert child.stderr is not None
    pump = StderrPump(child.stderr, sys.stderr.buffer)
    with forwarding_signals(child):
        try:
            target = Target.attach(child.pid)
            monitor, reason, started = _watch(target, run_name, options, [pump], threading.Event())
        except TargetGone:  # it finished before driftwatch could start watching
            child.wait()
            pump.close()
            return exit_code(child.returncode)
        child.wait()
    # The job is gone: its channel has no reader left to serve.
    remove_channel(
        channel_path(runtime_dir(env, target.info.uid), child.pid, target.info.create_time)
    )
    ended = reason or "stopped"
    print(summary(monitor.snapshot, monitor.store, monitor.reported.values(), ended, started))
    return exit_code(child.returncode)


@app.command()
def demo(
    example: Annotated[
        str, typer.Argument(help="The example to run (see --list).")
    ] = DEFAULT_EXAMPLE,
    list_examples: Annotated[
        bool, typer.Option("--list", help="List the examples and exit.")
    ] = False,
    interval: IntervalOption = 1.0,
    listen: ListenOption = f"{DEFAULT_HOST}:0",
) -> None:
    """Run a bundled example training run under driftwatch: live view, then its findings."""
    if list_examples:
        for known in examples():
            print(f"{known.name:<26} {known.summary}")
        return
    chosen = find_example(example)
    workdir = Path(tempfile.mkdtemp(prefix=f"driftwatch-demo-{chosen.name}-"))
    logs = workdir / "logs"
    logs.mkdir()
    findings = workdir / "findings.jsonl"
    db = workdir / "history.db"
    options = WatchOptions.parse(
        interval,
        listen,
        [logs],
        findings,
        chosen.name,
        db,
        DEFAULT_RETENTION_TEXT,
        (None, None, None),
    )
    code = _run_job(chosen.command(logs), options, hook=True, cpu_allocator_stats=True)
    page = workdir / "report.html"
    reader = HistoryReader(db)
    try:
        page.write_text(render_html(build_report(reader, None)), encoding="utf-8")
    finally:
        reader.close()
    print(f"findings: {findings}\nreport: {page}\nlogs: {logs}")
    raise typer.Exit(code)


@app.command()
def daemon(
    match: Annotated[
        list[str] | None,
        typer.Option(
            help="Also watch processes whose command line this regular expression finds "
            "(repeatable)."
        ),
    ] = None,
    config: Annotated[
        Path | None, typer.Option(help="TOML configuration file; SIGHUP re-reads it.")
    ] = None,
    interval: Annotated[
        float | None,
        typer.Option(help="Seconds between samples [default: the configuration's, else 2]."),
    ] = None,
    listen: ListenOption = DEFAULT_LISTEN,
    findings: FindingsOption = None,
    db: DbOption = None,
    retention: RetentionOption = DEFAULT_RETENTION_TEXT,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    tls_client_ca: TlsClientCaOption = None,
) -> None:
    """Watch every hooked process on this machine, and those --match finds, on one /metrics."""
    host, port = parse_listen(listen)
    keep = _check_retention(retention)
    tls = _tls_context(tls_cert, tls_key, tls_client_ca)
    logging.getLogger("driftwatch.daemon").setLevel(logging.INFO)
    with ExitStack() as stack:
        findings_file = stack.enter_context(_open_findings(findings)) if findings else None

        def report(run: str, finding: Finding) -> None:
            if findings_file is not None:
                findings_file.write(finding.to_json(run) + "\n")

        history = History(db or default_db_path(), keep)
        stack.callback(history.close)  # last: after every run has handed over its rest
        node = Daemon(
            partial(load_config, config, match or [], interval), on_finding=report, history=history
        )
        server = MetricsServer(
            metrics_app(lambda: node.snapshots), host, port, "watching this machine's runs", tls
        )
        stack.callback(server.close)
        with handling_signals(node) as received:  # before saying it has started
            print(
                f"driftwatch: daemon started; history in {history.path}; metrics at {server.url}",
                file=sys.stderr,
            )
            node.run()
    if history.failed is None:
        print(
            f"driftwatch: history in {history.path} (driftwatch report --db {history.path})",
            file=sys.stderr,
        )
    if received and received[0] == signal.SIGINT:
        raise typer.Exit(EXIT_INTERRUPTED)


@app.command()
def analyze(
    path: Annotated[Path, typer.Argument(help="A TensorBoard logdir or a samples file.")],
    json_lines: Annotated[
        bool, typer.Option("--json", help="Print findings as JSON lines, as --findings writes.")
    ] = False,
    run: Annotated[str, typer.Option(help="Run name in the JSON output.")] = "",
) -> None:
    """Run the detectors offline on a finished or running run's logs."""
    found = analyze_path(path)
    name = run or path.name
    if json_lines:
        for finding in found:
            print(finding.to_json(name))
        return
    if not found:
        print(f"{name}: no findings")
    for finding in found:
        print(f"[{finding.severity.value}] {finding.kind}: {finding.message}")


@app.command()
def report(
    run: Annotated[
        str | None,
        typer.Argument(help="Run name (its latest run) or number; default: the latest run."),
    ] = None,
    db: DbOption = None,
    html: Annotated[
        Path | None, typer.Option(help="Also write a self-contained HTML page with plots.")
    ] = None,
    json_document: Annotated[
        bool, typer.Option("--json", help="Print one JSON document instead of text.")
    ] = False,
) -> None:
    """What happened in a run: signals with trends and projections, and its findings."""
    reader = HistoryReader(db or default_db_path())
    try:
        built = build_report(reader, run)
    finally:
        reader.close()
    if html is not None:
        try:
            html.write_text(render_html(built), encoding="utf-8")
        except OSError as err:
            raise UsageError(f"--html {html}: cannot write: {err.strerror}") from err
    print(report_json(built) if json_document else report_text(built))


@app.command()
def doctor() -> None:
    """Say which data sources work on this machine, and why not."""
    for check in run_checks():
        mark = "ok " if check.ok else "-- "
        print(f"{mark} {check.name:<11} {check.detail}")


OutputOption = Annotated[
    Path | None, typer.Option(help="Write the files into this directory instead of printing.")
]


def _deliver(assets: list[bundle.Asset], output: Path | None) -> None:
    """Print the one asset, or write them all into ``output`` and say where."""
    if output is not None:
        for path in bundle.write(assets, output):
            print(path)
        return
    (asset,) = assets
    sys.stdout.write(asset.text)


@app.command()
def rules(
    output: OutputOption = None,
    kubernetes: Annotated[
        bool, typer.Option(help="As a PrometheusRule resource for the Prometheus Operator.")
    ] = False,
) -> None:
    """Print driftwatch's Prometheus recording and alerting rules."""
    _deliver([bundle.prometheus_rule() if kubernetes else bundle.rules()], output)


@app.command()
def dashboards(
    name: Annotated[
        str | None, typer.Argument(help=f"Dashboard to print: {', '.join(bundle.DASHBOARDS)}.")
    ] = None,
    output: OutputOption = None,
) -> None:
    """Print one of driftwatch's Grafana dashboards, or write them all with --output."""
    found = bundle.dashboards()
    choices = ", ".join(found)
    if name is None and output is None:
        raise UsageError(f"name a dashboard to print ({choices}), or write all with --output DIR")
    if name is not None and name not in found:
        raise UsageError(f"no dashboard {name!r}: choose one of {choices}")
    _deliver([found[name]] if name is not None else list(found.values()), output)


def main() -> None:
    """Entry point: every expected error is one line on stderr and a non-zero exit."""
    logging.basicConfig(format="driftwatch: %(message)s", level=logging.WARNING)
    # Past a file size limit, writes fail with EFBIG (the history says so and monitoring goes
    # on) instead of the signal killing driftwatch; launched jobs get the default back.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
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
