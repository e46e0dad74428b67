from __future__ import annotations

import inspect
import itertools
import logging
import subprocess
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from driftwatch.errors import SourceUnavailable
from driftwatch.export.prometheus import DriftwatchCollector
from driftwatch.runtime.monitor import Monitor
from driftwatch.series import SERIES, Sample
from driftwatch.sources.nvml import NvmlSource, describe
from driftwatch.sources.nvml_queries import THROTTLE_REASONS
from driftwatch.target.process import TargetInfo
from tests.fake_pynvml import (
    CONSTANTS,
    ERROR_CODES,
    GIB,
    REASONS,
    FakeNvml,
    GpmMetric,
    GpmMetricsGet,
    GpmSupport,
    NVMLError,
    NVMLLibraryMismatchError,
    ProcessUtilizationSample,
    error,
    install,
    uninstall,
)

PID = 4242
GPU0 = (("gpu", "0"),)
GPU1 = (("gpu", "1"),)


MEMORY = {"gpu_process_memory_bytes", "gpu_memory_used_bytes", "gpu_memory_total_bytes"}
"""The memory series: the source's only ones before it read utilization, clocks and the rest."""


def values(samples: list[Sample]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.series, s.labels): s.value for s in samples}


def memory(samples: list[Sample]) -> list[Sample]:
    return [s for s in samples if s.series in MEMORY]


def test_fake_mirrors_the_real_pynvml_errors() -> None:
    real: Any = pytest.importorskip("pynvml")
    real_codes = {name: getattr(real, name) for name in dir(real) if name.startswith("NVML_ERROR_")}
    assert len(real_codes) == len(ERROR_CODES)
    for name, code in ERROR_CODES.items():
        real_class = getattr(real, f"NVMLError_{name}")
        assert real_class().value == code
        assert isinstance(real.NVMLError(code), real_class)
        assert isinstance(NVMLError(code), type(error(name)))
        assert type(error(name)).__name__ == real_class.__name__
    assert not issubclass(real.NVMLLibraryMismatchError, real.NVMLError)
    assert not issubclass(NVMLLibraryMismatchError, NVMLError)


def test_ok_reports_process_and_device_memory_per_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, "ok", PID)
    source = NvmlSource(PID)
    assert source.name == "nvml"
    assert fake.calls == []  # nothing is loaded before the first sample
    samples = source.sample(100.0)
    assert values(memory(samples)) == {
        # listed as compute and as graphics client: counted once
        ("gpu_process_memory_bytes", GPU0): GIB,
        ("gpu_memory_used_bytes", GPU0): 1.5 * GIB,
        ("gpu_memory_total_bytes", GPU0): 16 * GIB,
        ("gpu_process_memory_bytes", GPU1): 0,  # another process's memory is not ours
        ("gpu_memory_used_bytes", GPU1): 2.5 * GIB,
        ("gpu_memory_total_bytes", GPU1): 16 * GIB,
    }
    assert {s.t for s in samples} == {100.0}
    source.sample(101.0)
    assert fake.calls.count("nvmlInit") == 1
    source.close()
    source.close()
    assert fake.calls.count("nvmlShutdown") == 1
    assert fake.initialised == 0


def test_close_before_any_sample_touches_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, "ok", PID)
    NvmlSource(PID).close()
    assert fake.calls == []


@pytest.mark.parametrize(
    ("scenario", "error_name", "words"),
    [
        ("lib_not_found", "LibraryNotFound", ["NVML library not found", "no NVIDIA driver"]),
        ("driver_not_loaded", "DriverNotLoaded", ["driver not loaded"]),
        ("no_permission", "NoPermission", ["no permission", "container"]),
    ],
)
def test_init_failure_makes_the_source_unavailable(
    monkeypatch: pytest.MonkeyPatch, scenario: Any, error_name: str, words: list[str]
) -> None:
    fake = install(monkeypatch, scenario, PID)
    source = NvmlSource(PID)
    with pytest.raises(SourceUnavailable) as raised:
        source.sample(1.0)
    message = str(raised.value)
    for word in [*words, "GPU memory is not monitored"]:
        assert word in message
    assert isinstance(raised.value.__cause__, type(error(error_name)))
    source.close()
    assert "nvmlShutdown" not in fake.calls

    ok, reason = describe()
    assert not ok
    assert reason == message


