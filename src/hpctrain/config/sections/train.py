"""The `train` section and its parts: early stopping, the profiler window, compile modes, loss spikes."""

from __future__ import annotations

import typing
from typing import Any, Literal

from pydantic import Field, field_validator

from hpctrain.config.sections.base import GROWS, IDENTITY, MAY_CHANGE, Section


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
