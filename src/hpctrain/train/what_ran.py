"""The hop's record of what ran (track/what_ran.py) completed with what only the training process knows: torch,
CUDA, cuDNN and NCCL versions, every rank's host and GPU (one gather at the hop's start, never per update), the
driver (NVML, where nvidia-ml-py finds it)."""

from __future__ import annotations

import logging
import socket
from typing import Any

import torch

from hpctrain.runtime import dist
from hpctrain.runtime.env import ClusterEnv
from hpctrain.track.what_ran import base_record

log = logging.getLogger(__name__)


def _driver() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            driver = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML library, no driver, a container without it: the record says nothing
        return None
    return driver.decode() if isinstance(driver, bytes) else str(driver)


def _nccl() -> str | None:
    try:
        found = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
    except Exception:  # a build without NCCL
        return None
    return ".".join(map(str, found)) if isinstance(found, tuple) else str(found)


def _cudnn() -> int | None:
    backend = torch.backends.cudnn
    return backend.version() if backend.is_available() else None  # type: ignore[no-untyped-call]


def _this_process(device: torch.device) -> dict[str, Any]:
    gpu = None
    if device.type == "cuda":
        gpu = {"name": torch.cuda.get_device_name(device), "driver": _driver()}
    return {"host": socket.gethostname(), "gpu": gpu}


def hop_record(env: ClusterEnv, device: torch.device, config_file: str | None) -> dict[str, Any]:
    """The whole record on rank 0 ({} elsewhere). Every rank calls it: the hosts and GPUs are gathered."""
    mine = _this_process(device)
    every = [p for p in dist.gather_objects(mine, "hosts and GPUs") if isinstance(p, dict)]
    if not env.is_main:
        return {}
    record = base_record(env, config_file)
    cuda_ok = torch.cuda.is_available()
    record.update(
        torch=torch.__version__,
        cuda=torch.version.cuda,
        cudnn=_cudnn(),
        nccl=_nccl() if cuda_ok else None,
        hosts=sorted({str(p["host"]) for p in every}),
        gpus=[p["gpu"] for p in every if p.get("gpu")],
    )
    return record
