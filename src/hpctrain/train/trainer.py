"""The trainer: counts updates, keeps to the time budget, saves and resumes exactly. It knows no model."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hpctrain.errors import EXIT_OK, EXIT_RESUMABLE, UserError
from hpctrain.runtime import dist
from hpctrain.runtime.budget import CODES, REASONS, TimeBudget
from hpctrain.runtime.env import ClusterEnv
from hpctrain.runtime.seeding import seed_everything
from hpctrain.track.base import Trackers
from hpctrain.track.chain import ChainLog, write_summary
from hpctrain.track.console import Console
from hpctrain.train.checkpoint import CheckpointStore
from hpctrain.train.context import Context
from hpctrain.train.finished import complete_finished_run
from hpctrain.train.optim import LRSchedule, apply_lr
from hpctrain.train.runlock import RunLock
from hpctrain.train.setup import Setup
from hpctrain.train.state import StateKeeper, params_sha256
from hpctrain.train.task import MicroBatch, Task

log = logging.getLogger(__name__)


@dataclass
class RunResult:
    status: str  # finished | stopped | already_finished
    reason: str
    step: int
    params_sha256: str
    exit_code: int


class Timers:
    """Seconds spent per activity, since the last log line and in total."""

    KINDS = ("data", "step", "eval", "checkpoint")

    def __init__(self) -> None:
        self.window = dict.fromkeys(self.KINDS, 0.0)
        self.total = dict.fromkeys(self.KINDS, 0.0)
        self.window_start = time.perf_counter()

    def add(self, kind: str, seconds: float) -> None:
        self.window[kind] += seconds
        self.total[kind] += seconds

    def shares(self) -> tuple[dict[str, float], float]:
        elapsed = max(time.perf_counter() - self.window_start, 1e-9)
        shares = {f"{k}_share": v / elapsed for k, v in self.window.items()}
        return shares, elapsed

    @property
    def training_seconds(self) -> float:
        """Time inside training updates: fetching their batches and computing them (what goodput counts;
        start-up, evaluation, checkpointing and anything lost to a stop are not)."""
        return self.total["data"] + self.total["step"]

    def reset_window(self) -> None:
        self.window = dict.fromkeys(self.KINDS, 0.0)
        self.window_start = time.perf_counter()


class Trainer:
    def __init__(self, cfg: Any, task: Task, env: ClusterEnv, run_dir: Path, budget: TimeBudget) -> None:
        self.cfg = cfg
        self.task = task
        self.env = env
        self.run_dir = run_dir
        self.budget = budget
        self.setup = Setup(cfg, task, env)
        self.device = self.setup.device
        self.store = CheckpointStore(run_dir / "checkpoints", cfg.checkpoint.keep_last)
        self.trackers = Trackers()
        self.console: Console | None = None
        self.chain = ChainLog(run_dir) if env.is_main else None
        self.timers = Timers()
        self.step = 0
        self.samples = 0
        self.best: float | None = None
        self.evals_without_improvement = 0
        self.finished = False
        self.finished_total = 0
        self.last_log_step = 0
        self.resumed_step: int | None = None
        self.tracker_state: dict[str, Any] = {}
        # Rank 0 owns the run folder from build() to close(); close() is safe after a half-done build.
        self.lock = RunLock(run_dir, env.job_id, env.restart_count) if env.is_main else None
        self.keeper = StateKeeper(self)
        self._closers: list[Callable[[], None]] = []

    # ---- set-up -------------------------------------------------------------------------------------------

    def build(self) -> None:
        self._lock_run_folder()
        if self.env.is_main:
            (self.run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        seed_everything(self.cfg.run.seed)
        self.raw_modules = self.task.build_modules()
        for module in self.raw_modules.values():
            module.to(self.device)
        self.modules = self.setup.wrap(self.raw_modules)
        self.optimizers, self.base_lrs = self.setup.optimizers(self.raw_modules)
        self.ctx = Context(
            self.device,
            self.modules,
            self.raw_modules,
            self.optimizers,
            self.cfg.train.precision,
            self.cfg.optim.grad_clip_norm,
        )
        self.train_stream = self.task.build_data("train", self.cfg.run.seed)
        self._closers.append(self.train_stream.close)
        self.total_updates = self.setup.total_updates(self.train_stream)
        self.schedule = LRSchedule(self.cfg.schedule, self.total_updates)
        self.has_val = self.task.build_data("val", self.cfg.run.seed) is not None
        if self.cfg.train.eval_every and not self.has_val and self.env.is_main:
            log.warning(
                "train.eval_every=%d is ignored: this data has no validation set", self.cfg.train.eval_every
            )
        # Per-rank random streams (dropout, sampling) after the shared initialisation.
        seed_everything(self.cfg.run.seed + 100_003 * (self.env.rank + 1))
        # Until a save is measured, guess its duration from the state's size (weights + optimizer moments at a
        # modest 200 MB/s): a fixed guess is either too long for small runs or too short for large models.
        state_bytes = sum(
            p.numel() * p.element_size() for m in self.raw_modules.values() for p in m.parameters()
        )
        self.budget.save.initial = 0.5 + 3 * state_bytes / 200e6

    def _lock_run_folder(self) -> None:
        """Rank 0 locks the run folder before anything writes into it; every rank learns the outcome."""
        problem = None
        if self.lock is not None:
            try:
                self.lock.acquire()
                self.chain = ChainLog(self.run_dir)  # read again now that no other process writes it
            except UserError as exc:
                problem = str(exc)
            except OSError as exc:
                problem = f"cannot lock the run folder {self.run_dir} ({exc}); check run.out_dir"
        agreed = dist.broadcast_object(problem)
        if agreed is not None:
            raise UserError(str(agreed))

    def resume(self) -> str:
        """Load state according to checkpoint.resume/restart; returns what happened, for the log."""
        self.store.clean_temporaries() if self.env.is_main else None
        dist.barrier()
        return self.keeper.resume()

    def start_tracking(self) -> None:
        if not self.env.is_main:
            return
        from hpctrain.track.build import build_trackers

        hop = {"hop": len(self.chain.hops) if self.chain else 0, "world_size": self.env.world_size}
        self.trackers = build_trackers(
            self.cfg,
            self.run_dir,
            self.env,
            resume_step=self.resumed_step,
            state=self.tracker_state,
            hop={**hop, **self.keeper.hop_identity()},
        )
        self.console = Console(self.total_updates, self.step, self.cfg.logging.progress)

    # ---- the loop ------------------------------------------------------------------------------------------

    def fit(self) -> RunResult:
        if self.finished and self.total_updates <= self.finished_total:
            # Finished (or stopped early) with this many updates asked for: nothing to train, no new hop; only
            # what a kill after the final save left undone (the hop's close, summary.json) is done.
            result = self._result("already_finished", "finished", EXIT_OK)
            if self.env.is_main:
                complete_finished_run(self, result.params_sha256)
            return result
        if self.chain is not None:
            self.chain.open_hop(
                self.env.job_id,
                self.env.node_list,
                self.step,
                self.env.world_size,
                self.budget.deadline,
                identity=self.keeper.hop_identity(),
            )
        batches = iter(self.train_stream)
        reason = None
        window_losses: list[torch.Tensor] = []  # stacked only when logging: no per-update tensor arithmetic
        while self.step < self.total_updates:
            step_start = time.perf_counter()
            micro = self._next_update(batches)
            if self._skip(micro is None):
                continue  # an empty batch (on any rank): nothing to learn from, nothing counted
            assert micro is not None  # not skipped means no rank was empty
            self._set_lr()
            self.timers.add("data", time.perf_counter() - step_start)
            compute_start = time.perf_counter()
            out = self.task.train_step(micro, self.ctx)
            self.step += 1
            local_samples = sum(m.samples for m in micro)
            self.samples += local_samples * self.env.world_size
            window_losses.append(out.loss.detach())
            self.timers.add("step", time.perf_counter() - compute_start)
            self.budget.step.observe(time.perf_counter() - step_start)
            if self.step % self.cfg.logging.log_every == 0 or self.step == self.total_updates:
                self._log(out, torch.stack(window_losses).float().mean())
                window_losses.clear()
            elif self.console is not None:
                self.console.tick(self.step)
            self._histograms(micro)
            reason = self._after_update()
            if reason is not None:
                break
        if reason is None or reason == "early_stop":
            return self._finish(reason or "finished")
        if self.keeper.last_saved_step != self.step:
            self._save()
        return self._result("stopped", reason, EXIT_RESUMABLE)

    def _skip(self, empty: bool) -> bool:
        """Skip an update only if every rank skips it (one rank skipping alone would deadlock DDP)."""
        if dist.active():
            return bool(dist.agree_max([float(empty)])[0])
        return empty

    def _next_update(self, batches: Any) -> list[MicroBatch] | None:
        micro: list[MicroBatch] = []
        for _ in range(self.cfg.train.grad_accum_steps):
            batch = next(batches)
            micro.extend(self.task.split(batch))
        total = sum(m.samples for m in micro)
        micro = [m for m in micro if m.samples > 0]
        if total == 0:
            return None
        return [
            MicroBatch(self.task.to_device(m.data, self.device), m.samples / total, m.samples) for m in micro
        ]

    def _set_lr(self) -> None:
        factor = self.schedule.factor(self.step)
        for name, optimizer in self.optimizers.items():
            apply_lr(optimizer, self.base_lrs[name], factor)

    def _periodic_save_due(self) -> bool:
        every = self.cfg.checkpoint.every
        # The last update is saved by _finish (with the finished flag): never twice.
        return bool(every) and self.step % every == 0 and self.step < self.total_updates

    def _eval_due(self, step: int) -> bool:
        every = self.cfg.train.eval_every
        return bool(every) and self.has_val and step % every == 0 and step < self.total_updates

    def _after_update(self) -> str | None:
        """Evaluate, save and decide (all ranks together) whether to stop."""
        local = 0
        if self._eval_due(self.step):
            improved, stop_early = self._evaluate()
            if improved:
                self._save(best=True)
            elif self._periodic_save_due():
                self._save()
            local = CODES["early_stop"] if stop_early else 0
        elif self._periodic_save_due():
            self._save()
        if self.step >= self.total_updates:
            return None
        # The final evaluation (in _finish) needs room too.
        eval_next = self._eval_due(self.step + 1) or (self.has_val and self.step + 1 == self.total_updates)
        budget_reason = self.budget.local_stop_reason(eval_next=eval_next)
        if budget_reason:
            local = max(local, CODES[budget_reason])
        agreed = int(dist.agree_max([float(local)])[0])
        return REASONS[agreed]

    # ---- evaluation ---------------------------------------------------------------------------------------

    def _evaluate(self) -> tuple[bool, bool]:
        start = time.perf_counter()
        sums = self.evaluate()
        metrics = self.task.finish_eval(sums)
        seconds = time.perf_counter() - start
        self.timers.add("eval", seconds)
        self.budget.eval.observe(seconds)
        if self.env.is_main:
            self.trackers.log_scalars(self.step, metrics)
            if self.console is not None:
                shown = " | ".join(f"{k} {v:.4g}" for k, v in metrics.items())
                self.console.message(f"eval at step {self.step} | {shown}")
        key = self.cfg.checkpoint.best_metric
        if key not in metrics:
            return False, False
        value = metrics[key]
        sign = 1.0 if self.cfg.checkpoint.best_mode == "min" else -1.0
        delta = self.cfg.train.early_stopping.min_delta
        improved = self.best is None or sign * (value - self.best) < -delta
        if improved:
            self.best = value
            self.evals_without_improvement = 0
        else:
            self.evals_without_improvement += 1
        patience = self.cfg.train.early_stopping.patience
        return improved, bool(patience) and self.evals_without_improvement >= patience

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Sums of the task's eval figures over the validation set and all ranks."""
        for module in self.raw_modules.values():
            module.eval()
        sums: dict[str, torch.Tensor] = {}
        limit = self.cfg.train.eval_batches
        val = self.task.build_data("val", self.cfg.run.seed) or ()
        for i, batch in enumerate(val):
            if limit and i >= limit:
                break
            out = self.task.eval_step(self.task.to_device(batch, self.device), self.ctx)
            for key, value in out.items():
                sums[key] = (
                    sums.get(key, torch.zeros((), dtype=torch.float64)) + value.detach().double().cpu()
                )
        for module in self.raw_modules.values():
            module.train()
        # Every rank must hold the same keys before the collective (a rank without val data adds zeros).
        keys: list[str] = dist.broadcast_object(sorted(sums))  # type: ignore[assignment]
        reduced = dist.sum_tensors({k: sums.get(k, torch.zeros((), dtype=torch.float64)) for k in keys})
        return {k: float(v) for k, v in reduced.items()}

    # ---- logging, saving, finishing ----------------------------------------------------------------------

    def _log(self, out: Any, mean_loss: torch.Tensor) -> None:
        if not self.env.is_main:
            return
        shares, elapsed = self.timers.shares()
        updates = max(self.step - max(self.last_log_step, self.resumed_step or 0), 1)
        self.last_log_step = self.step
        scalars = {"loss": float(out.loss), "loss_mean": float(mean_loss)}
        scalars.update({k: float(v) for k, v in out.metrics.items()})
        for name, norm in self.ctx.grad_norms.items():
            scalars[f"grad_norm_{name}" if len(self.ctx.grad_norms) > 1 else "grad_norm"] = float(norm)
        scalars["lr"] = self.optimizers[next(iter(self.optimizers))].param_groups[0]["lr"]
        scalars["updates_per_s"] = updates / elapsed
        per_update = out.samples * self.env.world_size
        scalars["samples_per_s"] = per_update * updates / elapsed
        for key, count in out.extra_counts.items():
            scalars[f"{key}_per_s"] = count * self.env.world_size * updates / elapsed
        scalars.update(shares)
        if self.device.type == "cuda":
            scalars["gpu_mem_peak_gb"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        self.trackers.log_scalars(self.step, scalars)
        if self.console is not None:
            self.console.update(self.step, scalars)
        self.timers.reset_window()

    def _histograms(self, micro: list[MicroBatch]) -> None:
        hist_every = self.cfg.logging.tensorboard.hist_every
        if self.env.is_main and hist_every and self.step % hist_every == 0:
            values = self.task.histograms(micro[0].data)
            self.trackers.log_histograms(
                self.step, {k: v.detach().float().cpu().numpy() for k, v in values.items()}
            )

    def _save(self, best: bool = False) -> None:
        start = time.perf_counter()
        self.keeper.save(best=best)
        seconds = time.perf_counter() - start
        self.timers.add("checkpoint", seconds)
        self.budget.save.observe(seconds)
        if self.chain is not None:
            self.chain.progress(self.step, self.timers.training_seconds)

    def _finish(self, reason: str) -> RunResult:
        improved = False
        if reason == "finished" and self.has_val:
            improved, _ = self._evaluate()  # the final evaluation (the only one when eval_every is 0)
        self.finished = True
        self._save(best=improved)
        return self._result("finished", reason, EXIT_OK)

    def _result(self, status: str, reason: str, code: int) -> RunResult:
        digest = params_sha256(self.raw_modules)
        if self.env.is_main and status != "already_finished":
            hop = self.chain.close_hop(self.step, self.timers.training_seconds, reason) if self.chain else {}
            totals = self.chain.totals() if self.chain else {}
            wall = hop.get("end", time.time()) - hop.get("start", time.time())
            summary = {
                "status": status,
                "reason": reason,
                "step": self.step,
                "total_updates": self.total_updates,
                "samples": self.samples,
                "params_sha256": digest,
                "wall_seconds": wall,
                "seconds": dict(self.timers.total),
                "goodput": hop.get("goodput"),
                "best": self.best,
                "job_id": self.env.job_id,
                **totals,
            }
            write_summary(self.run_dir, summary)
        return RunResult(status, reason, self.step, digest, code)

    def close(self) -> None:
        try:
            self.keeper.close()
            for close in reversed(self._closers):
                close()
            self.trackers.close()
            if self.console is not None:
                self.console.close()
        finally:
            if self.lock is not None:
                self.lock.release()  # last: everything above may still write into the run folder
