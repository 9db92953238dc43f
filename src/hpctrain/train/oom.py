"""Device out of memory during an update: one line that says what to change, or (train.on_oom=split) the same
update again in smaller micro-batches.

The trainer runs each update through `OomGuard.train_step` (one call; a try around the task's step costs nothing
until it raises). On `torch.OutOfMemoryError` (CUDA's, and any device's that raises torch's type):

- `stop` (default): nothing is saved after it (the update was half done: `latest` stays the last good
  checkpoint); the run ends with EXIT_OUT_OF_MEMORY and one line naming the micro-batch, the memory asked and
  free, and the settings that help. A chain, `--until-done` and `supervise` do not start it again at the same
  settings (it would run out again).
- `split`: the update is done again with every micro-batch halved and accumulated (Composer's automatic
  micro-batching): the same samples, the same weights, so the same global batch and update up to float rounding.
  The split stays for the rest of the run (kept in the checkpoint, so a resumed hop splits as the hop before it
  did). One process only: under DDP a rank that splits alone would leave its peers' gradient all-reduce.
"""

from __future__ import annotations

import gc
import logging
import re
from collections.abc import Callable
from typing import Any

import torch

from hpctrain.config.schema import ConfigBase, DataConfigBase, TrainConfig
from hpctrain.errors import OutOfMemory, UserError
from hpctrain.runtime.env import ClusterEnv
from hpctrain.train.context import Context
from hpctrain.train.task import MicroBatch, StepOutput, Task

log = logging.getLogger(__name__)

# What torch's CUDA message says, e.g. "Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of
# which 1.23 GiB is free."
_ASKED = re.compile(r"Tried to allocate ([\d.]+ [KMGT]?i?B)")
_FREE = re.compile(r"of which ([\d.]+ [KMGT]?i?B) is free")
_TOTAL = re.compile(r"total capacity of ([\d.]+ [KMGT]?i?B)")
MAX_SPLIT = 1024  # pieces per micro-batch at most: beyond it a single sample does not fit


def _found(pattern: re.Pattern[str], text: str) -> str | None:
    match = pattern.search(text)
    return match.group(1) if match else None


