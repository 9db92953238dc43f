"""The run's own sections: `run` (name, folder, seed) and the bases of every workload's `data` and `model`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from pydantic import Field, field_validator

from hpctrain.config.remote import PelicanConfig, StagingConfig
from hpctrain.config.sections.base import IDENTITY, MAY_CHANGE, SEED_MAX, Section


class RunConfig(Section):
    name: str | None = Field(
        None,
        description="Run name: the run folder is <out_dir>/<name>. Default (automatic): the config file's "
        "stem, <stem>-<preset> with a --preset (each sbatch template implies its own: multi_gpu.sh -> "
        "multi_gpu), or without --config the preset's name (debug), then one token per identity key the "
        "environment or the command line set to another value (LR=2e-5 -> single_gpu-lr0.00002; a hash "
        "suffix when long). Keys that may change between hops (out_dir, slurm, logging, checkpoint) and the "
        "run's length never enter it: the same command and every hop continue the same folder. A given "
        "name wins; another run (other identity keys) is refused in an existing folder.",
        json_schema_extra=MAY_CHANGE,
    )
    out_dir: str = Field(
        "logs",
        description="Folder that holds run folders (RESULTS_DIR in .env sets it).",
        json_schema_extra=MAY_CHANGE,
    )
    seed: int = Field(
        0,
        ge=0,
        le=SEED_MAX,
        description="Seed of the model initialisation, the data order and every RNG (0 .. 2**63-1).",
        json_schema_extra=IDENTITY,
    )

    @property
    def dir(self) -> Path:
        """The run folder, <out_dir>/<name>: the one place it is computed."""
        if self.name is None:  # config loading names every run (config stem, preset): only a bare RunConfig()
            raise ValueError("run.name is not set: the run folder is <run.out_dir>/<run.name>")
        return Path(self.out_dir) / self.name

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", value):
            raise ValueError("must be letters, digits, '.', '_' or '-' (it names a folder)")
        return value


class DataConfigBase(Section):
    """Fields every data source shares; workloads subclass it with a `type` literal.

    A workload's own data fields are identity keys (data content and order) unless marked MAY_CHANGE."""

    # Names of the fields that hold input paths (a str or a list of local paths, globs, folders or URIs):
    # `hpctrain submit --check` and the start of a training check them before any work is done.
    input_paths: ClassVar[tuple[str, ...]] = ()
    if TYPE_CHECKING:
        type: str  # each workload's data config declares it as a Literal

    batch_size: int = Field(
        64,
        ge=1,
        description="Samples (events, maps) per batch PER GPU/process (or give data.global_batch_size).",
        json_schema_extra=IDENTITY,
    )
    global_batch_size: int | None = Field(
        None,
        ge=1,
        description="The alternative to batch_size (set one of them): samples per update over ALL GPUs, split "
        "over the world size and train.grad_accum_steps at start (refused when it does not divide). "
        "optim.lr_scaling uses the global batch either way.",
        json_schema_extra=IDENTITY,
    )
    num_workers: int = Field(
        0,
        ge=0,
        description="DataLoader worker processes per rank (0 = in the main one).",
        json_schema_extra=MAY_CHANGE,
    )
    prefetch_factor: int = Field(
        2,
        ge=1,
        description="Batches each worker prepares ahead (num_workers > 0).",
        json_schema_extra=MAY_CHANGE,
    )
    persistent_workers: bool = Field(
        False, description="Keep workers alive across epochs.", json_schema_extra=MAY_CHANGE
    )
    pin_memory: bool = Field(
        True,
        description="Pin host memory for faster copies (only used on CUDA).",
        json_schema_extra=MAY_CHANGE,
    )
    shuffle: bool = Field(
        True,
        description="Shuffle the order of samples each epoch (seeded, resumable).",
        json_schema_extra=IDENTITY,
    )
    pelican: PelicanConfig = Field(
        default_factory=PelicanConfig, description="Pelican/OSDF access.", json_schema_extra=MAY_CHANGE
    )
    staging: StagingConfig = Field(
        default_factory=StagingConfig,
        description="Staging to node-local scratch.",
        json_schema_extra=MAY_CHANGE,
    )
    allow_changed_files: bool = Field(
        False,
        description="On resume, the checkpoint's list of data files (names, sizes, events) must match the files "
        "found now, else the run stops naming the difference (the saved position would fall on other events). "
        "true: accept a changed list and restart the checkpoint's epoch from its start with the new files "
        "(same epoch number; see docs/data.md).",
        # how a resume treats changed files, not what the run is: may differ between hops
        json_schema_extra=MAY_CHANGE,
    )


class ModelConfigBase(Section):
    """Base of every workload's model section; subclasses add `type: Literal[...]`.

    Model fields are identity keys unless marked MAY_CHANGE (e.g. a memory format)."""

    # What checkpoint.best_metric=auto selects best.pt by, for this model (a workload's model config may say
    # otherwise: muon generators use their classifier AUC).
    BEST_METRIC: ClassVar[str] = "val_loss"
    if TYPE_CHECKING:
        type: str  # each workload's model config declares it as a Literal
