from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from driftwatch.export.prometheus import DriftwatchCollector
from driftwatch.findings import Finding, Severity
from driftwatch.runtime.snapshot import Snapshot, SourceStatus
from driftwatch.series import SERIES
from driftwatch.target.process import TargetInfo
from tests.conftest import promtool_check_metrics

GPU0 = (("gpu", "0"),)


def snapshot(run: str = "train", pid: int = 4242) -> Snapshot:
    info = TargetInfo(
        pid, 1_700_000_000.0, "python", ("python", "train.py", "--token=***"), "ml", 1000
    )
    return Snapshot(
        run=run,
        target=info,
        t=1_700_000_100.0,
        ticks=7,
        values={
            ("rss_bytes", ()): 512e6,
            ("cpu_seconds", ()): 12.5,
            ("step_seconds", ()): 0.02,
            ("train_step", ()): 1200.0,
            ("gpu_process_memory_bytes", GPU0): 3e9,
            ("gpu_memory_total_bytes", GPU0): 80e9,
        },
        sources=(SourceStatus("process", True), SourceStatus("nvml", False, "no driver")),
        findings=(Finding("stalled", Severity.WARNING, 1_700_000_050.0, "no step", {}),),
    )


def scrape(snapshots: Iterable[Snapshot]) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DriftwatchCollector(lambda: list(snapshots)))
    return generate_latest(registry).decode()


def samples_of(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_series_become_metrics_named_by_the_table() -> None:
    samples = samples_of(scrape([snapshot()]))
    assert samples[("driftwatch_process_resident_memory_bytes", (("run", "train"),))] == 512e6
    assert samples[("driftwatch_process_cpu_seconds_total", (("run", "train"),))] == 12.5
    assert samples[("driftwatch_step_duration_seconds", (("run", "train"),))] == 0.02
    assert samples[("driftwatch_gpu_process_memory_bytes", (("gpu", "0"), ("run", "train")))] == 3e9
    # Node-wide series carry no run label.
    assert samples[("driftwatch_gpu_memory_total_bytes", (("gpu", "0"),))] == 80e9


def test_a_capture_that_could_not_be_made_is_a_metric_of_its_finding(promtool: str) -> None:
    why = {"capture_stack_error": "no stack dump: py-spy is not installed (pip install py-spy)"}
    failed = Finding("stalled", Severity.WARNING, 1_700_000_050.0, "no step", why)
    text = scrape([replace(snapshot(), findings=(failed,))])
    labels = (("capture", "stack"), ("kind", "stalled"), ("run", "train"))
    assert samples_of(text)[("driftwatch_finding_capture_failed", labels)] == 1.0
    assert "driftwatch_finding_capture_failed{" not in scrape([snapshot()])
    result = promtool_check_metrics(promtool, text)
    assert result.returncode == 0, result.stdout + result.stderr


def test_pid_and_command_live_only_in_the_info_metric() -> None:
    samples = samples_of(scrape([snapshot()]))
    info = [labels for (name, labels) in samples if name == "driftwatch_target_info"]
    assert info == [
        (
            ("command", "python train.py --token=***"),
            ("pid", "4242"),
            ("run", "train"),
            ("user", "ml"),
        )
    ]
    assert all(
        "pid" not in dict(labels) for (name, labels) in samples if name != "driftwatch_target_info"
    )
    assert samples[("driftwatch_target_start_time_seconds", (("run", "train"),))] == 1.7e9


def test_sources_findings_and_build_info_are_exported() -> None:
    samples = samples_of(scrape([snapshot()]))
    assert samples[("driftwatch_source_up", (("run", "train"), ("source", "nvml")))] == 0
    assert samples[("driftwatch_source_up", (("run", "train"), ("source", "process")))] == 1
    key = (("kind", "stalled"), ("run", "train"), ("severity", "warning"))
    assert samples[("driftwatch_finding_active", key)] == 1
    assert any(name == "driftwatch_build_info" for name, _ in samples)


def test_every_scrape_is_built_fresh() -> None:
    current = [snapshot("a"), snapshot("b", pid=1)]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DriftwatchCollector(lambda: current))
    first = samples_of(generate_latest(registry).decode())
    current.pop()  # run b ended
    second = samples_of(generate_latest(registry).decode())
    assert any(dict(labels).get("run") == "b" for _, labels in first)
    assert not any(dict(labels).get("run") == "b" for _, labels in second)


def test_node_series_seen_through_two_runs_are_exported_once() -> None:
    text = scrape([snapshot("a"), snapshot("b")])
    lines = [line for line in text.splitlines() if line.startswith("driftwatch_gpu_memory_total")]
    assert len(lines) == 1


def test_the_ranks_of_one_run_are_told_apart_by_a_rank_label(promtool: str) -> None:
    # Expected: two ranks of run "mnist" watched by one daemon, and a run of one process
    # beside them: every per-run sample carries run and rank (empty for the lone run, which
    # Prometheus drops); node-wide ones neither; the exposition passes promtool.
    ranks = [
        replace(snapshot("mnist", pid), rank=r) for pid, r in ((1, "worker:0"), (2, "worker:1"))
    ]
    text = scrape([*ranks, snapshot("lone", 3)])
    samples = samples_of(text)
    rss = "driftwatch_process_resident_memory_bytes"
    for rank in ("worker:0", "worker:1"):
        assert samples[(rss, (("rank", rank), ("run", "mnist")))] == 512e6
    assert samples[(rss, (("rank", ""), ("run", "lone")))] == 512e6
    info = {
        dict(labels)["pid"]: dict(labels).get("rank")
        for (name, labels) in samples
        if name == "driftwatch_target_info"
    }
    assert info == {"1": "worker:0", "2": "worker:1", "3": ""}
    assert samples[("driftwatch_gpu_memory_total_bytes", (("gpu", "0"),))] == 80e9
    result = promtool_check_metrics(promtool, text)
    assert result.returncode == 0, result.stdout + result.stderr


def test_runs_of_one_process_have_no_rank_label() -> None:
    assert 'rank="' not in scrape([snapshot("a"), snapshot("b", pid=1)])


def test_empty_exposition_and_table_names_follow_conventions() -> None:
    text = scrape([])
    assert "driftwatch_build_info" in text
    for spec in SERIES.values():
        assert spec.metric.startswith("driftwatch_")
        assert not math.isnan(len(spec.help))
        assert spec.help.endswith(".")


def test_exposition_passes_promtool(promtool: str) -> None:
    result = promtool_check_metrics(promtool, scrape([snapshot("a"), snapshot("b")]))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "", result.stdout
