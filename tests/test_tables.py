"""The tables of finding kinds (``KINDS``) and watched signals (``WATCHED``) against the code
that reports and shows them: no kind or signal outside its table, no row without its code."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

import driftwatch
from driftwatch.findings import KINDS, Finding, Severity
from driftwatch.report.build import _PANELS
from driftwatch.series import SERIES, WATCHED
from driftwatch.view.terminal import _SUMMARY_LINES, _VIEW_ROWS

PACKAGE = Path(driftwatch.__file__).parent
DETECT = PACKAGE / "detect"


def _str(node: ast.expr | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _kind_positions(trees: list[ast.Module]) -> dict[str, int]:
    """Where ``Finding`` and each class that takes a ``kind`` (a detector built for one kind)
    take it among their positional arguments."""
    positions = {"Finding": [f.name for f in dataclasses.fields(Finding)].index("kind")}
    for tree in trees:
        for cls in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)):
            names = _dataclass_fields(cls)
            for item in cls.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    names = [arg.arg for arg in item.args.args[1:]]  # after self
            if "kind" in names:
                positions[cls.name] = names.index("kind")
    return positions


def _dataclass_fields(cls: ast.ClassDef) -> list[str]:
    """The fields of ``cls`` in order if it is a dataclass (a table's row, such as a
    resource naming its kind), else none."""
    decorators = [d.func if isinstance(d, ast.Call) else d for d in cls.decorator_list]
    if not any(isinstance(d, ast.Name) and d.id == "dataclass" for d in decorators):
        return []
    return [
        item.target.id
        for item in cls.body
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
    ]


def _callee(call: ast.Call, cls: ast.ClassDef | None, positions: dict[str, int]) -> str | None:
    """The class ``call`` builds: by its name, or ``super().__init__`` in ``cls``."""
    if isinstance(call.func, ast.Name):
        return call.func.id
    super_init = (
        isinstance(call.func, ast.Attribute)
        and call.func.attr == "__init__"
        and isinstance(call.func.value, ast.Call)
        and isinstance(call.func.value.func, ast.Name)
        and call.func.value.func.id == "super"
    )
    if super_init and cls is not None:
        bases = [base.id for base in cls.bases if isinstance(base, ast.Name)]
        return next((base for base in bases if base in positions), None)
    return None


def _calls_finding(tree: ast.Module) -> bool:
    return any(
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Finding"
        for node in ast.walk(tree)
    )


def literal_kinds(paths: list[Path]) -> set[str]:
    """The kinds named in the sources of the detectors and of the other modules that make
    findings: string literals given to ``Finding`` or to a ``kind`` parameter (a detector
    built for one kind), or assigned to a variable ``kind``."""
    parsed = {path: ast.parse(path.read_text()) for path in paths}
    trees = [t for p, t in parsed.items() if p.is_relative_to(DETECT) or _calls_finding(t)]
    positions = _kind_positions(trees)
    kinds: set[str] = set()
    for tree in trees:
        owner = {
            id(call): cls
            for cls in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef))
            for call in ast.walk(cls)
            if isinstance(call, ast.Call)
        }
        for call in (node for node in ast.walk(tree) if isinstance(node, ast.Call)):
            callee = _callee(call, owner.get(id(call)), positions)
            if callee not in positions:
                continue
            index = positions[callee]
            given = [kw.value for kw in call.keywords if kw.arg == "kind"]
            if index < len(call.args):
                given.append(call.args[index])
            kinds.update(kind for node in given if (kind := _str(node)) is not None)
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(
                isinstance(target, ast.Name) and target.id == "kind" for target in node.targets
            ):
                kinds.update(kind for kind in [_str(node.value)] if kind is not None)
    return kinds


def test_the_kinds_in_the_sources_are_the_table() -> None:
    assert literal_kinds(sorted(PACKAGE.rglob("*.py"))) == set(KINDS)


def test_every_kind_a_detector_reports_has_its_alert_and_runbook_section() -> None:
    """The detectors report the kinds with a runbook section (and so an alert), ``analyze``
    the rest."""
    alerted = {kind for kind, spec in KINDS.items() if spec.runbook is not None}
    assert literal_kinds(sorted(DETECT.rglob("*.py"))) == alerted


def written_severities(paths: list[Path]) -> dict[str, set[str]]:
    """How ``Finding`` calls that name their kind give its severity, by kind: ``table``
    (read from ``KINDS``), ``literal`` (a ``Severity`` member written out) or ``computed``."""
    found: dict[str, set[str]] = {}
    for path in paths:
        for call in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(call, ast.Call) and _callee(call, None, {}) == "Finding"):
                continue
            arguments = dict(zip(("kind", "severity"), call.args, strict=False))
            arguments.update((kw.arg, kw.value) for kw in call.keywords if kw.arg)
            kind, severity = _str(arguments.get("kind")), arguments.get("severity")
            if kind is None or severity is None:
                continue
            if isinstance(severity, ast.Attribute) and severity.attr == "severity":
                how = "table"
            elif isinstance(severity, ast.Attribute):
                how = "literal"
            else:
                how = "computed"
            found.setdefault(kind, set()).add(how)
    return found


def test_a_fixed_severity_is_read_from_the_table() -> None:
    """A finding reported at one severity takes it from ``KINDS``, never writes it out."""
    found = written_severities(sorted(PACKAGE.rglob("*.py")))
    assert {kind for kind, how in found.items() if "table" in how} >= {
        "stalled",
        "memory_step",
        "recording_gap",
    }
    assert {kind: how for kind, how in found.items() if "literal" in how} == {}


def test_every_watched_signal_is_a_series_and_shown_where_its_row_says() -> None:
    for series, watched in WATCHED.items():
        assert {series, *watched.also} <= set(SERIES), series
        assert watched.view or watched.summary or watched.panel, series
    assert set(_VIEW_ROWS) == {s for s, w in WATCHED.items() if w.view is not None}
    assert set(_SUMMARY_LINES) == {s for s, w in WATCHED.items() if w.summary is not None}
    assert set(_PANELS) == {s for s, w in WATCHED.items() if w.panel is not None}
    ranks = [w.panel_rank for w in WATCHED.values() if w.panel is not None]
    assert len(set(ranks)) == len(ranks), "two panels share a place in the report"


def test_a_finding_of_a_kind_outside_the_table_is_refused() -> None:
    with pytest.raises(ValueError, match="'leak' is no kind of finding"):
        Finding("leak", Severity.WARNING, 0.0, "memory grows")
    assert Finding("nonfinite", KINDS["nonfinite"].severity, 0.0, "NaN").kind == "nonfinite"
