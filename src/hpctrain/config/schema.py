"""Pydantic section models of an hpctrain configuration.

Every section forbids unknown keys and documents each field. The model and data sections are discriminated
unions on `type` whose members belong to the workloads; `build_config_model` assembles the full type where the
workload registry is visible, so this module stays below the workloads.

Size (~620 lines): one section model after another, each field with its description and resume mark; it is
read as the config's reference (`hpctrain config show --doc` prints it) and is kept in one file for that.
"""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from hpctrain.config.identity import unknown_keys
from hpctrain.config.remote import PelicanConfig, StagingConfig
from hpctrain.config.secret_type import Secret


class Section(BaseModel):
    """Base of every section: unknown keys are errors, values are validated on assignment too."""

    # allow_inf_nan=False: `optim.lr=inf` is a typo to refuse now, not a NaN loss at update 2.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


JsonDict = dict[str, Any]  # what `json_schema_extra=` takes (pydantic exports no name for it)

# What a key means for a run that continues from its checkpoint, as `json_schema_extra=` of its field (a field
# without one takes the mark of the field holding its section; config/identity.py reads them; a test asserts
# that every key of every workload's config has one):
IDENTITY: JsonDict = {"resume": "identity"}  # another run: refused unless in checkpoint.accept_changes
MAY_CHANGE: JsonDict = {"resume": "may_change"}  # where, how fast, how it is watched: listed at start
GROWS: JsonDict = {
    "resume": "grows"
}  # the run's length: changes unless it rewrites the LR trained (train/length.py)


# The largest run.seed: torch.manual_seed takes it as is (seeding.seed_everything) and every int64 reader of a dumped
# config (YAML, JSON, TensorBoard/W&B hparams) keeps it exact; the derived streams (seeding.derive) are below it too.
SEED_MAX = 2**63 - 1

DURATION_FORMS = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"


def parse_duration(text: str) -> float:
    """Seconds in a duration written as `sbatch --time` takes it: "30" (minutes), "30:00" (MM:SS), "1:00:00",
    "2-00" (days-hours), "2-12:00", "2-12:00:00". Minutes and seconds after a colon must be below 60: SLURM
    22.05 quietly carries them over ("1:99" becomes 3 minutes), which hides a typo."""
    text = str(text).strip()
    if not re.fullmatch(r"(\d+-)?\d+(:\d+){0,2}", text):
        raise ValueError(f"{text!r} is not a duration: use {DURATION_FORMS}")
    days, _, rest = text.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if any(p >= 60 for p in parts[1:]):
        raise ValueError(f"{text!r} is not a duration: minutes and seconds after a colon must be below 60")
    if days:  # days-hours[:minutes[:seconds]]
        hours, minutes, seconds = (*parts, 0, 0)[:3]
        hours += 24 * int(days)
    elif len(parts) == 3:
        hours, minutes, seconds = parts
    else:  # minutes[:seconds]
        hours, minutes, seconds = 0, parts[0], (parts[1] if len(parts) == 2 else 0)
    return float((hours * 60 + minutes) * 60 + seconds)


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


class EarlyStoppingConfig(Section):
    patience: int = Field(0, ge=0, description="Evaluations without improvement before stopping (0 = off).")
    min_delta: float = Field(0.0, ge=0, description="Smallest change that counts as an improvement.")


class ProfileConfig(Section):
    """A window of updates run under torch.profiler; nothing is profiled outside it."""

    start: int = Field(10, ge=0, description="Update count at which the profiler starts (its wait ends).")
    warmup: int = Field(
        2, ge=0, description="Updates traced but discarded first (the profiler's own warm-up)."
    )
    active: int = Field(5, ge=1, description="Updates recorded.")
    record_shapes: bool = Field(False, description="Record operator input shapes.")
    with_stack: bool = Field(False, description="Record Python stacks (slower; for the flame view).")
    memory: bool = Field(False, description="Profile memory allocations (the TensorBoard memory view).")
    ranks: Literal["0", "all"] = Field("0", description="Which ranks profile: rank 0, or every rank.")


