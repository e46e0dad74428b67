"""docs/metrics.md is the user-facing copy of ``SERIES``, the README's findings section and
the runbook that of ``KINDS``: keep them in step. The pages under docs/ are reference: every
page and heading cited exists, every constant they name is the code's (with its value), every
kind has its page, and no page runs past a sitting."""

from __future__ import annotations

import importlib
import math
import pkgutil
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path

import pytest

import driftwatch
from driftwatch.causes import LEAK_CLASSES
from driftwatch.commands.demo import examples
from driftwatch.findings import KINDS
from driftwatch.series import SERIES
from tests.conftest import REPO


def test_metrics_page_documents_every_series_and_metric() -> None:
    page = (REPO / "docs" / "metrics.md").read_text()
    for series, spec in SERIES.items():
        assert f"| `{series}` | `{spec.metric}" in page, series


def test_readme_findings_section_names_every_kind() -> None:
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("\n## Findings\n") :]
    section = section[: section.index("\n## ", 1)]
    for kind in KINDS:
        assert f"`{kind}`" in section, kind


def test_runbook_has_the_section_of_every_kind() -> None:
    runbook = (REPO / "docs" / "runbook.md").read_text()
    headings = {h.strip().lower() for h in re.findall(r"^## (.+)$", runbook, re.MULTILINE)}
    for kind, spec in KINDS.items():
        assert spec.runbook is None or spec.runbook in headings, kind


def test_runbooks_host_memory_section_names_every_leak_class() -> None:
    runbook = (REPO / "docs" / "runbook.md").read_text()
    section = runbook[runbook.index("\n## DriftwatchHostMemoryDrift\n") :]
    section = section[: section.index("\n## ", 1)]
    for name, spec in LEAK_CLASSES.items():
        assert all((spec.title, spec.means, spec.fix)), name
        assert f"`{name}`" in section, name


def test_ci_runs_the_readme_test_command() -> None:
    readme = (REPO / "README.md").read_text()
    assert "make check" in readme
    assert "exec make check" in (REPO / ".ci" / "run").read_text()


def test_examples_page_lists_every_example() -> None:
    page = (REPO / "docs" / "examples.md").read_text()
    for example in examples():
        assert f"| `{example.name}` |" in page, example.name


# -- the reference pages under docs/ ---------------------------------------------------------

DOCS = REPO / "docs"
MAX_PAGE_LINES = 250
"""Most lines a page under docs/ may have: a reference page is read in one sitting."""
LONG_PAGES = frozenset({"runbook.md"})
"""Pages exempt from ``MAX_PAGE_LINES``: the alert runbook, a section per alert."""
INDEX = "detectors.md"
"""The index of the finding kinds: a row per kind naming its reference pages."""
CITING = ("README.md", "docs", "driftwatch", "tests", "bench", "scenarios", "deploy")
"""Where files cite pages under docs/."""
CITATION = re.compile(
    r"(?:(?<![\w./:-])|\.\./|driftwatch/driftwatch/blob/main/)docs/"
    r"(?P<page>[\w-]+\.md)(?:#(?P<anchor>[\w-]+))?"
    r"\)?(?:(?:,\s*|\s+)\"(?P<heading>[^\"\n]+(?:\n[^\"\n]+)?)\")?"
)
"""A page under docs/ by its path, maybe with ``#anchor``, or followed by ``, "Heading"`` (also
after the link of a markdown link to it)."""
LINK = re.compile(
    r"\]\((?P<page>[\w-]+\.md)(?:#(?P<anchor>[\w-]+))?\)"
    r"(?:(?:,\s*|\s+)\"(?P<heading>[^\"\n]+(?:\n[^\"\n]+)?)\")?"
)
"""A page's link to another page beside it, maybe followed by ``, "Heading"``."""
CONSTANT = re.compile(r"`([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)`")
"""A module constant named in backticks: UPPER_SNAKE_CASE."""
FOREIGN_NAMES = frozenset(
    {
        "RLIMIT_NOFILE",  # resource limits and capabilities of the kernel
        "RLIMIT_NPROC",
        "CAP_SYS_ADMIN",
        "CAP_SYS_RESOURCE",
        "CAP_SYS_PTRACE",
        "CAP_DAC_OVERRIDE",
        "CAP_DAC_READ_SEARCH",
        "SYS_PTRACE",  # a container's capability, as Docker names it
        "NVML_GPM_METRIC_SM_UTIL",  # NVML's
        "NVML_GPM_METRIC_SM_OCCUPANCY",
    }
)
"""Names in UPPER_SNAKE_CASE that pages cite from the kernel and NVML, not from driftwatch."""
PLAIN_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:e-?\d+)?")
"""A value cell that states a number and nothing else."""
KIND_LIKE = re.compile(r"`([a-z][a-z0-9]*(?:_[a-z0-9]+)+)`")
"""A name in backticks that looks like a finding kind: lower snake_case."""
SESSION_WORDING = re.compile(r"\bsessions?\s+\d+|\bCI" + r" here\b", re.IGNORECASE)
"""Numbered work sessions, and where CI ran ("CI" then "here"): how the work was done, which
git keeps, is no part of the files."""


def pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def headings(page: Path) -> set[str]:
    """A page's headings as written, without backticks or surrounding space."""
    found = re.findall(r"^#+[ \t]+(.+?)[ \t]*$", page.read_text(encoding="utf-8"), re.MULTILINE)
    return {" ".join(h.replace("`", "").split()) for h in found}


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lowercase, punctuation dropped, spaces as hyphens."""
    kept = re.sub(r"[^\w\- ]", "", heading.lower())
    return kept.replace(" ", "-")


def listed_files() -> list[Path]:
    """The repository's files that git tracks or would track (not ignored)."""
    result = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    )
    names = sorted({name for name in result.stdout.decode().split("\0") if name})
    return [REPO / name for name in names if (REPO / name).is_file()]


def text_of(path: Path) -> str | None:
    """The file's text, or None for a file that is not UTF-8 text."""
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def citing_files() -> list[Path]:
    """The files under ``CITING`` that cite a page under docs/."""
    found = []
    for path in listed_files():
        relative = path.relative_to(REPO)
        if relative.parts[0] not in CITING or path == Path(__file__):  # its cases are made up
            continue
        text = text_of(path)
        if text is not None and (CITATION.search(text) or relative.parts[0] == "docs"):
            found.append(path)
    return found


def broken_citations(path: Path) -> list[str]:
    """Each citation in ``path`` of a page that does not exist, or of a heading or anchor
    that the page does not have, as ``line: what``."""
    text = text_of(path) or ""
    matches = list(CITATION.finditer(text))
    if path.parent == DOCS:
        matches += LINK.finditer(text)
    broken = []
    for match in matches:
        line = text.count("\n", 0, match.start()) + 1
        page = DOCS / match["page"]
        if not page.is_file():
            broken.append(f"{line}: no page {match['page']}")
            continue
        if match["heading"] is not None:
            heading = re.sub(r"\s*\n\s*(?:#\s*)?", " ", match["heading"]).strip()
            if " ".join(heading.replace("`", "").split()) not in headings(page):
                broken.append(f'{line}: no heading "{heading}" on {match["page"]}')
        if match["anchor"] is not None and match["anchor"] not in set(map(anchor, headings(page))):
            broken.append(f"{line}: no anchor #{match['anchor']} on {match['page']}")
    return broken


@pytest.mark.parametrize("path", citing_files(), ids=lambda path: path.relative_to(REPO).as_posix())
def test_every_page_and_heading_a_file_cites_under_docs_exists(path: Path) -> None:
    assert broken_citations(path) == []


def test_a_citation_of_a_missing_page_heading_or_anchor_is_caught(tmp_path: Path) -> None:
    cited = tmp_path / "cited.py"
    cited.write_text(
        '# docs/slowdowns.md, "Blocks"\n'
        '# docs/slowdowns.md, "No such heading"\n'
        "# docs/no-such-page.md\n"
        "# [docs/slowdowns.md](docs/slowdowns.md#no-such-anchor)\n"
        "# https://example.org/docs/elsewhere.md is not ours\n",
        encoding="utf-8",
    )
    assert broken_citations(cited) == [
        '2: no heading "No such heading" on slowdowns.md',
        "3: no page no-such-page.md",
        "4: no anchor #no-such-anchor on slowdowns.md",
    ]


def module_names() -> dict[str, dict[str, object]]:
    """Every module-level name of the package, with its value in each module that has it.
    Entry points whose import runs them (``__main__``, the injected ``sitecustomize``) and
    the examples (scripts, not modules) are left out."""
    names: dict[str, dict[str, object]] = {}
    for info in pkgutil.walk_packages(driftwatch.__path__, "driftwatch."):
        last = info.name.rsplit(".", 1)[-1]
        if last in ("__main__", "sitecustomize") or ".examples" in info.name:
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            names.setdefault(name, {})[info.name] = value
    return names


