"""The README's series table is the user-facing copy of ``SERIES``: keep them in step."""

from __future__ import annotations

from driftwatch.demo import examples
from driftwatch.series import SERIES
from tests.conftest import REPO


def test_readme_documents_every_series_and_metric() -> None:
    readme = (REPO / "README.md").read_text()
    for series, spec in SERIES.items():
        assert f"| `{series}` | `{spec.metric}" in readme, series


def test_ci_runs_the_readme_test_command() -> None:
    readme = (REPO / "README.md").read_text()
    assert "make check" in readme
    assert "exec make check" in (REPO / ".ci" / "run").read_text()


def test_readme_lists_every_example() -> None:
    readme = (REPO / "README.md").read_text()
    for example in examples():
        assert f"| `{example.name}` |" in readme, example.name
