"""What the hardware does while a run trains: per local GPU (NVML) and the process side (psutil).

A daemon thread samples every `logging.gpu_every_seconds` and keeps the latest values; the trainer adds them to
its scalars at log steps, so metrics.jsonl, TensorBoard and W&B get them without a per-update cost and without
the training loop waiting on NVML. Sampling never raises into training: a sample that fails is skipped, and a
machine without NVML (no NVIDIA driver, a CPU node, a Mac) has a `note` saying that GPU monitoring is off, which
the trainer prints once as a console line.

Per GPU i (the NVML index of the local devices this process may see):
  gpu{i}_util_pct, gpu{i}_mem_used_gb, gpu{i}_power_w, gpu{i}_temp_c
Process side:
  rss_gb            resident memory of this process
  workers_cpu_pct   CPU use of its child processes (DataLoader workers) summed, in % of one core
  workers           how many child processes there are
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import Any

log = logging.getLogger(__name__)


def _visible_indices(count: int) -> list[int]:
    """The NVML indices of the GPUs this process sees: CUDA_VISIBLE_DEVICES when it lists numbers."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or visible.strip() == "":
        return list(range(count))
    indices = []
    for part in visible.split(","):
        part = part.strip()
        if part.isdigit() and int(part) < count:
            indices.append(int(part))
    return indices  # UUID forms are not mapped: those GPUs are not sampled


class GpuSampler:
    """NVML readings per visible GPU. `available` is False (and `why` says why) without NVML."""

    def __init__(self) -> None:
        self.available, self.why = False, ""
        self._nvml: Any = None
        self._handles: list[tuple[int, Any]] = []
        try:
            import pynvml

            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            self._handles = [(i, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in _visible_indices(count)]
            self._nvml = pynvml
            self.available = bool(self._handles)
            self.why = "" if self._handles else "NVML sees no GPU for this process"
        except Exception as exc:  # ImportError, NVMLError (no driver), OSError (no libnvidia-ml)
            self.why = f"NVML not available ({type(exc).__name__}: {exc})"

    def sample(self) -> dict[str, float]:
        out: dict[str, float] = {}
        nvml = self._nvml
        for index, handle in self._handles:
            readings = {
                "util_pct": lambda h: float(nvml.nvmlDeviceGetUtilizationRates(h).gpu),
                "mem_used_gb": lambda h: nvml.nvmlDeviceGetMemoryInfo(h).used / 1e9,
                "power_w": lambda h: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0,  # milliwatts
                "temp_c": lambda h: float(nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)),
            }
            for name, read in readings.items():
                try:
                    out[f"gpu{index}_{name}"] = read(handle)
                except Exception:  # a reading this GPU does not support (power on some boards): left out
                    continue
        return out

    def close(self) -> None:
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
            self._nvml = None


class ProcessSampler:
    """This process's resident memory and its child processes' (DataLoader workers') CPU share."""

    def __init__(self) -> None:
        import psutil

        self._psutil = psutil
        self._me = psutil.Process()
        self._children: dict[int, Any] = {}

    def sample(self) -> dict[str, float]:
        psutil = self._psutil
        out = {"rss_gb": self._me.memory_info().rss / 1e9}
        cpu, alive = 0.0, {}
        for child in self._me.children(recursive=True):
            known = self._children.get(child.pid, child)
            try:
                # The first call of a new Process object returns 0.0 and starts its interval.
                cpu += known.cpu_percent(None)
                alive[child.pid] = known
            except psutil.Error:
                continue
        self._children = alive
        out["workers_cpu_pct"] = cpu
        out["workers"] = float(len(alive))
        return out


class Monitor:
    """The background sampler. `latest()` is what the trainer logs; `note` what it says once (empty: nothing);
    `close()` stops the thread."""

    def __init__(self, every_seconds: float, gpu: bool = True) -> None:
        self.every = every_seconds
        self._latest: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._gpu = GpuSampler() if gpu else None
        # Said by the trainer as one of its console lines (a `logging` record came out timestamped among them).
        self.note = f"GPU monitoring is off: {self._gpu.why}" if self._gpu and not self._gpu.available else ""
        self._proc = ProcessSampler()
        self._sample()
        self._thread = threading.Thread(target=self._run, name="hpctrain-monitor", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        values = self._proc.sample()
        if self._gpu is not None and self._gpu.available:
            values.update(self._gpu.sample())
        with self._lock:
            self._latest = values

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self._sample()
            except Exception as exc:  # never into training; the next sample may work
                log.debug("monitor sample failed: %s", exc)

    def latest(self) -> dict[str, float]:
        with self._lock:
            return dict(self._latest)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        if self._gpu is not None:
            self._gpu.close()


class NoMonitor:
    """The stand-in when monitoring is off: nothing sampled, nothing logged, nothing to say."""

    note = ""

    def latest(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        pass


def build_monitor(every_seconds: float, gpu: bool = True) -> Monitor | NoMonitor:
    return Monitor(every_seconds, gpu) if every_seconds > 0 else NoMonitor()
