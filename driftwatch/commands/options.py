"""The command-line options that several commands share, declared once.

Each block is a decorator: it adds its options to a typer command's signature and hands the
command one checked object instead (``serve=`` a ``SessionOptions``, ``watch=`` a
``WatchOptions``), so a bad value is one line from the same check whichever command got it.
"""

from __future__ import annotations

import functools
import inspect
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from driftwatch.commands.session import SessionOptions, WatchOptions
from driftwatch.errors import UsageError
from driftwatch.export.http import DEFAULT_HOST, DEFAULT_PORT, TlsConfig, parse_listen
from driftwatch.history.schema import default_db_path
from driftwatch.history.writer import DEFAULT_RETENTION
from driftwatch.runtime.monitor import check_interval
from driftwatch.units import parse_duration

DEFAULT_LISTEN = f"{DEFAULT_HOST}:{DEFAULT_PORT}"
DEFAULT_INTERVAL = 2.0
"""Seconds between samples and between printed lines, past a job's first minutes."""

Command = TypeVar("Command", bound=Callable[..., Any])

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
RunOption = Annotated[
    str | None, typer.Option(help="Run name for labels (default: the script's name).")
]
RankOption = Annotated[
    str | None,
    typer.Option(
        help="This process's rank in a distributed job, beside the run name in labels "
        "(default: $DRIFTWATCH_RANK, else TF_CONFIG's task, else the launcher's rank)."
    ),
]
FindingsOption = Annotated[
    Path | None, typer.Option(help="Append findings to this file as JSON lines.")
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


def _option(name: str, annotation: Any, default: Any) -> inspect.Parameter:
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    return inspect.Parameter(name, kind, default=default, annotation=annotation)


def _block(
    name: str, params: list[inspect.Parameter], build: Callable[..., Any]
) -> Callable[[Command], Command]:
    """A decorator putting ``params`` in the place of a command's ``name`` parameter and
    passing it ``build(**their values)`` there."""

    def decorate(command: Command) -> Command:
        signature = inspect.signature(command, eval_str=True)
        spliced: list[inspect.Parameter] = []
        for param in signature.parameters.values():
            same_kind = [p.replace(kind=param.kind) for p in params]
            spliced.extend(same_kind if param.name == name else [param])

        @functools.wraps(command)
        def wrapper(**values: Any) -> Any:
            block = {p.name: values.pop(p.name) for p in params}
            return command(**values, **{name: build(**block)})

        del wrapper.__wrapped__  # typer reads the signature below, not the command's
        wrapper.__signature__ = signature.replace(parameters=spliced)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in spliced}
        return wrapper  # type: ignore[return-value]

    return decorate


def watch_options(command: Command) -> Command:
    """``--interval``, ``--logdir`` (repeatable), ``--run`` and ``--rank``, as ``watch=``."""

    def build(
        interval: float, logdir: list[Path] | None, run: str | None, rank: str | None
    ) -> WatchOptions:
        for path in logdir or []:
            if not path.is_dir():
                raise UsageError(f"--logdir {path}: no such directory")
        if rank is not None and not rank.strip():
            raise UsageError("--rank: empty (leave it out for a job of one process)")
        return WatchOptions(check_interval(interval), list(logdir or []), run, rank)

    params = [
        _option("interval", IntervalOption, DEFAULT_INTERVAL),
        _option("logdir", LogdirOption, None),
        _option("run", RunOption, None),
        _option("rank", RankOption, None),
    ]
    return _block("watch", params, build)(command)


def serve_options(command: Command) -> Command:
    """``--listen``, ``--findings``, ``--db``, ``--retention`` and ``--tls-*``, as ``serve=``."""

    def build(
        listen: str,
        findings: Path | None,
        db: Path | None,
        retention: str,
        tls_cert: Path | None,
        tls_key: Path | None,
        tls_client_ca: Path | None,
    ) -> SessionOptions:
        host, port = parse_listen(listen)
        try:
            keep = parse_duration(retention)
        except ValueError as err:
            raise UsageError(f"--retention {err}") from err
        tls = _tls_context(tls_cert, tls_key, tls_client_ca)
        return SessionOptions(host, port, findings, db or default_db_path(), keep, tls)

    params = [
        _option("listen", ListenOption, DEFAULT_LISTEN),
        _option("findings", FindingsOption, None),
        _option("db", DbOption, None),
        _option("retention", RetentionOption, f"{DEFAULT_RETENTION / 86400:.0f}d"),
        _option("tls_cert", TlsCertOption, None),
        _option("tls_key", TlsKeyOption, None),
        _option("tls_client_ca", TlsClientCaOption, None),
    ]
    return _block("serve", params, build)(command)


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