CompileMode = Literal["auto", "off", "default", "reduce-overhead", "max-autotune"]


def as_compile_mode(value: Any) -> Any:
    """A boolean (the old form, also typed as yes/no/1/0) as default/off."""
    text = str(value).lower()
    if text in ("true", "yes", "1"):
        return "default"
    if text in ("false", "no", "0"):
        return "off"
    return value


class SpikeConfig(Section):
    window: int = Field(
        100,
        ge=5,
        description="Losses in the running window a loss is compared with (judged once it is full).",
    )
    threshold: float = Field(
        10.0,
        gt=0,
        description="A spike: a loss above the window's median by more than threshold x its MAD (scaled to a "
        "standard deviation, 1.4826 x MAD, and at least 1% of the median).",
    )
    max_in_row: int = Field(
        5,
        ge=1,
        description="warn, skip_batch: this many spikes in a row are the loss's new level, not spikes: the window "
        "starts again from them.",
    )
    lr_factor: float = Field(
        0.5,
        gt=0,
        lt=1,
        description="rewind: the LR is multiplied by this at each rewind, for the rest of the run.",
    )
    max_rewinds: int = Field(
        3,
        ge=1,
        description="rewind: a spike that comes back after this many rewinds to the same checkpoint stops the run "
        "(exit 1, nothing saved after it).",
    )


