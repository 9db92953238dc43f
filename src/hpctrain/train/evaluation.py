"""One evaluation pass over the validation set, on every rank together, and whether it improved the run."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from hpctrain.config.schema import CheckpointConfig, ConfigBase, EarlyStoppingConfig, TrainConfig
from hpctrain.runtime import dist
from hpctrain.runtime.budget import Stop, StopRequested, TimeBudget
from hpctrain.runtime.dist import ANY, Votes, vote
from hpctrain.runtime.seeding import rng_state, set_rng_state
from hpctrain.train.cadence import STOP
from hpctrain.train.counters import Counters
from hpctrain.train.task import Task, UpdateContext

# Under DDP, ranks agree whether to abandon an evaluation every this many batches (see Evaluator._sums).
EVAL_AGREE_EVERY = 4


@dataclass
class EvalResult:
    improved: bool = False
    stop_early: bool = False
    abandoned: Stop | None = None  # the stop reason that cut the evaluation short (agreed by all ranks)
    metrics: dict[str, float] = field(default_factory=dict)  # the figures of a pass that ran (every rank)
    seconds: float = 0.0  # the pass's wall time


@dataclass
class EvalVotes(Votes):
    """Every EVAL_AGREE_EVERY batches: abandon the pass if any rank must stop; go on while any rank has batches."""

    stop: Stop | None = vote(STOP, None)
    more: bool = vote(ANY, False)


class Evaluator:
    """Sums the task's evaluation figures over this rank's validation batches and all ranks; a stop (a signal,
    the deadline) cuts the pass short on every rank alike."""

    def __init__(
        self,
        task: Task[ConfigBase],
        ctx: UpdateContext,
        budget: TimeBudget,
        train: TrainConfig,
        checkpoint: CheckpointConfig,
        seed: int,
    ) -> None:
        """Of its sections it reads `train.eval_batches` (0: all) and `train.early_stopping`, and checkpoint's
        best_metric and best_mode (judge)."""
        self.task = task
        self.ctx = ctx
        self.budget = budget
        self.max_batches = train.eval_batches
        self.early_stopping = train.early_stopping
        self.checkpoint = checkpoint
        self.seed = seed
        self.batches = 0  # evaluated so far in this process: progress, for the hang watchdog

    def run(
        self,
        raw_modules: dict[str, nn.Module],
        counters: Counters,
        say: Callable[[str], None],
    ) -> EvalResult:
        """One evaluation at update `counters.step`, judged (best.pt, early stopping: `counters` updated). A pass a
        stop cut short leaves the random streams as it found them and is owed: the budget carries it in the
        checkpoint and the next hop runs it first."""
        start = time.perf_counter()
        rng = rng_state()
        sums, stop = self.sums(raw_modules)
        # every validation sample removed or skipped: no figure at all (below)
        empty = sums is not None and (not sums or sums.get("count") == 0.0)
        figures = {} if sums is None or empty else self.figures(raw_modules, counters.step)
        seconds = time.perf_counter() - start
        if sums is None:
            set_rng_state(rng)
            self.budget.eval_owed = counters.step
            say(f"evaluation at update {counters.step} cut short ({stop}): it runs after the resume")
            return EvalResult(abandoned=stop, seconds=seconds)
        self.budget.eval_owed = None
        self.budget.eval.observe(seconds)
        if empty:
            say(f"eval at update {counters.step}: the validation data gave no sample to judge")
            return EvalResult(seconds=seconds)
        metrics = {**self.task.finish_eval(sums), **figures}
        result = judge(metrics, counters, self.checkpoint, self.early_stopping)
        result.metrics, result.seconds = metrics, seconds
        return result

    @torch.no_grad()
    def sums(self, raw_modules: dict[str, nn.Module]) -> tuple[dict[str, float] | None, Stop | None]:
        """Sums over the validation set and all ranks; (None, reason) when a stop cut the pass short."""
        for module in raw_modules.values():
            module.eval()
        try:
            sums, stop = self._local_sums()
        finally:
            for module in raw_modules.values():
                module.train()
        if stop is not None:
            return None, stop
        # Every rank must hold the same keys before the collective (a rank without val data adds zeros).
        keys: list[str] = dist.broadcast_object(sorted(sums))  # type: ignore[assignment]
        reduced = dist.sum_tensors({k: sums.get(k, torch.zeros((), dtype=torch.float64)) for k in keys})
        return {k: float(v) for k, v in reduced.items()}, None

    @torch.no_grad()
    def figures(self, raw_modules: dict[str, nn.Module], step: int) -> dict[str, float]:
        """The task's `model_figures`, computed on the main rank (networks in eval mode, every random stream
        as it was afterwards: a resumed run trains on bit for bit) and handed to every rank, so that all judge
        best.pt and early stopping alike."""
        figures: dict[str, float] = {}
        if self.task.env.is_main:
            state = rng_state()
            for module in raw_modules.values():
                module.eval()
            try:
                figures = self.task.model_figures(raw_modules, step)
            finally:
                for module in raw_modules.values():
                    module.train()
                set_rng_state(state)
        return dist.broadcast_object(figures)  # type: ignore[return-value]

    def _local_sums(self) -> tuple[dict[str, torch.Tensor], Stop | None]:
        """This rank's sums over its validation batches, and the agreed stop if one came first: asked before
        each batch, so a long evaluation cannot run past the walltime.

        Under DDP the ranks agree every EVAL_AGREE_EVERY batches (EvalVotes, one small collective) whether any
        rank must stop and whether any still has batches. Every rank makes the same calls, also one that ran out of
        batches or stopped early, so nobody is left waiting in a collective and all abandon together."""
        sums: dict[str, torch.Tensor] = {}
        batches: Iterator[Any] = iter(self.task.build_data("val", self.seed) or ())
        per_round = EVAL_AGREE_EVERY if dist.active() else 1
        done, more = 0, True
        while True:
            stop: Stop | None = None
            for _ in range(per_round):
                stop = self.budget.urgent_stop_reason()
                if stop is not None or not more:
                    break
                try:
                    batch = next(batches)
                except StopIteration:
                    more = False
                    break
                except StopRequested as requested:  # a staged validation set waiting for a file
                    stop = requested.reason
                    break
                out = self.task.eval_step(self.task.to_device(batch, self.ctx.device), self.ctx)
                for key, value in out.items():
                    sums[key] = (
                        sums.get(key, torch.zeros((), dtype=torch.float64)) + value.detach().double().cpu()
                    )
                done += 1
                self.batches += 1
                more = not (self.max_batches and done >= self.max_batches)
            agreed = EvalVotes(stop, more).agree()
            if agreed.stop is not None or not agreed.more:
                return sums, agreed.stop


def judge(
    metrics: dict[str, float],
    state: Counters,
    checkpoint: CheckpointConfig,
    early_stopping: EarlyStoppingConfig,
) -> EvalResult:
    """Whether `metrics` improve on `state.best` (checkpoint.best_metric, best_mode) beyond
    early_stopping.min_delta, and whether patience ran out; updates `state`."""
    key = checkpoint.best_metric
    if key not in metrics:
        return EvalResult()
    value = metrics[key]
    sign = 1.0 if checkpoint.best_mode == "min" else -1.0
    improved = state.best is None or sign * (value - state.best) < -early_stopping.min_delta
    if improved:
        state.best = value
        state.evals_without_improvement = 0
    else:
        state.evals_without_improvement += 1
    patience = early_stopping.patience
    return EvalResult(improved, bool(patience) and state.evals_without_improvement >= patience)
