"""The `logging` section: console cadence, the GPU monitor, TensorBoard and W&B."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from hpctrain.config.secret_type import Secret
from hpctrain.config.sections.base import MAY_CHANGE, Section


class TensorBoardConfig(Section):
    dir: str | None = Field(None, description="Enables TensorBoard: event files under <dir>/<run_name>.")
    run_name: str | None = Field(
        None, description="Subfolder name (default: <run.name>-<first hop's time>, kept across hops)."
    )
    hist_every: int = Field(0, ge=0, description="Histograms every N updates (0 = off).")
    hist_max_muons: int = Field(
        8192,
        ge=1,
        description="Values per histogram at most (e.g. muons of a batch): a seeded random subset beyond it.",
    )
    mirror_to: str | None = Field(
        None,
        description="Copy event files here after each checkpoint commit (a folder or URL; pelican:// and "
        "osdf:// with the data.pelican token, in the background).",
    )
    mirror_every_seconds: float = Field(
        0.0, ge=0, description="Also copy them every this many seconds (0 = only at checkpoint commits)."
    )


class WandbConfig(Section):
    enabled: bool = Field(False, description="Log to Weights & Biases.")
    mode: Literal["online", "offline", "disabled"] = Field(
        "offline", description="offline suits compute nodes."
    )
    project: str = Field("hpctrain", description="W&B project.")
    entity: str | None = Field(None, description="W&B entity (team or user).")
    group: str | None = Field(None, description="W&B group.")
    tags: list[str] = Field(default_factory=list, description="W&B tags.")
    dir: str | None = Field(None, description="Where offline runs are written (default: the run folder).")
    api_key: Secret = Field(
        None,
        description="Secret: from WANDB_API_KEY in .env or the environment (refused on the command line); never "
        "printed or saved.",
    )


class LoggingConfig(Section):
    log_every: int = Field(10, ge=1, description="Print and record metrics every N updates.")
    log_every_seconds: float = Field(
        60.0,
        ge=0,
        description="Print and record metrics also by time: a first line 10 s after a hop's first update (or "
        "sooner, if this is lower), then at least every N seconds, whatever log_every says; a hop that stops "
        "between log lines records its last one. 0 = by updates only.",
    )
    progress: Literal["auto", "bar", "lines"] = Field(
        "auto", description="auto: a progress bar on a terminal, plain lines otherwise (SLURM logs)."
    )
    gpu_every_seconds: float = Field(
        30.0,
        ge=0,
        description="Sample per-GPU utilisation, memory, power and temperature (NVML) and the process's memory "
        "and DataLoader workers' CPU share every N seconds, in a background thread; logged at log steps as "
        "gpu{i}_*, rss_gb, workers_cpu_pct. 0 = off. NVML only on a CUDA device; without it only the process "
        "side is sampled.",
        json_schema_extra=MAY_CHANGE,
    )
    tensorboard: TensorBoardConfig = Field(default_factory=TensorBoardConfig)
    wandb: WandbConfig = Field(default_factory=WandbConfig)