class TrainConfig(Section):
    total_updates: int = Field(
        200,
        ge=1,
        description="Optimizer updates in the whole run (all hops). Changed when the run continues: taken when the "
        "LR schedule gives the updates so far the same LR (e.g. a constant LR), else only with "
        "checkpoint.accept_changes=[train.total_updates].",
        json_schema_extra=GROWS,
    )
    epochs: float | None = Field(
        None,
        gt=0,
        description="If set, replaces total_updates (converted with the data set's size).",
        json_schema_extra=GROWS,
    )
    eval_every: int = Field(
        0, ge=0, description="Evaluate every N updates (0 = only at the end).", json_schema_extra=MAY_CHANGE
    )
    eval_batches: int = Field(
        0,
        ge=0,
        description="Batches per evaluation (0 = the whole validation set).",
        json_schema_extra=MAY_CHANGE,
    )
    grad_accum_steps: int = Field(
        1, ge=1, description="Batches accumulated into one update.", json_schema_extra=IDENTITY
    )
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32", description="Autocast precision.", json_schema_extra=IDENTITY
    )
    compile: CompileMode | dict[str, CompileMode] = Field(
        "auto",
        description="torch.compile mode of the networks: auto (default on CUDA, off on CPU and MPS), off, "
        "default, reduce-overhead or max-autotune (true = default, false = off); a mapping network -> mode for "
        "workloads with several networks, e.g. {generator: max-autotune, critic: off} (networks not named stay "
        "off). The first updates compile (seconds to a minute): they are booked as compile time, never as step "
        "time, so the time budget's step estimate stays that of a compiled step.",
        json_schema_extra=MAY_CHANGE,
    )
    compile_background: bool | None = Field(
        None,
        description="Compile in a helper process while the hop trains eagerly, then switch to the compiled "
        "networks (their first call then finds the kept compiled code): the hop trains through the compile. "
        "null = on CUDA with one process (on a few CPU cores the helper and the training compete and it does "
        "not pay), and anywhere with one process in a hop with under 10 minutes left whose networks are not in "
        "the kept cache (a cold compile in the training process could outlast the deadline; false keeps it "
        "there, with one process); true also on CPU. Needs memory for one more step on the device; under "
        "DDP the networks compile in the training processes. The eager updates before the switch round "
        "differently from compiled ones, so a resumed hop does not retrace an uninterrupted run bit-exactly.",
        json_schema_extra=MAY_CHANGE,
    )
    memory_budget: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Share of the activation memory to keep (the rest recomputed in backward): the compiler's "
        "activation_memory_budget for compiled networks, explicit activation checkpointing (as "
        "train.gradient_checkpointing) for the others. null = keep everything.",
        json_schema_extra=MAY_CHANGE,
    )
    profile: ProfileConfig | None = Field(
        None,
        description="Profile a window of updates with torch.profiler: a trace under <run>/profile/ that "
        "TensorBoard's profiler plugin and Perfetto open, and <run>/profile/top_ops.txt. null = off.",
        json_schema_extra=MAY_CHANGE,
    )
    gradient_checkpointing: bool = Field(
        False,
        description="Recompute activations in backward (activation checkpointing of each network's blocks); "
        "every workload honours it or refuses it naming itself.",
        json_schema_extra=MAY_CHANGE,
    )
    allow_tf32: bool = Field(
        True, description="Allow TF32 matmuls on Ampere+ GPUs.", json_schema_extra=MAY_CHANGE
    )
    device: Literal["auto", "cpu", "cuda", "mps"] = Field(
        "auto",
        description="auto = CUDA when available, else CPU; mps = an Apple GPU, where this torch has it (one "
        "process).",
        json_schema_extra=MAY_CHANGE,
    )
    threads: int = Field(
        0,
        ge=0,
        description="torch CPU threads per process (0 = the allocation's cores: the fewer of "
        "SLURM_CPUS_PER_TASK and the CPU affinity mask, split over torchrun's processes on a node; a single "
        "CPU process takes only the cores other work leaves free while it starts, and keeps that count in its "
        "later hops on the same cores; printed at start).",
        json_schema_extra=MAY_CHANGE,
    )
    early_stopping: EarlyStoppingConfig = Field(
        default_factory=EarlyStoppingConfig, json_schema_extra=MAY_CHANGE
    )
    on_nonfinite: Literal["stop", "skip_batch"] = Field(
        "stop",
        description="A NaN/inf training loss: stop (exit 1, nothing saved after it: `latest` stays the last good "
        "checkpoint; checked at log steps and before every save, no per-update sync) or skip_batch (an "
        "optimizer step whose gradients are non-finite is skipped on every rank; costs one sync per step).",
        json_schema_extra=MAY_CHANGE,
    )
    max_nonfinite_skips: int = Field(
        10,
        ge=1,
        description="skip_batch: stop (exit 1) when this many updates in a row had to be skipped (a model that "
        "diverged, not a bad batch).",
        json_schema_extra=MAY_CHANGE,
    )
    on_spike: Literal["off", "warn", "skip_batch", "rewind"] = Field(
        "off",
        description="A loss spike (train.spike's rule): warn (checked where the losses are read anyway, no cost per "
        "update), skip_batch (the optimizer step is skipped on every rank; one host sync per step, and one "
        "small collective under DDP) or rewind (back to the last checkpoint with the LR multiplied by "
        "train.spike.lr_factor; nothing is saved between the spike and the rewind). off = only NaN/inf is "
        "guarded (train.on_nonfinite).",
        json_schema_extra=MAY_CHANGE,
    )
    spike: SpikeConfig = Field(default_factory=SpikeConfig, json_schema_extra=MAY_CHANGE)
    on_oom: Literal["stop", "split"] = Field(
        "stop",
        description="Device out of memory in an update: stop (exit 78 with one line naming the micro-batch, the "
        "memory asked and free and the settings that help; nothing saved after it; chains and supervise do not "
        "start it again) or split (one process: the update again with its micro-batches halved and "
        "accumulated, the same global batch; kept for the rest of the run).",
        json_schema_extra=MAY_CHANGE,
    )

    requeue_exit_code: int = Field(
        75,
        description="The process's exit code for a resumable stop (time budget or a signal; the state was saved "
        "first): 75 (EX_TEMPFAIL) for SLURM chains and `--until-done`; 85 for HTCondor's self-checkpointing "
        "(`checkpoint_exit_code = 85`, hpc/condor/). 3-127, not 0, 1 or 2 (finished, failure, bad input).",
        json_schema_extra=MAY_CHANGE,
    )

    @field_validator("requeue_exit_code")
    @classmethod
    def _requeue_code(cls, value: int) -> int:
        if not 3 <= value <= 127:
            raise ValueError(
                "must be 3-127: 0, 1 and 2 mean finished, failure and bad input, and 128 and up a death by a "
                "signal (75 for SLURM, 85 for HTCondor)"
            )
        return value

    @field_validator("compile", mode="before")
    @classmethod
    def _compile_bools(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {name: as_compile_mode(mode) for name, mode in value.items()}
        value = as_compile_mode(value)
        if value not in typing.get_args(CompileMode):
            raise ValueError(
                "must be auto, off, default, reduce-overhead or max-autotune, or a mapping network -> mode"
            )
        return value


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
        "auto",
        description="auto (continue the run in its folder), never (start afresh; a previous run in the folder "
        "is moved to old-<time>/), latest (continue; refused when the folder holds no checkpoint), best or "
        "step_N (go back to this run's best.pt or its checkpoint of update N, once: later hops continue), or a "
        "checkpoint file or run folder to start from while the folder has none (also pelican:// or osdf://: "
        "staged to scratch and checked against its SHA-256 sidecar; a remote folder's `latest` is read).",
    )
    restart: bool = Field(
        True,
        description="true: restore everything; false: fine-tune (weights only, fresh optimizer/schedule).",
    )
    best_metric: str = Field(
        "auto",
        description="Evaluation metric that selects the `best` checkpoint (and that early stopping watches); "
        "auto: the model's own choice (muon_flow, muon_wgan: val_auc, the classifier two-sample AUC of the "
        "generator on a fixed validation subset; other models: val_loss). Changed when a run continues: the "
        "best so far was of the other metric, so best.pt is chosen afresh from the next evaluation.",
    )
    best_mode: Literal["min", "max"] = Field(
        "min", description="Whether lower or higher best_metric is better (changed: as best_metric)."
    )
    mirror_to: str | None = Field(
        None,
        description="Copy each committed checkpoint into <mirror_to>/<run name>/checkpoints/ (a folder or fsspec "
        "URL; runs sharing it keep apart).",
    )
    dir: str | None = Field(
        None,
        description="A pelican:// or osdf:// folder that holds this run's checkpoints, so that a chain can move "
        "between clusters sharing only the federation: the run writes into its local working copy "
        "(<run folder>/checkpoints, on scratch), uploads each commit there in the background (files first, "
        "`latest` last), and a hop that starts with an empty working copy downloads the latest checkpoint from "
        "there. One run's alone (claimed by its name: another run is refused). None: the run folder only.",
    )
    accept_changes: list[str] = Field(
        default_factory=list,
        description="Identity keys (or whole sections, e.g. optim) allowed to differ from the checkpoint's when "
        "this run continues, e.g. [optim.lr] for a new learning rate for the rest of the run, or "
        "[train.total_updates] for a new length that rewrites the LR schedule (extending a finished cosine run); "
        "recorded in the checkpoint and chain.json. A single key or a comma-separated string works too.",
    )

    @field_validator("dir")
    @classmethod
    def _remote_dir(cls, value: str | None) -> str | None:
        if value is not None and not value.lower().startswith(("pelican://", "osdf://")):
            raise ValueError(
                f"{value!r}: give a pelican:// or osdf:// folder (local checkpoints live in the run folder: "
                "set run.out_dir)"
            )
        return value

    @field_validator("accept_changes", mode="before")
    @classmethod
    def _list_of_keys(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [key.strip() for key in value.split(",") if key.strip()]
        return value


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