def test_missing_nvidia_ml_py(monkeypatch: pytest.MonkeyPatch) -> None:
    uninstall(monkeypatch)
    source = NvmlSource(PID)
    with pytest.raises(SourceUnavailable, match=r"nvidia-ml-py is not installed") as raised:
        source.sample(1.0)
    assert isinstance(raised.value.__cause__, ImportError)
    source.close()
    ok, reason = describe()
    assert not ok
    assert "pip install nvidia-ml-py" in reason


def test_gpu_lost_after_a_good_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, "gpu_lost", PID)
    source = NvmlSource(PID)
    assert len(memory(source.sample(1.0))) == 6
    with pytest.raises(SourceUnavailable) as raised:
        source.sample(2.0)
    assert "GPU 1 has fallen off the bus" in str(raised.value)
    assert isinstance(raised.value.__cause__, type(error("GpuIsLost")))
    source.close()
    assert fake.calls.count("nvmlShutdown") == 1
    assert fake.initialised == 0


@pytest.mark.parametrize(
    ("function", "error_name", "words"),
    [
        (
            "nvmlDeviceGetMemoryInfo",
            "NotSupported",
            ["NVML failed on GPU 0", "Not Supported", "code 3"],
        ),
        ("nvmlDeviceGetMemoryInfo", "Unknown", ["NVML failed on GPU 0", "code 999"]),
        ("nvmlDeviceGetMemoryInfo", "LibRmVersionMismatch", ["driver", "reboot"]),
        # A device query beyond memory: any error but those of a query the GPU lacks.
        ("nvmlDeviceGetPowerUsage", "GpuIsLost", ["GPU 0 has fallen off the bus"]),
        ("nvmlDeviceGetPowerUsage", "Unknown", ["NVML failed on GPU 0", "code 999"]),
        ("nvmlDeviceGetPowerUsage", "DriverNotLoaded", ["driver not loaded"]),
    ],
)
def test_device_query_failure_makes_the_source_unavailable(
    monkeypatch: pytest.MonkeyPatch, function: str, error_name: str, words: list[str]
) -> None:
    fake = install(monkeypatch, "ok", PID)

    def fail(handle: object) -> None:
        raise error(error_name)

    monkeypatch.setattr(fake.module, function, fail)
    source = NvmlSource(PID)
    with pytest.raises(SourceUnavailable) as raised:
        source.sample(1.0)
    for word in [*words, "GPU memory is not monitored"]:
        assert word in str(raised.value)
    assert isinstance(raised.value.__cause__, type(error(error_name)))
    source.close()
    assert fake.initialised == 0


def test_pid_vanished_reports_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, "pid_vanished", PID)
    source = NvmlSource(PID)
    assert values(source.sample(1.0))["gpu_process_memory_bytes", GPU0] == GIB
    later = values(source.sample(2.0))
    assert later["gpu_process_memory_bytes", GPU0] == 0
    assert later["gpu_memory_total_bytes", GPU0] == 16 * GIB


