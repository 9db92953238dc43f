"""Pydantic section models of an hpctrain configuration.

Every section forbids unknown keys and documents each field. The model and data sections are discriminated
unions on `type` whose members belong to the workloads; `build_config_model` assembles the full type where the
workload registry is visible, so this module stays below the workloads.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, SecretStr, create_model, field_validator, model_validator

from hpctrain.config.remote import PelicanConfig, StagingConfig


class Section(BaseModel):
    """Base of every section: unknown keys are errors, values are validated on assignment too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


_HMS = re.compile(r"^(?:(\d+)-)?(\d+):(\d{1,2}):(\d{1,2})$")


def parse_duration(text: str) -> float:
    """Seconds in a SLURM-style duration: "HH:MM:SS", "D-HH:MM:SS", "MM:SS" or a plain number of minutes."""
    text = text.strip()
    if re.fullmatch(r"\d+", text):
        return float(text) * 60.0
    if re.fullmatch(r"\d+:\d{1,2}", text):
        mins, secs = text.split(":")
        return float(int(mins) * 60 + int(secs))
    match = _HMS.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a duration; use HH:MM:SS or D-HH:MM:SS")
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    if minutes >= 60 or seconds >= 60:
        raise ValueError(f"{text!r} is not a duration: minutes and seconds must be below 60")
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


class RunConfig(Section):
    name: str | None = Field(
        None,
        description="Run name: the run folder is <out_dir>/<name>. Defaults to the config file's stem (or "
        "'default'), so the same command continues the same run.",
    )
    out_dir: str = Field("logs", description="Folder that holds run folders (RESULTS_DIR in .env sets it).")
    seed: int = Field(0, ge=0, description="Seed of the model initialisation, the data order and every RNG.")

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", value):
            raise ValueError("must be letters, digits, '.', '_' or '-' (it names a folder)")
        return value


class DataConfigBase(Section):
    """Fields every data source shares; workloads subclass it with a `type` literal."""

    batch_size: int = Field(64, ge=1, description="Samples (events, maps) per batch PER GPU/process.")
    num_workers: int = Field(
        0, ge=0, description="DataLoader worker processes per rank (0 = in the main one)."
    )
    prefetch_factor: int = Field(2, ge=1, description="Batches each worker prepares ahead (num_workers > 0).")
    persistent_workers: bool = Field(False, description="Keep workers alive across epochs.")
    pin_memory: bool = Field(True, description="Pin host memory for faster copies (only used on CUDA).")
    shuffle: bool = Field(True, description="Shuffle the order of samples each epoch (seeded, resumable).")
    pelican: PelicanConfig = Field(default_factory=PelicanConfig, description="Pelican/OSDF access.")
    staging: StagingConfig = Field(
        default_factory=StagingConfig, description="Staging to node-local scratch."
    )


class ModelConfigBase(Section):
    """Base of every workload's model section; subclasses add `type: Literal[...]`."""


class OptimConfig(Section):
    name: Literal["adamw", "adam", "sgd"] = Field("adamw", description="Optimizer.")
    lr: float = Field(1e-3, ge=0, description="Learning rate before scaling (see lr_scaling).")
    momentum: float = Field(0.9, ge=0, lt=1, description="SGD momentum (0 is honoured, not replaced).")
    betas: tuple[float, float] = Field((0.9, 0.999), description="Adam/AdamW betas.")
    weight_decay: float = Field(0.0, ge=0, description="Weight decay (decoupled for AdamW).")
    eps: float = Field(1e-8, gt=0, description="Adam epsilon.")
    grad_clip_norm: float = Field(0.0, ge=0, description="Clip the global gradient norm to this (0 = off).")
    lr_scaling: Literal["none", "linear", "sqrt"] = Field(
        "none", description="Scale lr with the global batch: lr * (global/base) or lr * sqrt(global/base)."
    )
    base_batch_size: int = Field(64, ge=1, description="Global batch at which `lr` is meant (lr_scaling).")

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not all(0 <= b < 1 for b in value):
            raise ValueError("each beta must be in [0, 1)")
        return value