def module_of(path: str) -> str:
    """``driftwatch/detect/stats.py`` as a module name."""
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def constant_rows(text: str) -> list[tuple[str, str, str]]:
    """(first cell, name, value cell) of each row of the page's constant tables: tables whose
    header starts with "constant" and has a "value" column."""
    rows = []
    for table in re.findall(r"(?:^\|.*\|[ \t]*\n)+", text, re.MULTILINE):
        lines = table.splitlines()
        header = [cell.strip().lower() for cell in lines[0].strip("|").split("|")]
        if header[0] != "constant" or "value" not in header:
            continue
        value_at = header.index("value")
        for line in lines[2:]:
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            named = CONSTANT.findall(cells[0])
            if len(named) == 1 and len(cells) > value_at:
                rows.append((cells[0], named[0], cells[value_at]))
    return rows


def test_every_constant_a_page_names_is_in_the_package_with_the_value_its_table_states() -> None:
    names = module_names()
    values = [v for by_module in names.values() for v in by_module.values()]
    members = [m for v in values if isinstance(v, tuple | frozenset) for m in v]
    strings = {v for v in [*values, *members] if isinstance(v, str)}
    unknown, wrong = [], []
    for page in pages():
        text = page.read_text(encoding="utf-8")
        for name in sorted(set(CONSTANT.findall(text))):
            # An environment variable driftwatch reads or sets is named by its value (alone,
            # or in a tuple of the names it reads).
            if name not in names and name not in strings and name not in FOREIGN_NAMES:
                unknown.append(f"{page.name}: {name}")
        for cell, name, stated in constant_rows(text):
            if not PLAIN_NUMBER.fullmatch(stated) or name not in names:
                continue
            hinted = {module_of(p) for p in re.findall(r"`(driftwatch/[\w/]+\.py)`", cell)}
            values = [v for m, v in names[name].items() if not hinted or m in hinted]
            numbers = [
                float(n)
                for v in values
                for n in (v.values() if isinstance(v, Mapping) else [v])
                if isinstance(n, int | float) and not isinstance(n, bool)
            ]
            if not any(math.isclose(float(stated.replace(",", "")), n) for n in numbers):
                wrong.append(f"{page.name}: {name} is {stated} on the page, {numbers} in code")
    assert unknown == []
    assert wrong == []


def test_a_constant_table_row_is_read_with_its_name_and_value() -> None:
    table = (
        "| constant | value | unit |\n| --- | --- | --- |\n"
        "| `FIRST_CHUNK_BAR` | 1.4 | ratio |\n| `A_B` (`driftwatch/units.py`) | 1,000 | s |\n"
    )
    assert constant_rows(table) == [
        ("`FIRST_CHUNK_BAR`", "FIRST_CHUNK_BAR", "1.4"),
        ("`A_B` (`driftwatch/units.py`)", "A_B", "1,000"),
    ]
    assert module_of("driftwatch/detect/stats.py") == "driftwatch.detect.stats"


def index_rows() -> dict[str, list[str]]:
    """The index's rows: each kind and the pages its row links to."""
    rows = {}
    for kind, pages_cell in re.findall(
        r"^\| `([a-z_]+)` \| (.+?) \|", (DOCS / INDEX).read_text(encoding="utf-8"), re.MULTILINE
    ):
        rows[kind] = re.findall(r"\]\(([\w-]+\.md)\)", pages_cell)
    return rows


def test_every_finding_kind_has_a_row_in_the_index_and_is_named_on_its_pages() -> None:
    rows = index_rows()
    assert sorted(rows) == sorted(KINDS)
    for kind, linked in rows.items():
        assert linked, kind
        for name in linked:
            page = DOCS / name
            assert page.is_file(), (kind, name)
            assert f"`{kind}`" in page.read_text(encoding="utf-8"), (kind, name)


def test_every_kind_like_name_in_the_index_is_a_finding_kind() -> None:
    named = set(KIND_LIKE.findall((DOCS / INDEX).read_text(encoding="utf-8")))
    assert named - set(KINDS) == set()


def test_no_page_under_docs_is_longer_than_a_sitting_but_the_runbook() -> None:
    lengths = {page.name: len(page.read_text(encoding="utf-8").splitlines()) for page in pages()}
    assert {n: k for n, k in lengths.items() if k > MAX_PAGE_LINES and n not in LONG_PAGES} == {}


def test_no_file_tells_of_numbered_work_sessions() -> None:
    found = []
    for path in listed_files():
        text = text_of(path)
        if text is None:
            continue
        for match in SESSION_WORDING.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append(f"{path.relative_to(REPO)}:{line}: {match.group()}")
    assert found == []
