"""The root model of an hpctrain configuration, assembled from its sections (config/sections/), and the one
name every reader imports them by.

Every section forbids unknown keys and documents each field. The model and data sections are discriminated
unions on `type` whose members belong to the workloads; `build_config_model` assembles the full type where the
workload registry is visible, so this module stays below the workloads. `hpctrain config show --doc` prints the
sections as the config's reference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Union

from pydantic import BaseModel, Field, create_model, model_validator

from hpctrain.config.identity import unknown_keys
from hpctrain.config.sections.base import (
    DURATION_FORMS,
    GROWS,
    IDENTITY,
    MAY_CHANGE,
    SEED_MAX,
    JsonDict,
    Section,
    parse_duration,
)
from hpctrain.config.sections.checkpoint import CheckpointConfig
from hpctrain.config.sections.job import BudgetConfig, DistributedConfig, SlurmConfig
from hpctrain.config.sections.optim import OptimConfig, ScheduleConfig, ScheduleStage
from hpctrain.config.sections.run import DataConfigBase, ModelConfigBase, RunConfig
from hpctrain.config.sections.tracking import LoggingConfig, TensorBoardConfig, WandbConfig
from hpctrain.config.sections.train import (
    CompileMode,
    EarlyStoppingConfig,
    ProfileConfig,
    SpikeConfig,
    TrainConfig,
    as_compile_mode,
)

__all__ = [
    "DURATION_FORMS",
    "GROWS",
    "IDENTITY",
    "MAY_CHANGE",
    "SEED_MAX",
    "BudgetConfig",
    "CheckpointConfig",
    "CompileMode",
    "ConfigBase",
    "DataConfigBase",
    "DistributedConfig",
    "EarlyStoppingConfig",
    "JsonDict",
    "LoggingConfig",
    "ModelConfigBase",
    "OptimConfig",
    "ProfileConfig",
    "RunConfig",
    "ScheduleConfig",
    "ScheduleStage",
    "Section",
    "SlurmConfig",
    "SpikeConfig",
    "TensorBoardConfig",
    "TrainConfig",
    "WandbConfig",
    "as_compile_mode",
    "build_config_model",
    "parse_duration",
]


class ConfigBase(Section):
    # Section marks (IDENTITY, MAY_CHANGE) hold for every key inside unless a field says otherwise.
    run: RunConfig = Field(default_factory=RunConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig, json_schema_extra=IDENTITY)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig, json_schema_extra=IDENTITY)
    train: TrainConfig = Field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, json_schema_extra=MAY_CHANGE)
    budget: BudgetConfig = Field(default_factory=BudgetConfig, json_schema_extra=MAY_CHANGE)
    logging: LoggingConfig = Field(default_factory=LoggingConfig, json_schema_extra=MAY_CHANGE)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig, json_schema_extra=MAY_CHANGE)
    slurm: SlurmConfig = Field(default_factory=SlurmConfig, json_schema_extra=MAY_CHANGE)
    if TYPE_CHECKING:
        # Set by build_config_model: discriminated unions of the workloads' own sections, on `type`.
        model: ModelConfigBase
        data: DataConfigBase

    @model_validator(mode="after")
    def _best_metric_of_the_model(self) -> ConfigBase:
        """checkpoint.best_metric=auto: the model's own (ModelConfigBase.BEST_METRIC), written into the
        config so that every reader (status, reports, the next hop) sees the metric itself."""
        if self.checkpoint.best_metric == "auto" and hasattr(self, "model"):
            self.checkpoint.best_metric = type(self.model).BEST_METRIC
        return self

    @model_validator(mode="after")
    def _accepted_keys_exist(self) -> ConfigBase:
        unknown = unknown_keys(self, self.checkpoint.accept_changes)
        if unknown:
            raise ValueError(
                f"checkpoint.accept_changes: {', '.join(map(repr, unknown))} is not a config key "
                "(give dotted keys such as optim.lr, or a section such as optim)"
            )
        return self


def build_config_model(
    model_types: list[type[BaseModel]], data_types: list[type[BaseModel]], default_type: str
) -> type[ConfigBase]:
    """The full config type: ConfigBase plus `model` and `data` unions on their `type` field."""

    def union(types: list[type[BaseModel]]) -> Any:
        if len(types) == 1:
            return types[0]
        return Annotated[Union[tuple(types)], Field(discriminator="type")]  # noqa: UP007

    return create_model(
        "HpctrainConfig",
        __base__=ConfigBase,
        model=(
            union(model_types),
            Field(
                default_factory=lambda: {"type": default_type},
                validate_default=True,
                json_schema_extra=IDENTITY,
            ),
        ),
        data=(
            union(data_types),
            Field(
                default_factory=lambda: {"type": default_type},
                validate_default=True,
                json_schema_extra=IDENTITY,
            ),
        ),
    )
