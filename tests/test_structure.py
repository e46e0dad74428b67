"""The package's shape: no import cycle, every class name used once, modules of one concept
and a readable size, the layering rules of ``pyproject.toml`` hold (and catch a breach, and a
package that was given no layer), and ``docs/architecture.md`` names every module, and only
modules that exist."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "driftwatch"
BIN = Path(sys.executable).parent
MAX_LINES = 450
"""Most lines a module may have."""
MAX_CLI_LINES = 300
"""Most lines ``cli.py`` may have: it is wiring only."""


def modules() -> dict[str, Path]:
    """Every module of the package (its examples are scripts, not modules) by dotted name."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(ROOT).with_suffix("")
        if "examples" in relative.parts:
            continue
        parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
        found[".".join(parts)] = path
    return found


def imported(path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that ``path`` imports anywhere (at its top, in a function or
    for type checking only: each is a dependency a reader must follow)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in names if name in known}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    for root in graph:
        if root not in index:
            found += _components_from(root, graph, index, low, stack)
    return found


def _components_from(
    root: str,
    graph: dict[str, set[str]],
    index: dict[str, int],
    low: dict[str, int],
    stack: list[str],
) -> list[list[str]]:
    """Tarjan's depth-first visit from ``root``: the components of more than one module it
    closes (``index``, ``low`` and ``stack`` carry over between visits)."""
    found = []
    work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
    index[root] = low[root] = len(index)
    stack.append(root)
    while work:
        node, edges = work[-1]
        for child in edges:
            if child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                work.append((child, iter(sorted(graph[child]))))
                break
            if child in stack:
                low[node] = min(low[node], index[child])
        else:
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = stack[stack.index(node) :]
                del stack[stack.index(node) :]
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycles_are_found_in_a_graph_with_one() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_the_package_modules() -> None:
    known = modules()
    graph = {name: imported(path, known) - {name} for name, path in known.items()}
    assert cycles(graph) == []


def test_every_class_name_is_used_once_in_the_package() -> None:
    defined: dict[str, list[str]] = {}
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                defined.setdefault(node.name, []).append(name)
    assert {name: where for name, where in defined.items() if len(where) > 1} == {}


def test_every_module_is_short_and_the_cli_is_wiring() -> None:
    lengths = {
        name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in modules().items()
    }
    assert {name: n for name, n in lengths.items() if n > MAX_LINES} == {}
    assert lengths["driftwatch.commands.cli"] < MAX_CLI_LINES


def run_tool(tool: str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / tool), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PYTHONPATH": str(cwd), "PATH": str(BIN)},
    )


def test_the_layering_rules_hold() -> None:
    result = run_tool("lint-imports", "--no-cache")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("module", "line", "tool", "needle"),
    [
        ("detect/stats.py", "import driftwatch.runtime.monitor", "lint-imports", "BROKEN"),
        ("runtime/monitor.py", "import driftwatch.history", "lint-imports", "BROKEN"),
        ("sources/process.py", "import driftwatch.commands.session", "lint-imports", "BROKEN"),
        ("detect/memory/drift.py", "import driftwatch.detect.slowdown", "lint-imports", "BROKEN"),
        ("runtime/monitor.py", "from driftwatch.hook import Hook", "ruff", "TID251"),
        ("daemon/agent.py", "from driftwatch.hook.core import Hook", "ruff", "TID251"),
        ("runtime/store.py", "import tensorflow", "ruff", "TID251"),
    ],
)
def test_a_breach_of_the_layering_rules_is_caught(
    tmp_path: Path, module: str, line: str, tool: str, needle: str
) -> None:
    breached = copy_of_the_package(tmp_path) / module
    breached.write_text(breached.read_text(encoding="utf-8") + f"\n{line}  # noqa: F401\n")
    if tool == "ruff":
        result = run_tool("ruff", "check", "--no-cache", "--select", "TID251", ".", cwd=tmp_path)
    else:
        result = run_tool("lint-imports", "--no-cache", cwd=tmp_path)
    assert result.returncode != 0
    assert needle in result.stdout


def copy_of_the_package(tmp_path: Path) -> Path:
    shutil.copytree(PACKAGE, tmp_path / "driftwatch", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    return tmp_path / "driftwatch"


@pytest.mark.parametrize("package", ["uploads", "detect/uploads"])
def test_a_package_given_no_layer_breaks_the_layering_rules(tmp_path: Path, package: str) -> None:
    added = copy_of_the_package(tmp_path) / package
    added.mkdir()
    (added / "__init__.py").write_text('"""A concept added later."""\n', encoding="utf-8")
    result = run_tool("lint-imports", "--no-cache", cwd=tmp_path)
    assert result.returncode != 0
    assert package.replace("/", ".") in result.stdout


def test_the_architecture_names_every_module_and_only_files_that_exist() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`((?:driftwatch|tests|bench|scenarios|docs|deploy)/[\w/.*-]*)`", text))
    assert named, "docs/architecture.md names no file"
    missing = sorted(path for path in named if not any(ROOT.glob(path.rstrip("/"))))
    assert missing == []
    unnamed = []
    for path in sorted(modules().values()):
        relative = path.relative_to(ROOT).as_posix()
        folder = path.parent.relative_to(ROOT).as_posix() + "/"
        if relative not in named and not (path.name == "__init__.py" and folder in named):
            unnamed.append(relative)
    assert unnamed == []
