"""The ``driftwatch`` command: wiring only; the logic lives in the modules it calls."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Annotated

import typer

from driftwatch import __version__
from driftwatch.commands import bundle
from driftwatch.commands.analyze import analyze_run
from driftwatch.commands.demo import DEFAULT_EXAMPLE, examples, find_example, run_demo
from driftwatch.commands.doctor import run_checks
from driftwatch.commands.options import (
    DbOption,
    IntervalOption,
    ListenOption,
    serve_options,
    watch_options,
)
from driftwatch.commands.session import (
    Session,
    SessionOptions,
    WatchOptions,
    handling_signals,
    name_of_run,
    print_summary,
    watch_job,
    watch_one,
)
from driftwatch.daemon.agent import Daemon
from driftwatch.daemon.config import load_config
from driftwatch.errors import DriftwatchError, UsageError
from driftwatch.export.http import DEFAULT_HOST
from driftwatch.history.reader import HistoryReader
from driftwatch.history.schema import default_db_path
from driftwatch.report.build import build as build_report
from driftwatch.report.html import render as render_html
from driftwatch.report.json import to_json as report_json
from driftwatch.report.text import to_text as report_text
from driftwatch.runtime.snapshot import Snapshot
from driftwatch.sources import default_sources
from driftwatch.target.process import Target

app = typer.Typer(
    name="driftwatch",
    help="Watch long TensorFlow/Keras training runs and say early when they drift.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

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


@app.command()
@watch_options
@serve_options
def attach(
    pid: Annotated[int, typer.Argument(help="PID of the training process to watch.")],
    watch: WatchOptions,
    serve: SessionOptions,
) -> None:
    """Watch a running process that was started without driftwatch."""
    target = Target.attach(pid)
    named, ranked = name_of_run(target)
    run_name, rank = watch.run or named, watch.rank or ranked
    stop = threading.Event()
    with handling_signals(stop.set) as received:
        sources = default_sources(target, watch.logdirs)
        watched = watch_one(serve, run_name, target.info, sources, watch.interval, stop, rank)
    print_summary(
        watched, watched.ended or f"driftwatch received {signal.Signals(received[0]).name}"
    )
    if received and received[0] == signal.SIGINT:
        raise typer.Exit(EXIT_INTERRUPTED)


@app.command(context_settings={"allow_interspersed_args": False})
@watch_options
@serve_options
def run(
    command: Annotated[list[str], typer.Argument(help="The command to run, after --.")],
    watch: WatchOptions,
    serve: SessionOptions,
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
    raise typer.Exit(watch_job(command, watch, serve, hook, cpu_allocator_stats))


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
    raise typer.Exit(run_demo(find_example(example), interval, listen))


@app.command()
@serve_options
def daemon(
    *,
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
    serve: SessionOptions,
) -> None:
    """Watch every hooked process on this machine, and those --match finds, on one /metrics."""
    logging.getLogger("driftwatch.daemon").setLevel(logging.INFO)
    node: Daemon | None = None

    def snapshots() -> Sequence[Snapshot]:
        return [] if node is None else node.snapshots

    with Session(serve, "watching this machine's runs", snapshots) as session:
        node = Daemon(
            partial(load_config, config, match or [], interval),
            on_finding=session.findings.write,
            history=session.history,
        )
        with handling_signals(node.request_stop, node.request_reload) as received:
            print(f"driftwatch: daemon started; {session.where()}", file=sys.stderr)
            node.run()
    if received and received[0] == signal.SIGINT:
        raise typer.Exit(EXIT_INTERRUPTED)


@app.command()
def analyze(
    path: Annotated[
        Path, typer.Argument(help="A TensorBoard logdir, one event file, or a samples file.")
    ],
    json_lines: Annotated[
        bool, typer.Option("--json", help="Print findings as JSON lines, as --findings writes.")
    ] = False,
    run: Annotated[str, typer.Option(help="Run name in the JSON output.")] = "",
) -> None:
    """Run the detectors offline on a finished or running run's logs."""
    analysis = analyze_run(path)
    name = run or path.name
    if json_lines:
        for finding in analysis.findings:
            print(finding.to_json(name))
        return
    print(analysis.read.describe(name))
    if not analysis.findings:
        print(f"{name}: no findings")
    for finding in analysis.findings:
        print(f"[{finding.severity.value}] {finding.kind}: {finding.message}")
    if analysis.goodput is not None:
        print(f"goodput: {analysis.goodput.describe()}")


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


@app.command()
def rules(
    output: OutputOption = None,
    kubernetes: Annotated[
        bool, typer.Option(help="As a PrometheusRule resource for the Prometheus Operator.")
    ] = False,
) -> None:
    """Print driftwatch's Prometheus recording and alerting rules."""
    bundle.deliver([bundle.prometheus_rule() if kubernetes else bundle.rules()], output)


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
    bundle.deliver([found[name]] if name is not None else list(found.values()), output)


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