class ScheduleStage(Section):
    type: Literal["linear", "cosine", "constant"] = Field(
        description="Shape of the LR factor in this stage (linear warmup/cooldown, cosine decay, constant)."
    )
    num_updates: int = Field(
        description="Updates this stage lasts; -1 = the rest of the run (at most one stage). Milestones are "
        "cumulative: a stage starts where the previous ones end."
    )
    start_factor: float = Field(1.0, ge=0, description="LR factor at the start of the stage.")
    end_factor: float = Field(1.0, ge=0, description="LR factor at the end of the stage.")

    @field_validator("num_updates")
    @classmethod
    def _positive_or_rest(cls, value: int) -> int:
        if value == 0 or value < -1:
            raise ValueError("must be a positive number of updates or -1 (the rest)")
        return value


class ScheduleConfig(Section):
    stages: list[ScheduleStage] = Field(
        default_factory=list, description="Chained LR stages; empty = constant LR."
    )

    @model_validator(mode="after")
    def _one_rest(self) -> ScheduleConfig:
        if sum(stage.num_updates == -1 for stage in self.stages) > 1:
            raise ValueError("only one stage may have num_updates: -1")
        return self


class EarlyStoppingConfig(Section):
    patience: int = Field(0, ge=0, description="Evaluations without improvement before stopping (0 = off).")
    min_delta: float = Field(0.0, ge=0, description="Smallest change that counts as an improvement.")


class TrainConfig(Section):
    total_updates: int = Field(200, ge=1, description="Optimizer updates in the whole run (all hops).")
    epochs: float | None = Field(
        None, gt=0, description="If set, replaces total_updates (converted with the data set's size)."
    )
    eval_every: int = Field(0, ge=0, description="Evaluate every N updates (0 = only at the end).")
    eval_batches: int = Field(0, ge=0, description="Batches per evaluation (0 = the whole validation set).")
    grad_accum_steps: int = Field(1, ge=1, description="Batches accumulated into one update.")
    precision: Literal["fp32", "bf16", "fp16"] = Field("fp32", description="Autocast precision.")
    compile: bool = Field(False, description="torch.compile the networks.")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in backward.")
    allow_tf32: bool = Field(True, description="Allow TF32 matmuls on Ampere+ GPUs.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto = CUDA when available.")
    threads: int = Field(0, ge=0, description="torch CPU threads per process (0 = leave torch's default).")
    early_stopping: EarlyStoppingConfig = Field(default_factory=EarlyStoppingConfig)
    on_nonfinite: Literal["stop", "skip_batch"] = Field(
        "stop",
        description="A NaN/inf training loss: stop (exit 1, nothing saved after it: `latest` stays the last good "
        "checkpoint; checked at log steps and before every save, no per-update sync) or skip_batch (an "
        "optimizer step whose gradients are non-finite is skipped on every rank; costs one sync per step).",
    )
    max_nonfinite_skips: int = Field(
        10,
        ge=1,
        description="skip_batch: stop (exit 1) when this many updates in a row had to be skipped (a model that "
        "diverged, not a bad batch).",
    )


class CheckpointConfig(Section):
    every: int = Field(
        0, ge=0, description="Also save every N updates (0 = only before stops and at the end)."
    )
    every_minutes: float = Field(
        0.0,
        ge=0,
        description="Also save every this many minutes of wall time (0 = off), so a crash, OOM or lost node "
        "costs at most that much work; rank 0's clock decides for all ranks. Stretched so that saves take at "
        "most 2% of the time (a save measured at 60 s: every 50 min). The cluster presets use 30: a save of a "
        "typical model takes seconds, i.e. < 0.5% of 30 minutes.",
    )
    keep_last: int = Field(
        2, ge=1, description="Step checkpoints kept (plus `best`); never the last good one."
    )
    resume: str = Field(
        "auto", description="auto (continue the run in its folder), never, or a checkpoint path."
    )
    restart: bool = Field(
        True,
        description="true: restore everything; false: fine-tune (weights only, fresh optimizer/schedule).",
    )
    best_metric: str = Field("val_loss", description="Evaluation metric that selects the `best` checkpoint.")
    best_mode: Literal["min", "max"] = Field(
        "min", description="Whether lower or higher best_metric is better."
    )
    mirror_to: str | None = Field(
        None, description="Copy each committed checkpoint here (folder or fsspec URL)."
    )


