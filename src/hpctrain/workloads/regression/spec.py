"""Config of the regression workload (pydantic only: importable on login nodes without torch)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from hpctrain.config.schema import SEED_MAX, ConfigBase, DataConfigBase, ModelConfigBase
from hpctrain.workloads.registry import WorkloadSpec


class RegressionData(DataConfigBase):
    type: Literal["regression"] = "regression"
    n_train: int = Field(8192, ge=1, description="Training samples generated from data_seed.")
    n_val: int = Field(1024, ge=0, description="Validation samples (0 = no validation).")
    in_features: int = Field(16, ge=1, description="Input features.")
    noise: float = Field(0.1, ge=0, description="Standard deviation of the target noise.")
    data_seed: int = Field(
        1234,
        ge=0,
        le=SEED_MAX
        // 1000,  # its torch streams are seeded with data_seed * 1000 + 1 + split (task.make_dataset)
        description="Seed of the synthetic data set (fixed across runs; 0 .. 2**63/1000).",
    )


class RegressionModel(ModelConfigBase):
    type: Literal["regression"] = "regression"
    hidden: list[int] = Field([64, 64], description="Widths of the hidden layers.")
    activation: Literal["gelu", "relu", "tanh"] = Field("gelu", description="Hidden activation.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout after each hidden layer.")
    loss: Literal["mse", "mae", "rmse"] = Field("mse", description="Training loss.")


class RegressionRun(ConfigBase):
    """The full configuration as the regression task sees it (its type; the registry builds the full union)."""

    model: RegressionModel
    data: RegressionData


WORKLOAD = WorkloadSpec(name="regression", models={"regression": RegressionModel}, data=[RegressionData])
