"""The `optim` section and the LR `schedule` (its chained stages)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from hpctrain.config.sections.base import Section


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
    type: Literal["linear", "cosine", "constant", "exponential"] = Field(
        description="Shape of the LR factor in this stage (linear warmup/cooldown, cosine decay, constant, "
        "exponential decay: start_factor x gamma per update or per epoch)."
    )
    num_updates: int = Field(
        description="Updates this stage lasts; -1 = the rest of the run (at most one stage). Milestones are "
        "cumulative: a stage starts where the previous ones end."
    )
    start_factor: float = Field(1.0, ge=0, description="LR factor at the start of the stage.")
    end_factor: float = Field(1.0, ge=0, description="LR factor at the end of the stage.")
    gamma: float | None = Field(
        None, gt=0, description="exponential only: the factor is multiplied by gamma every `gamma_every`."
    )
    gamma_every: Literal["update", "epoch"] = Field(
        "update",
        description="exponential only: apply gamma after every update, or after every epoch (updates per epoch "
        "from the data set's size and the global batch; a streaming data set without a size is refused).",
    )

    @model_validator(mode="after")
    def _gamma_for_exponential(self) -> ScheduleStage:
        if (self.type == "exponential") != (self.gamma is not None):
            raise ValueError("gamma is required by an exponential stage, and only by one")
        return self

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
