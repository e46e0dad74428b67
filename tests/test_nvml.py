from __future__ import annotations

import itertools
import logging
from typing import Any

import pytest

from driftwatch.errors import SourceUnavailable
from driftwatch.monitor import Monitor
from driftwatch.series import Sample
from driftwatch.sources.nvml import NvmlSource, describe
from driftwatch.target import TargetInfo
from tests.fake_pynvml import (
    ERROR_CODES,
    GIB,
    NVMLError,
    NVMLLibraryMismatchError,
    error,
    install,
    uninstall,
)

PID = 4242
GPU0 = (("gpu", "0"),)
GPU1 = (("gpu", "1"),)


def values(samples: list[Sample]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.series, s.labels): s.value for s in samples}


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
    assert values(samples) == {
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
    assert "pip install 'driftwatch[gpu]'" in reason


def test_gpu_lost_after_a_good_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, "gpu_lost", PID)
    source = NvmlSource(PID)
    assert len(source.sample(1.0)) == 6
    with pytest.raises(SourceUnavailable) as raised:
        source.sample(2.0)
    assert "GPU 1 has fallen off the bus" in str(raised.value)
    assert isinstance(raised.value.__cause__, type(error("GpuIsLost")))
    source.close()
    assert fake.calls.count("nvmlShutdown") == 1
    assert fake.initialised == 0


@pytest.mark.parametrize(
    ("error_name", "words"),
    [
        ("NotSupported", ["NVML failed on GPU 0", "Not Supported", "code 3"]),
        ("Unknown", ["NVML failed on GPU 0", "code 999"]),
        ("LibRmVersionMismatch", ["driver", "reboot"]),
    ],
)
def test_device_query_failure_makes_the_source_unavailable(
    monkeypatch: pytest.MonkeyPatch, error_name: str, words: list[str]
) -> None:
    fake = install(monkeypatch, "ok", PID)

    def fail(handle: object) -> None:
        raise error(error_name)

    monkeypatch.setattr(fake.module, "nvmlDeviceGetMemoryInfo", fail)
    with pytest.raises(SourceUnavailable) as raised:
        NvmlSource(PID).sample(1.0)
    for word in words:
        assert word in str(raised.value)
    assert isinstance(raised.value.__cause__, NVMLError)


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
        first = values(source.sample(1.0))
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
