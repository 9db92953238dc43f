"""Where and how long the job runs: the time `budget`, `distributed` (backend, timeouts, hang watchdog) and
`slurm` (the sbatch settings of a chain's hops)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from hpctrain.config.sections.base import Section, parse_duration


class BudgetConfig(Section):
    time_limit: str | None = Field(
        None,
        description="Wall time of this process when not under SLURM, in any `sbatch --time` form "
        "(MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS; None = unlimited).",
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


class DistributedConfig(Section):
    backend: Literal["auto", "nccl", "gloo"] = Field("auto", description="auto: nccl on CUDA, gloo on CPU.")
    timeout_seconds: float = Field(
        300.0,
        gt=0,
        description="A collective waiting longer (e.g. a dead rank) fails the job instead of hanging.",
    )
    hang_seconds: float | None = Field(
        None,
        gt=0,
        description="Hang watchdog: no update, evaluation batch or collective for this long (after the hop's first "
        "progress; a compile counts as progress) writes every rank's stacks and the last collective each "
        "entered into <run>/hang/, says which rank is behind and ends the hop with the requeue code. Below "
        "timeout_seconds, above the longest checkpoint save. null = off.",
    )

    @model_validator(mode="after")
    def _hang_before_timeout(self) -> DistributedConfig:
        if self.hang_seconds is not None and self.hang_seconds >= self.timeout_seconds:
            raise ValueError(
                f"distributed.hang_seconds={self.hang_seconds:g} must be below distributed.timeout_seconds="
                f"{self.timeout_seconds:g} (a rank "
                "waiting in a collective ends at the timeout first, with gloo's or NCCL's error): raise "
                "distributed.timeout_seconds too"
            )
        return self


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
    time: str = Field(
        "01:00:00",
        description="Wall time per job hop, in any `sbatch --time` form: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, "
        "D-HH:MM:SS.",
    )
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
