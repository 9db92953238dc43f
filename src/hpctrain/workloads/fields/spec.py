"""Config of the fields workload (pydantic only: importable on login nodes without torch or NumPy)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from hpctrain.config.schema import MAY_CHANGE, ConfigBase, DataConfigBase, ModelConfigBase
from hpctrain.workloads.registry import WorkloadSpec

PARAMETERS = ("omega_m", "sigma_8")


class FieldsData(DataConfigBase):
    type: Literal["fields"] = "fields"
    input_paths: ClassVar[tuple[str, ...]] = ("path",)
    kind: Literal["gaussian", "lognormal", "lpt", "2lpt", "des"] = Field(
        "gaussian",
        description="The maps: generated as a Gaussian random field, its lognormal transform, a 2-D LPT toy "
        "(lpt), or a projected slab of a 3-D universe evolved with second-order Lagrangian perturbation theory "
        "(2lpt); or des: your survey's maps, read from data.path (DIR/train/maps.npy (n, N, N) and "
        "DIR/train/params.npy (n, 2: Omega_m, sigma_8), val/ and test/ alike; see docs/fields.md).",
    )
    size: int = Field(64, ge=8, description="Map side in pixels (even; maps are size x size).")
    box_size: float = Field(1000.0, gt=0, description="Map side in Mpc/h (sets the k range the map sees).")
    omega_m: tuple[float, float] = Field((0.1, 0.5), description="Prior box of Omega_m: uniform in [lo, hi].")
    sigma_8: tuple[float, float] = Field((0.6, 1.0), description="Prior box of sigma_8: uniform in [lo, hi].")
    n_train: int = Field(
        16384,
        ge=1,
        description="Training maps (generated on the fly from data_seed); with data.path, set: the first n_train "
        "of its maps (TRAIN_SAMPLES).",
    )
    n_val: int = Field(
        1024,
        ge=0,
        description="Validation maps (0 = no validation); with data.path, set: the first n_val of its validation "
        "maps (VAL_SAMPLES).",
    )
    n_test: int = Field(
        1024,
        ge=0,
        description="Test maps (held out; never seen by training or validation); with data.path, set: the first "
        "n_test of its test maps.",
    )
    data_seed: int = Field(
        2024, ge=0, description="Seed of the maps; each map's stream is (seed, split, index)."
    )
    path: str | None = Field(
        None,
        description="Folder written by `hpctrain data generate --kind fields` (with train/, val/, test/); "
        "when set, maps are read from its shards instead of generated, and kind/size/box/prior come from it.",
    )
    cache_val: bool = Field(
        True,
        description="Keep the validation maps in memory after the first evaluation.",
        json_schema_extra=MAY_CHANGE,
    )

    @model_validator(mode="after")
    def _survey_maps_named(self) -> FieldsData:
        if self.kind == "des" and self.path is None:
            raise ValueError(
                "data.kind=des reads your survey maps from data.path, which is not set: set data.path=DIR holding "
                "train/maps.npy (n, N, N) and train/params.npy (n, 2: Omega_m, sigma_8) (docs/fields.md)"
            )
        return self

    @field_validator("size")
    @classmethod
    def _even(cls, value: int) -> int:
        if value % 2:
            raise ValueError("must be even (real FFTs of the map)")
        return value

    @field_validator("omega_m", "sigma_8")
    @classmethod
    def _box(cls, value: tuple[float, float]) -> tuple[float, float]:
        lo, hi = value
        if not 0 < lo < hi:
            raise ValueError(f"prior box must satisfy 0 < lo < hi, got [{lo}, {hi}]")
        return value


class FieldCNNConfig(ModelConfigBase):
    type: Literal["field_cnn"] = "field_cnn"
    widths: list[int] = Field(
        [16, 32, 64], description="Channels per stage; each stage after the first halves the resolution."
    )
    stem_stride: int = Field(
        2,
        ge=1,
        le=4,
        description="Stride of the first convolution (2 quarters the cost; the map's large and "
        "intermediate scales, where Omega_m shows, survive).",
    )
    blocks: int = Field(1, ge=1, description="Residual blocks per stage.")
    groups: int = Field(8, ge=1, description="GroupNorm groups (each width must be divisible by it).")
    head_hidden: int = Field(64, ge=1, description="Width of the hidden layer of the regression head.")
    targets: list[Literal["omega_m", "sigma_8"]] = Field(
        ["omega_m", "sigma_8"], description="Parameters to predict (scaled to [-1, 1] over the prior box)."
    )
    loss: Literal["gaussian_nll", "mse", "mae", "rmse"] = Field(
        "gaussian_nll", description="gaussian_nll predicts a mean and a log-variance per parameter."
    )
    channels_last: bool = Field(
        True,
        description="channels-last memory format on GPU (ignored on CPU).",
        json_schema_extra=MAY_CHANGE,
    )

    @model_validator(mode="after")
    def _consistent(self) -> FieldCNNConfig:
        if not self.widths:
            raise ValueError("widths must name at least one stage")
        bad = [w for w in self.widths if w <= 0 or w % self.groups]
        if bad:
            raise ValueError(f"widths {bad} are not positive multiples of groups={self.groups}")
        if not self.targets or len(set(self.targets)) != len(self.targets):
            raise ValueError(f"targets must be a non-empty list without repeats, got {self.targets}")
        return self


class FieldsRun(ConfigBase):
    """The full configuration as the fields task sees it (its type; the registry builds the full union)."""

    model: FieldCNNConfig
    data: FieldsData


WORKLOAD = WorkloadSpec(name="fields", models={"field_cnn": FieldCNNConfig}, data=[FieldsData])
