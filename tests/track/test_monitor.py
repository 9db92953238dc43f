"""Hardware monitoring: a fake NVML module gives its values back per visible GPU; without NVML the monitor says
(in its note, once) that GPU monitoring is off and still samples the process side (real psutil, real child processes)."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
import types

import pytest

from hpctrain.track.monitor import GpuSampler, Monitor, NoMonitor, build_monitor


class NVMLError(Exception):
    pass


def fake_nvml(count: int = 2, fail_power: bool = False) -> types.ModuleType:
    nvml = types.ModuleType("pynvml")
    nvml.NVML_TEMPERATURE_GPU = 0
    nvml.calls = {"init": 0, "shutdown": 0}

    def init() -> None:
        nvml.calls["init"] += 1

    def power(h: int) -> int:
        if fail_power:
            raise NVMLError("Not Supported")
        return 250_000 + h  # milliwatts

    nvml.nvmlInit = init
    nvml.nvmlShutdown = lambda: nvml.calls.__setitem__("shutdown", nvml.calls["shutdown"] + 1)
    nvml.nvmlDeviceGetCount = lambda: count
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i
    nvml.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=90 + h, memory=10)
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=(h + 1) * 2_000_000_000, total=8e10)
    nvml.nvmlDeviceGetPowerUsage = power
    nvml.nvmlDeviceGetTemperature = lambda h, sensor: 60 + h
    return nvml


def test_fake_nvml_values_come_back_per_visible_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = fake_nvml(count=4)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    sampler = GpuSampler()
    assert sampler.available
    assert sampler.sample() == {
        "gpu1_util_pct": 91.0,
        "gpu1_mem_used_gb": 4.0,
        "gpu1_power_w": 250.001,
        "gpu1_temp_c": 61.0,
        "gpu3_util_pct": 93.0,
        "gpu3_mem_used_gb": 8.0,
        "gpu3_power_w": 250.003,
        "gpu3_temp_c": 63.0,
    }
    sampler.close()
    assert nvml.calls == {"init": 1, "shutdown": 1}


def test_a_reading_the_board_lacks_is_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(count=1, fail_power=True))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert set(GpuSampler().sample()) == {"gpu0_util_pct", "gpu0_mem_used_gb", "gpu0_temp_c"}


def test_without_nvml_it_says_so_once_and_samples_the_process(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    broken = types.ModuleType("pynvml")

    def no_driver() -> None:
        raise NVMLError("Driver Not Loaded")

    broken.nvmlInit = no_driver
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    worker = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # a busy child: a DataLoader worker
    try:
        with caplog.at_level(logging.INFO, logger="hpctrain.track.monitor"):
            monitor = Monitor(every_seconds=0.2)
            # until a sample has seen the busy child busy (at once when idle; its share of a loaded machine's
            # cores may take a few samples)
            deadline, values = time.monotonic() + 60, monitor.latest()
            while values.get("workers_cpu_pct", 0) <= 10 and time.monotonic() < deadline:
                time.sleep(0.2)
                values = monitor.latest()
            monitor.close()
    finally:
        worker.kill()
        worker.wait()
    # a note for the trainer's console lines, not a `logging` record (those come out timestamped among them)
    assert (
        monitor.note.startswith("GPU monitoring is off: NVML not available")
        and "Driver Not Loaded" in monitor.note
    )
    assert not [r for r in caplog.records if r.name == "hpctrain.track.monitor"]
    assert not any(k.startswith("gpu") for k in values)
    assert 0.01 < values["rss_gb"] < 20
    assert values["workers"] >= 1
    assert values["workers_cpu_pct"] > 10  # the busy child, measured over the sampling interval
    assert not monitor._thread.is_alive()


def test_off_is_a_stand_in() -> None:
    off = build_monitor(0)
    assert isinstance(off, NoMonitor) and off.latest() == {} and off.note == ""
    off.close()
