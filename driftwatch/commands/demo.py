"""The bundled examples that ``driftwatch demo`` runs: real TensorFlow programs in
``driftwatch/examples/``, healthy and broken, that know nothing of driftwatch.

They ship inside the package (as data, not a subpackage: each runs as a script by its path
and imports its neighbours, ``common`` and the like, as top-level modules), so the demo works
from a wheel as from a clone. Listing them parses their source; nothing here imports them.
"""

from __future__ import annotations

import ast
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from driftwatch.commands.session import SessionOptions, WatchOptions, watch_job
from driftwatch.errors import UsageError
from driftwatch.export.http import parse_listen
from driftwatch.history.reader import HistoryReader
from driftwatch.report.build import build as build_report
from driftwatch.report.html import render as render_html
from driftwatch.runtime.monitor import check_interval

EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "examples"
"""Where the examples are: in the installed package, beside this package."""
DEFAULT_EXAMPLE = "slow_and_diverging"
"""Short, with two problems: a callback that gets slower and a loss that turns NaN."""


@dataclass(frozen=True, slots=True)
class Example:
    name: str
    path: Path
    summary: str  # the first line of its docstring

    def command(self, logdir: Path) -> list[str]:
        """The command that runs it with this Python, logging to ``logdir``."""
        return [sys.executable, str(self.path), "--logdir", str(logdir)]


def _load(path: Path) -> Example | None:
    """The example in ``path``; ``None`` for a helper module (one with no ``__main__`` block)."""
    source = path.read_text(encoding="utf-8")
    if 'if __name__ == "__main__":' not in source:
        return None
    doc = ast.get_docstring(ast.parse(source, str(path))) or ""
    return Example(path.stem, path, doc.partition("\n")[0])


def examples(directory: Path = EXAMPLES_DIR) -> list[Example]:
    """Every example in ``directory``, by name."""
    if not directory.is_dir():
        raise UsageError(f"no examples at {directory}: this driftwatch is incomplete (reinstall)")
    found = (_load(path) for path in sorted(directory.glob("*.py")))
    return [example for example in found if example is not None]


def find_example(name: str, directory: Path = EXAMPLES_DIR) -> Example:
    """The example called ``name`` (with or without ``.py``)."""
    known = examples(directory)
    for example in known:
        if example.name == name.removesuffix(".py"):
            return example
    names = ", ".join(example.name for example in known)
    raise UsageError(f"no example {name!r}; there are: {names}")


def run_demo(example: Example, interval: float, listen: str) -> int:
    """Run ``example`` under driftwatch in a fresh directory (its logs, findings, history and
    HTML report), say where they are; the example's exit code."""
    workdir = Path(tempfile.mkdtemp(prefix=f"driftwatch-demo-{example.name}-"))
    logs = workdir / "logs"
    logs.mkdir()
    findings, db = workdir / "findings.jsonl", workdir / "history.db"
    watch = WatchOptions(check_interval(interval), [logs], example.name)
    serve = SessionOptions(*parse_listen(listen), findings, db)
    code = watch_job(example.command(logs), watch, serve, hook=True, cpu_allocator_stats=True)
    page = workdir / "report.html"
    reader = HistoryReader(db)
    try:
        page.write_text(render_html(build_report(reader, None)), encoding="utf-8")
    finally:
        reader.close()
    print(f"findings: {findings}\nreport: {page}\nlogs: {logs}")
    return code