def test_process_query_not_supported_keeps_device_memory(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    install(monkeypatch, "process_query_not_supported", PID)
    source = NvmlSource(PID)
    with caplog.at_level(logging.WARNING, logger="driftwatch.sources.nvml"):
        first = values(memory(source.sample(1.0)))
        source.sample(2.0)
    assert set(first) == {
        (series, labels)
        for series in ("gpu_memory_used_bytes", "gpu_memory_total_bytes")
        for labels in (GPU0, GPU1)
    }
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2  # once per GPU, not once per tick
    assert "GPU 0 cannot report per-process memory" in warnings[0]


def test_one_unsupported_process_query_does_not_hide_the_other(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = install(monkeypatch, "ok", PID)

    def not_supported(handle: object) -> None:
        raise error("NotSupported")

    monkeypatch.setattr(fake.module, "nvmlDeviceGetGraphicsRunningProcesses", not_supported)
    assert values(NvmlSource(PID).sample(1.0))["gpu_process_memory_bytes", GPU0] == GIB


def test_memory_not_available_emits_nothing_rather_than_zero(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    install(monkeypatch, "memory_not_available", PID)
    got = values(NvmlSource(PID).sample(1.0))
    assert ("gpu_process_memory_bytes", GPU0) not in got
    assert got["gpu_memory_used_bytes", GPU0] == 1.5 * GIB
    assert got["gpu_process_memory_bytes", GPU1] == 0


def test_driver_too_old_for_the_process_query(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, "driver_too_old", PID)
    with pytest.raises(SourceUnavailable, match="driver is older") as raised:
        NvmlSource(PID).sample(1.0)
    assert isinstance(raised.value.__cause__, NVMLLibraryMismatchError)


def test_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, "ok", PID)
    fake.gpus.clear()
    source = NvmlSource(PID)
    with pytest.raises(SourceUnavailable, match="no NVIDIA GPU found"):
        source.sample(1.0)
    source.close()
    assert fake.initialised == 0
    ok, reason = describe()
    assert not ok
    assert "no NVIDIA GPU found" in reason


def test_describe(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, "ok", PID)
    assert describe() == (True, "2 GPUs, driver 550.54.15, NVML 12.550.54.15")
    assert fake.calls.count("nvmlShutdown") == 1
    assert fake.initialised == 0
    del fake.gpus[1]
    assert describe() == (True, "1 GPU, driver 550.54.15, NVML 12.550.54.15")


def test_describe_never_raises_after_init(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, "ok", PID)

    def lost() -> None:
        raise error("GpuIsLost")

    monkeypatch.setattr(fake.module, "nvmlSystemGetDriverVersion", lost)
    ok, reason = describe()
    assert not ok
    assert "fallen off the bus" in reason
    assert fake.initialised == 0


class OneSample:
    name = "fake"

    def sample(self, now: float) -> list[Sample]:
        return [Sample("rss_bytes", 1.0, now)]

    def close(self) -> None:
        pass


def test_monitor_disables_nvml_once_and_keeps_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, "gpu_lost", PID)
    target = TargetInfo(PID, 0.0, "python", ("python", "train.py"), "me", 1000)
    clock = itertools.count(1000.0, 1.0)
    monitor = Monitor("train", target, [NvmlSource(PID), OneSample()], clock=clock.__next__)

    first = monitor.tick()
    assert [(s.name, s.up) for s in first.sources] == [("nvml", True), ("fake", True)]
    assert first.values["gpu_process_memory_bytes", GPU0] == GIB

    monitor.tick()  # GPU 1 falls off the bus
    last = monitor.tick()
    nvml, other = last.sources
    assert not nvml.up
    assert "GPU 1 has fallen off the bus" in nvml.reason
    assert other.up
    history = monitor.store.get(("rss_bytes", ()))
    assert history is not None
    assert history.recent_values(10) == [1.0, 1.0, 1.0]
    assert history.latest() == (last.t, 1.0)
    assert fake.calls.count("nvmlShutdown") == 1  # closed when disabled
    monitor.close()
    assert fake.calls.count("nvmlShutdown") == 1
    assert fake.initialised == 0


# The device queries beyond memory (driftwatch/sources/nvml_queries.py).

G0_THERMAL = (("gpu", "0"), ("reason", "thermal"))
MHZ = 1e6


def readings(samples: list[Sample], series: str) -> dict[str, float]:
    """One series' values by GPU (and reason, for the clock-event reasons)."""
    return {",".join(v for _, v in s.labels): s.value for s in samples if s.series == series}


def test_fake_mirrors_the_real_pynvml_queries() -> None:
    real: Any = pytest.importorskip("pynvml")
    for name, value in CONSTANTS.items():
        assert getattr(real, name) == value, name
    for name, bit in REASONS.items():
        assert getattr(real, f"nvmlClocksEventReason{name}") == bit, name
        assert getattr(real, f"nvmlClocksThrottleReason{name}") == bit, name
    fake = FakeNvml("ok", PID).module
    for name in dir(fake):
        if name.startswith("nvml") and callable(getattr(fake, name)):
            real_parameters = inspect.signature(getattr(real, name)).parameters.values()
            required = [p.name for p in real_parameters if p.default is inspect.Parameter.empty]
            assert list(inspect.signature(getattr(fake, name)).parameters) == required, name
    fields = {name for name, _ in real.c_nvmlProcessUtilizationSample_t._fields_}
    assert fields == set(vars(ProcessUtilizationSample(1, 2, 3, 4)))
    assert {name for name, _ in real.c_nvmlUtilization_t._fields_} == {"gpu", "memory"}
    assert {name for name, _ in real.c_nvmlGpmSupport_t._fields_} == set(vars(GpmSupport(1, 1)))
    request = {name for name, _ in real.c_nvmlGpmMetricsGet_t._fields_}
    assert request == set(vars(GpmMetricsGet()))
    assert set(vars(GpmMetric())) <= {name for name, _ in real.c_nvmlGpmMetric_t._fields_}


def test_ok_reports_each_gpus_utilization_clocks_power_and_pcie(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fake = install(monkeypatch, "ok", PID)
    source = NvmlSource(PID)
    with caplog.at_level(logging.WARNING, logger="driftwatch.sources.nvml"):
        first = source.sample(1.0)
        second = source.sample(2.0)
    assert caplog.records == []
    device = {key: value for key, value in values(first).items() if key[0] not in MEMORY}
    expected: dict[tuple[str, tuple[tuple[str, str], ...]], float]
    g1_reason = (("gpu", "1"), ("reason", "power_cap"))
    expected = {
        ("gpu_utilization_ratio", GPU0): 0.9,
        ("gpu_memory_utilization_ratio", GPU0): 0.4,
        ("gpu_sm_clock_hertz", GPU0): 1980 * MHZ,
        ("gpu_sm_clock_max_hertz", GPU0): 1980 * MHZ,
        **{("gpu_clock_throttled", (*GPU0, ("reason", r))): 0.0 for r in THROTTLE_REASONS},
        ("gpu_temperature_celsius", GPU0): 65.0,
        ("gpu_power_watts", GPU0): 250.0,  # from milliwatts
        ("gpu_power_limit_watts", GPU0): 400.0,
        ("gpu_pcie_tx_bytes_per_second", GPU0): 20_000 * 1024.0,  # from KB/s
        ("gpu_pcie_rx_bytes_per_second", GPU0): 500_000 * 1024.0,
        ("gpu_process_sm_utilization_ratio", GPU0): 0.85,
        ("gpu_process_memory_utilization_ratio", GPU0): 0.38,
        ("gpu_utilization_ratio", GPU1): 0.3,
        ("gpu_memory_utilization_ratio", GPU1): 0.1,
        ("gpu_sm_clock_hertz", GPU1): 1410 * MHZ,
        ("gpu_sm_clock_max_hertz", GPU1): 1980 * MHZ,
        **{("gpu_clock_throttled", (*GPU1, ("reason", r))): 0.0 for r in THROTTLE_REASONS},
        ("gpu_clock_throttled", g1_reason): 1.0,
        ("gpu_temperature_celsius", GPU1): 50.0,
        ("gpu_power_watts", GPU1): 120.0,
        ("gpu_power_limit_watts", GPU1): 400.0,
        ("gpu_pcie_tx_bytes_per_second", GPU1): 1_000 * 1024.0,
        ("gpu_pcie_rx_bytes_per_second", GPU1): 2_000 * 1024.0,
        # another process's kernels are not ours
        ("gpu_process_sm_utilization_ratio", GPU1): 0.0,
        ("gpu_process_memory_utilization_ratio", GPU1): 0.0,
    }
    assert device == expected
    assert {s.series for s in first} | {"gpu_sm_active_ratio", "gpu_sm_occupancy_ratio"} == {
        series for series in SERIES if series.startswith("gpu_")
    }
    # GPM needs two samples: its SM activity comes from the second reading on.
    assert readings(second, "gpu_sm_active_ratio") == {"0": 0.8, "1": 0.25}
    assert readings(second, "gpu_sm_occupancy_ratio") == {"0": 0.5, "1": 0.125}
    # The maximum clock does not change: it is read once.
    assert fake.calls.count("nvmlDeviceGetMaxClockInfo") == 2
    assert fake.calls.count("nvmlDeviceGetCurrentClocksEventReasons") == 4
    assert "nvmlDeviceGetCurrentClocksThrottleReasons" not in fake.calls
    assert fake.gpm_allocated == 4  # two per GPU, kept between readings
    source.close()
    assert fake.gpm_allocated == 0  # freed, before NVML is shut down
    assert fake.calls.index("nvmlGpmSampleFree") < fake.calls.index("nvmlShutdown")


def test_process_utilization_reads_only_samples_newer_than_the_last_seen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = install(monkeypatch, "ok", PID)
    asked: list[int] = []
    query = fake.module.nvmlDeviceGetProcessUtilization

    def recording(handle: Any, timeStamp: int) -> Any:
        if handle.index == 0:
            asked.append(timeStamp)
        return query(handle, timeStamp)

    monkeypatch.setattr(fake.module, "nvmlDeviceGetProcessUtilization", recording)
    source = NvmlSource(PID)
    for t in (1.0, 2.0, 3.0):
        assert values(source.sample(t))["gpu_process_sm_utilization_ratio", GPU0] == 0.85
    assert asked[0] == 0  # everything NVML holds, at first
    assert asked[1] > asked[0]  # then the newest seen
    assert asked[2] - asked[1] == 1_000_000


@pytest.mark.parametrize("code", [ERROR_CODES["NotFound"], 0])
def test_no_process_sample_since_the_last_read_is_zero_not_an_error(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, code: int
) -> None:
    # NotFound: NVML has no sample newer than the one asked for (the GPU ran nothing);
    # pynvml raises NVMLError(NVML_SUCCESS) when its first call finds none either.
    fake = install(monkeypatch, "ok", PID)

    def none_since(handle: object, timeStamp: int) -> None:
        raise NVMLError(code)

    monkeypatch.setattr(fake.module, "nvmlDeviceGetProcessUtilization", none_since)
    with caplog.at_level(logging.WARNING, logger="driftwatch.sources.nvml"):
        got = values(NvmlSource(PID).sample(1.0))
    assert got["gpu_process_sm_utilization_ratio", GPU0] == 0.0
    assert got["gpu_process_memory_utilization_ratio", GPU1] == 0.0
    assert caplog.records == []


def test_throttling_that_starts_mid_run(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, "throttling", PID)
    source = NvmlSource(PID)
    ticks = [source.sample(float(t)) for t in range(1, 7)]
    before, after = ticks[: fake.change_from - 1], ticks[fake.change_from - 1 :]
    thermal = [values(tick)["gpu_clock_throttled", G0_THERMAL] for tick in ticks]
    assert thermal == [0.0] * len(before) + [1.0] * len(after)
    clocks = [values(tick)["gpu_sm_clock_hertz", GPU0] / MHZ for tick in ticks]
    assert clocks == [1980, 1980, 1780, 1580, 1380, 1200]  # falling, down to a floor
    assert {values(tick)["gpu_sm_clock_max_hertz", GPU0] for tick in ticks} == {1980 * MHZ}
    temperatures = [values(tick)["gpu_temperature_celsius", GPU0] for tick in ticks]
    assert temperatures == [65.0] * len(before) + [90.0] * len(after)
    for tick in ticks:  # only thermal on GPU 0; GPU 1 stays capped by power, not heat
        got = values(tick)
        assert got["gpu_clock_throttled", (*GPU0, ("reason", "power_cap"))] == 0.0
        assert got["gpu_clock_throttled", (*GPU0, ("reason", "hw_slowdown"))] == 0.0
        assert got["gpu_clock_throttled", (*GPU1, ("reason", "thermal"))] == 0.0
        assert got["gpu_clock_throttled", (*GPU1, ("reason", "power_cap"))] == 1.0


def test_utilization_dropping_while_memory_stays(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, "utilization_drop", PID)
    source = NvmlSource(PID)
    ticks = [values(source.sample(float(t))) for t in range(1, 6)]
    n = fake.change_from - 1
    assert [tick["gpu_utilization_ratio", GPU0] for tick in ticks] == [0.9] * n + [0.2] * (5 - n)
    process = [tick["gpu_process_sm_utilization_ratio", GPU0] for tick in ticks]
    assert process == [0.85] * n + [0.15] * (5 - n)
    assert {tick["gpu_process_memory_bytes", GPU0] for tick in ticks} == {GIB}
    assert {tick["gpu_memory_used_bytes", GPU0] for tick in ticks} == {1.5 * GIB}
    assert {tick["gpu_utilization_ratio", GPU1] for tick in ticks} == {0.3}


def test_queries_a_gpu_lacks_are_logged_once_and_the_rest_reported(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fake = install(monkeypatch, "queries_not_supported", PID)
    source = NvmlSource(PID)
    with caplog.at_level(logging.WARNING, logger="driftwatch.sources.nvml"):
        ticks = [values(source.sample(float(t))) for t in range(1, 5)]
    warnings = sorted(r.getMessage() for r in caplog.records)
    assert warnings == [
        "GPU 1 cannot report PCIe throughput (Not Supported): it is not monitored on that GPU",
        "GPU 1 cannot report SM activity (GPM) (GPM is not supported on this GPU): it is not "
        "monitored on that GPU",
        "GPU 1 cannot report per-process utilization (Not Supported): it is not monitored on "
        "that GPU",
    ]
    lacking = {
        "gpu_pcie_tx_bytes_per_second",
        "gpu_pcie_rx_bytes_per_second",
        "gpu_process_sm_utilization_ratio",
        "gpu_process_memory_utilization_ratio",
        "gpu_sm_active_ratio",
        "gpu_sm_occupancy_ratio",
    }
    for tick in ticks[1:]:
        on_gpu1 = {series for series, labels in tick if labels[0] == ("gpu", "1")}
        on_gpu0 = {series for series, labels in tick if labels[0] == ("gpu", "0")}
        assert on_gpu1 == on_gpu0 - lacking
        assert lacking <= on_gpu0  # GPU 0 has them all
        assert tick["gpu_utilization_ratio", GPU1] == 0.3
        assert tick["gpu_process_memory_bytes", GPU0] == GIB
    # A query found missing is not asked again: GPU 1's PCIe counters once, GPU 0's each tick.
    assert fake.calls.count("nvmlDeviceGetPcieThroughput") == 1 + 2 * 4
    assert fake.calls.count("nvmlDeviceGetProcessUtilization") == 1 + 4
    assert fake.calls.count("nvmlGpmQueryDeviceSupport") == 2
    assert fake.gpm_allocated == 2  # GPU 0's only
    source.close()
    assert fake.gpm_allocated == 0


@pytest.mark.parametrize(
    "error_name", ["NotSupported", "FunctionNotFound", "NoPermission", "InvalidArgument"]
)
def test_each_form_of_a_lacking_query_turns_only_that_query_off(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, error_name: str
) -> None:
    fake = install(monkeypatch, "ok", PID)
    calls: list[int] = []

    def lacking(handle: Any, sensor: int) -> None:
        calls.append(handle.index)
        raise error(error_name)

    monkeypatch.setattr(fake.module, "nvmlDeviceGetTemperature", lacking)
    source = NvmlSource(PID)
    with caplog.at_level(logging.WARNING, logger="driftwatch.sources.nvml"):
        ticks = [values(source.sample(float(t))) for t in range(1, 4)]
    assert calls == [0, 1]
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "GPU 0 cannot report temperature",
        "GPU 1 cannot report temperature",
    ]
    for tick in ticks:
        assert not any(series == "gpu_temperature_celsius" for series, _ in tick)
        assert tick["gpu_power_watts", GPU0] == 250.0
        assert tick["gpu_process_memory_bytes", GPU0] == GIB


def test_old_bindings_read_throttle_reasons_and_go_without_gpm(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fake = install(monkeypatch, "old_bindings", PID)
    source = NvmlSource(PID)
    with caplog.at_level(logging.WARNING, logger="driftwatch.sources.nvml"):
        ticks = [source.sample(float(t)) for t in range(1, 4)]
    assert [r.getMessage() for r in caplog.records] == [
        "this nvidia-ml-py has no nvmlGpmQueryDeviceSupport: GPU SM activity (GPM) is not "
        "monitored (install a newer nvidia-ml-py)"
    ]
    assert fake.calls.count("nvmlDeviceGetCurrentClocksThrottleReasons") == 2 * 3
    assert readings(ticks[-1], "gpu_clock_throttled")["1,power_cap"] == 1.0
    assert not any(s.series.startswith("gpu_sm_active") for tick in ticks for s in tick)
    source.close()


def test_gpm_waits_for_its_shortest_interval_and_frees_its_samples_when_lacking(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = install(monkeypatch, "ok", PID)
    source = NvmlSource(PID)
    source.sample(1.0)
    # 50 ms later (the shortest sampling interval): too soon for GPM, the rest is read.
    soon = readings(source.sample(1.05), "gpu_sm_active_ratio")
    assert soon == {}
    assert readings(source.sample(1.2), "gpu_sm_active_ratio") == {"0": 0.8, "1": 0.25}
    fake.gpus[0].gpm = False  # e.g. MIG mode turned on: sampling is not supported any more
    source.sample(2.0)
    assert fake.gpm_allocated == 2  # GPU 0's two samples freed when its GPM query went off
    source.close()
    assert fake.gpm_allocated == 0


def test_throttling_through_the_monitor_and_the_exposition(
    monkeypatch: pytest.MonkeyPatch, promtool: str
) -> None:
    install(monkeypatch, "throttling", PID)
    target = TargetInfo(PID, 0.0, "python", ("python", "train.py"), "me", 1000)
    clock = itertools.count(1000.0, 1.0)
    monitor = Monitor("train", target, [NvmlSource(PID)], clock=clock.__next__)
    for _ in range(4):
        snapshot = monitor.tick()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DriftwatchCollector(lambda: [snapshot]))
    text = generate_latest(registry).decode()
    assert 'driftwatch_gpu_clock_throttled{gpu="0",reason="thermal"} 1.0' in text
    assert 'driftwatch_gpu_sm_clock_hertz{gpu="0"} 1.58e+09' in text
    assert 'driftwatch_gpu_process_sm_utilization_ratio{gpu="0",run="train"} 0.85' in text
    done = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "", done.stdout
    monitor.close()
