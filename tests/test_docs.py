"""The README's series table is the user-facing copy of ``SERIES``, its findings section and
the runbook that of ``KINDS``: keep them in step."""

from __future__ import annotations

import re

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
