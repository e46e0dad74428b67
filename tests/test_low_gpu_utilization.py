"""Sustained low GPU utilization while training: the detector on the NVML source's samples
from the fake ``pynvml`` scenarios (no GPU on this machine), and on synthetic series."""

from __future__ import annotations

import pytest

from driftwatch.detect import Evaluation
from driftwatch.detect.gpu_utilization import LowGpuUtilizationDetector
from driftwatch.findings import Severity
from driftwatch.series import Sample
from driftwatch.sources.nvml import NvmlSource
from tests.fake_pynvml import install

PID = 4242
T0 = 1_700_000_000.0
GPU0 = (("gpu", "0"),)


def watched(
    scenario: str, monkeypatch: pytest.MonkeyPatch, *, seconds: int, steps: bool
) -> Evaluation:
    """The NVML source sampled every 2 s for ``seconds`` under ``scenario``, fed to the
    detector with a train step every 2 s (``steps``) or none after the first."""
    install(monkeypatch, scenario, PID)  # type: ignore[arg-type]
    source = NvmlSource(PID)
    detector = LowGpuUtilizationDetector()
    t = T0
    for i in range(seconds // 2):
        t = T0 + 2 * i
        for sample in source.sample(t):
            detector.observe(sample)
        detector.observe(Sample("train_step", float(i * 50 if steps else 0), t))
    source.close()
    return detector.evaluate(t)


def test_utilization_dropping_while_memory_stays_is_reported_after_five_minutes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Expected: from the fake's third reading GPU 0 runs at 20 % and the target's kernels at
    # 15 %, its memory unchanged; after five one-minute windows under 30 %, a warning on
    # GPU 0 judged on the target's own samples. GPU 1 (30 %, another process) is not ours.
    # Not before five windows have closed (the first, cut by the minute's boundary, is short).
    assert watched("utilization_drop", monkeypatch, seconds=240, steps=True).findings == ()
    evaluation = watched("utilization_drop", monkeypatch, seconds=400, steps=True)
    (finding,) = evaluation.findings
    assert finding.kind == "low_gpu_utilization"
    assert finding.severity is Severity.WARNING
    assert finding.evidence["gpu"] == "0"
    assert finding.evidence["utilization_of"] == "process"
    assert finding.evidence["utilization"] == pytest.approx(0.15)
    assert finding.message.startswith("on GPU 0, the run's kernels ran only 15% of the time")
    assert "prefetch" in finding.message
    assert evaluation.score == pytest.approx(0.3 / 0.15)


def test_a_busy_gpu_or_one_with_no_steps_coming_is_not(monkeypatch: pytest.MonkeyPatch) -> None:
    busy = watched("ok", monkeypatch, seconds=400, steps=True)  # the target at 85 %
    assert busy.findings == ()
    assert busy.score == pytest.approx(0.3 / 0.85)
    # Idle and not training (evaluating, waiting, done): that is for `stalled` to say.
    idle = watched("utilization_drop", monkeypatch, seconds=400, steps=False)
    assert idle.findings == ()
    assert idle.score < 1


def test_the_device_utilization_is_judged_where_nvml_has_no_process_samples() -> None:
    detector = LowGpuUtilizationDetector()
    for i in range(400):
        t = T0 + i
        detector.observe(Sample("gpu_process_memory_bytes", 2e9, t, GPU0))
        detector.observe(Sample("gpu_utilization_ratio", 0.1 if i % 10 else 0.5, t, GPU0))
        detector.observe(Sample("train_step", float(i), t))
    (finding,) = detector.evaluate(T0 + 400).findings
    assert finding.evidence["utilization_of"] == "device"
    assert finding.evidence["utilization"] == pytest.approx(0.14)
    assert finding.message.startswith("on GPU 0, kernels ran only 14% of the time")


def test_one_busy_minute_among_idle_ones_is_not_sustained() -> None:
    detector = LowGpuUtilizationDetector()
    for i in range(400):
        t = T0 + i
        busy = 180 <= i < 240
        detector.observe(Sample("gpu_process_memory_bytes", 2e9, t, GPU0))
        detector.observe(Sample("gpu_process_sm_utilization_ratio", 0.9 if busy else 0.1, t, GPU0))
        detector.observe(Sample("train_step", float(i), t))
    assert detector.evaluate(T0 + 400).findings == ()