class BudgetConfig(Section):
    time_limit: str | None = Field(
        None, description="Wall time of this process when not under SLURM, HH:MM:SS (None = unlimited)."
    )
    margin_seconds: float = Field(
        30.0, ge=0, description="Safety margin kept before the deadline after the last save."
    )
    refresh_seconds: float = Field(300.0, gt=0, description="Re-read the SLURM end time this often.")

    @field_validator("time_limit")
    @classmethod
    def _parses(cls, value: str | None) -> str | None:
        if value is not None:
            parse_duration(value)
        return value


class TensorBoardConfig(Section):
    dir: str | None = Field(None, description="Enables TensorBoard: event files under <dir>/<run_name>.")
    run_name: str | None = Field(None, description="Subfolder name (default: a timestamp, kept across hops).")
    hist_every: int = Field(0, ge=0, description="Histograms every N updates (0 = off).")
    mirror_to: str | None = Field(None, description="Copy event files here after each checkpoint commit.")


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
    api_key: SecretStr | None = Field(None, description="Secret (WANDB_API_KEY in env/.env): never printed.")


class LoggingConfig(Section):
    log_every: int = Field(10, ge=1, description="Print and record metrics every N updates.")
    progress: Literal["auto", "bar", "lines"] = Field(
        "auto", description="auto: a progress bar on a terminal, plain lines otherwise (SLURM logs)."
    )
    tensorboard: TensorBoardConfig = Field(default_factory=TensorBoardConfig)
    wandb: WandbConfig = Field(default_factory=WandbConfig)


class DistributedConfig(Section):
    backend: Literal["auto", "nccl", "gloo"] = Field("auto", description="auto: nccl on CUDA, gloo on CPU.")
    timeout_seconds: float = Field(
        300.0,
        gt=0,
        description="A collective waiting longer (e.g. a dead rank) fails the job instead of hanging.",
    )


class SlurmConfig(Section):
    partition: str | None = Field(None, description="Partition (-p).")
    account: str | None = Field(None, description="Account (-A).")
    qos: str | None = Field(None, description="Quality of service.")
    constraint: str | None = Field(None, description="Node feature constraint (-C).")
    nodes: int = Field(1, ge=1, description="Nodes per job.")
    gpus_per_node: int = Field(0, ge=0, description="GPUs per node (one task each; 0 = CPU job).")
    tasks_per_node: int | None = Field(
        None, ge=1, description="Tasks per node (default: GPUs per node or 1)."
    )
    cpus_per_task: int = Field(4, ge=1, description="CPUs per task.")
    mem: str | None = Field("16G", description="Memory per node (e.g. 16G; None = site default).")
    time: str = Field("01:00:00", description="Wall time per job hop, HH:MM:SS or D-HH:MM:SS.")
    signal_lead_seconds: int = Field(120, ge=1, description="USR1 this long before the wall time.")
    resubmit: Literal["requeue", "afterany", "none"] = Field("requeue", description="How a chain continues.")
    max_resubmits: int = Field(20, ge=0, description="Most hops after the first.")
    max_hops_without_progress: int = Field(2, ge=1, description="Stop a chain after this many idle hops.")
    launcher: Literal["srun", "torchrun"] = Field(
        "srun", description="One task per GPU, or torchrun per node."
    )
    extra_args: list[str] = Field(default_factory=list, description="Extra #SBATCH options, verbatim.")

    @field_validator("time")
    @classmethod
    def _time_parses(cls, value: str) -> str:
        parse_duration(value)
        return value


class ConfigBase(Section):
    run: RunConfig = Field(default_factory=RunConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    budget: BudgetConfig = Field(default_factory=BudgetConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    slurm: SlurmConfig = Field(default_factory=SlurmConfig)


def build_config_model(
    model_types: list[type[BaseModel]], data_types: list[type[BaseModel]], default_type: str
) -> type[ConfigBase]:
    """The full config type: ConfigBase plus `model` and `data` unions on their `type` field."""

    def union(types: list[type[BaseModel]]) -> Any:
        if len(types) == 1:
            return types[0]
        return Annotated[Union[tuple(types)], Field(discriminator="type")]  # noqa: UP007

    return create_model(  # type: ignore[call-overload,no-any-return]
        "HpctrainConfig",
        __base__=ConfigBase,
        model=(
            union(model_types),
            Field(default_factory=lambda: {"type": default_type}, validate_default=True),
        ),
        data=(
            union(data_types),
            Field(default_factory=lambda: {"type": default_type}, validate_default=True),
        ),
    )