class OomGuard:
    """What happens when an update runs out of device memory (module docstring). A part of the checkpoint: the
    split in force (1 = none)."""

    def __init__(
        self,
        train: TrainConfig,
        data: DataConfigBase,
        task: Task[ConfigBase],
        env: ClusterEnv,
        ctx: Context,
        last_saved: Callable[[], int | None],
    ) -> None:
        """Of its sections it reads train.on_oom and, for the line, train.grad_accum_steps and data.batch_size;
        `last_saved`: the update of the last checkpoint (for the line: it is kept as it was)."""
        self.split_on = train.on_oom == "split"
        if self.split_on and env.distributed:
            raise UserError(
                f"train.on_oom=split needs one process, not {env.world_size}: a rank that splits its update "
                "alone leaves the others' gradient all-reduce; use train.on_oom=stop and lower data.batch_size"
            )
        self.train, self.data = train, data
        self.task, self.env, self.ctx, self.last_saved = task, env, ctx, last_saved
        self.split = 1  # pieces each micro-batch is cut into

    def train_step(self, micro: list[MicroBatch], step: int) -> StepOutput:
        """The task's update `step` from `micro`, through the split in force; on running out of memory, split
        further or raise OutOfMemory (errors.py: the one line, exit 78)."""
        try:
            return self.task.train_step(
                self._pieces(micro, self.split) if self.split > 1 else micro, self.ctx
            )
        except torch.OutOfMemoryError as exc:
            line = self._line(exc, micro, step)
        # Outside the except: the traceback (its frames hold the update's tensors) is gone before a retry.
        return self._again(micro, step, line)

    def _again(self, micro: list[MicroBatch], step: int, line: str) -> StepOutput:
        while True:
            self._free()
            if not self.split_on or self.split * 2 > min(MAX_SPLIT, *(m.samples for m in micro)):
                raise OutOfMemory(line)
            pieces = self._pieces(micro, self.split * 2, strict=True)
            if pieces is None:
                raise OutOfMemory(f"{line} (train.on_oom=split cannot halve this workload's batches)")
            self.split *= 2
            log.warning(
                "out of memory at update %d: micro-batches split into %d pieces and accumulated (the global batch "
                "and the update stay the same; kept for the rest of the run)",
                step,
                self.split,
            )
            try:
                return self.task.train_step(pieces, self.ctx)
            except torch.OutOfMemoryError as exc:
                line = self._line(exc, micro, step)

    def _pieces(self, micro: list[MicroBatch], split: int, strict: bool = False) -> Any:
        """Every micro-batch cut into `split` pieces (halved log2(split) times), each weighted by its samples.
        `strict` (a new split): None when one cannot be halved; else (the split in force) such a piece, e.g. an
        epoch's short last batch, stays whole."""
        out = micro
        for _ in range(split.bit_length() - 1):
            halved: list[MicroBatch] = []
            for m in out:
                halves = self.task.halve_batch(m.data)
                if halves is None:
                    if strict:
                        return None
                    halved.append(m)
                    continue
                for half in halves:
                    n = self.task.batch_samples(half)
                    if n:
                        halved.append(MicroBatch(half, m.weight * n / m.samples, n))
            out = halved
        return out

    def _free(self) -> None:
        """What the failed attempt left: its gradients (a half-accumulated update) and counts, the GradScaler's
        record of optimizers it unscaled, and the allocator's cached blocks."""
        for name in self.ctx.optimizers:
            self.ctx.zero_grad(name)
        self.ctx.backwards = 0
        if self.ctx.spikes is not None:  # skip_batch: the half-done update's loss is no step's
            self.ctx.spikes.forget()
        if self.ctx.scaler is not None:
            self.ctx.scaler._per_optimizer_states.clear()  # else unscale_() refuses the retry's "second" call
        gc.collect()
        if self.ctx.device.type == "cuda":
            torch.cuda.empty_cache()

    def _line(self, exc: torch.OutOfMemoryError, micro: list[MicroBatch], step: int) -> str:
        """The one line: where, the micro-batch, the memory asked and free, and the settings that help."""
        asked, free, total = (_found(rx, str(exc)) for rx in (_ASKED, _FREE, _TOTAL))
        if free is None and self.ctx.device.type == "cuda":
            free_bytes, total_bytes = torch.cuda.mem_get_info(self.ctx.device)
            free, total = f"{free_bytes / 2**30:.2f} GiB", f"{total_bytes / 2**30:.2f} GiB"
        memory = f"asked {asked or 'more'}" + (f" with {free} free" if free else "")
        memory += f" of {total}" if total else ""
        samples = max(m.samples for m in micro) // self.split
        train, data = self.train, self.data
        where = f"{self.ctx.device}" + (f" (rank {self.env.rank})" if self.env.distributed else "")
        split = f", already split in {self.split}" if self.split > 1 else ""
        saved = self.last_saved()
        kept = (
            f"checkpoints/latest stays at update {saved}" if saved is not None else "no checkpoint was saved"
        )
        return (
            f"out of memory on {where} at update {step}: a micro-batch of {samples} samples{split} "
            f"(data.batch_size={data.batch_size} x train.grad_accum_steps={train.grad_accum_steps}) {memory}; "
            f"nothing saved after it, {kept}. Lower data.batch_size (raise train.grad_accum_steps, or set "
            "data.global_batch_size, to keep the global batch), set train.memory_budget=0.5 or "
            "train.gradient_checkpointing=true, or train.on_oom=split, then run again"
        )

    def state_dict(self) -> dict[str, Any]:
        return {"split": self.split}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A resumed hop splits as the hop before it did (its updates then round alike); a checkpoint without
        the record, or a run with on_oom=stop now, does not split."""
        self.split = int(state.get("split", 1)) if self.split_on else 1
