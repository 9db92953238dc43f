"""The trainer: counts updates, keeps to the time budget, saves and resumes exactly. It knows no model."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hpctrain.errors import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK, EXIT_RESUMABLE, UserError
from hpctrain.runtime import dist
from hpctrain.runtime.budget import CODES, REASONS, StopRequested, TimeBudget, watch_waits
from hpctrain.runtime.env import ClusterEnv
from hpctrain.runtime.seeding import rng_state, seed_everything, set_rng_state
from hpctrain.track.base import Trackers
from hpctrain.track.chain import ChainLog, write_summary
from hpctrain.track.console import Console
from hpctrain.train.checkpoint import CheckpointStore
from hpctrain.train.context import Context
from hpctrain.train.finished import complete_finished_run
from hpctrain.train.nonfinite import NonFinite, NonFiniteGuard
from hpctrain.train.optim import LRSchedule, apply_lr
from hpctrain.train.runlock import RunLock
from hpctrain.train.setup import Setup
from hpctrain.train.state import StateKeeper, params_sha256
from hpctrain.train.task import MicroBatch, Task

log = logging.getLogger(__name__)

# Under DDP, ranks agree whether to abandon an evaluation every this many batches (see _eval_sums).
EVAL_AGREE_EVERY = 4


@dataclass
class RunResult:
    status: str  # finished | stopped | already_finished | failed
    reason: str
    step: int
    params_sha256: str
    exit_code: int
    message: str = ""  # failed: the one line to print


@dataclass
class EvalResult:
    improved: bool = False
    stop_early: bool = False
    abandoned: str | None = None  # the stop reason that cut the evaluation short (agreed by all ranks)


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
        self.guard = NonFiniteGuard(cfg.train)
        self._data_error: UserError | None = None  # a bad file met mid-run, said after the save
        self._window: list[torch.Tensor] = []  # losses since the last log line: device tensors, never synced
        self._window_first = 1  # the update of _window[0]
        self._last_save_clock = time.monotonic()  # rank 0's clock decides time-based saves for all ranks
        self._stretch_noted = False

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
            skip_nonfinite=self.guard.skip,
        )
        if self.guard.skip and not self.ctx.skip_nonfinite:
            # fp16: skipping before the GradScaler's update would keep its scale too high forever.
            log.warning(
                "train.on_nonfinite=skip_batch: under fp16 the GradScaler skips overflowing steps itself"
            )
            self.guard.skip = False
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
        watch_waits(self.budget.urgent_stop_reason)  # data waits give up when a stop is due
        try:
            reason = self._train()
            if reason is None or reason == "early_stop":
                return self._finish(reason or "finished")
            if self.keeper.last_saved_step != self.step:
                self._save()
            if reason == "data_error":
                raise self._data_failure()
            return self._result("stopped", reason, EXIT_RESUMABLE)
        except NonFinite as bad:
            return self._failed(bad)
        finally:
            watch_waits(None)

    def _train(self) -> str | None:
        """Updates until the last one (None) or an agreed stop (its reason)."""
        self._last_save_clock = time.monotonic()
        self._window_first = self.step + 1
        if self.budget.eval_owed == self.step and self.step < self.total_updates:
            # A stop cut this update's evaluation short last hop: run it now, as an uninterrupted run did.
            reason = self._after_update(owed_eval=True)
            if reason is not None:
                return reason
        batches = iter(self.train_stream)
        window = self._window
        while self.step < self.total_updates:
            step_start = time.perf_counter()
            before = self.train_stream.state_dict()
            try:
                micro, waited = self._next_update(batches), 0
            except StopRequested as stop:  # a signal or the deadline while waiting for data
                micro, waited = None, CODES[stop.reason]
            except UserError as bad:  # a bad file met mid-run (data.on_bad_file=fail): keep what was trained
                self._data_error, micro, waited = bad, None, CODES["data_error"]
            empty, stop_code = self._agree_fetch(micro is None and not waited, waited)
            if stop_code:
                # Every rank drops this update; batches some ranks already took are given back.
                self.train_stream.load_state_dict(before)
                return REASONS[stop_code]
            if empty:
                continue  # an empty batch (on any rank): nothing to learn from, nothing counted
            assert micro is not None  # not skipped means no rank was empty
            self._set_lr()
            self.timers.add("data", time.perf_counter() - step_start)
            compute_start = time.perf_counter()
            out = self.task.train_step(micro, self.ctx)
            self.step += 1
            local_samples = sum(m.samples for m in micro)
            self.samples += local_samples * self.env.world_size
            window.append(out.loss.detach())
            if self.guard.skip:
                self.guard.note_update(self.ctx.skipped_steps, self.step)
            self.timers.add("step", time.perf_counter() - compute_start)
            self.budget.step.observe(time.perf_counter() - step_start)
            if self.step % self.cfg.logging.log_every == 0 or self.step == self.total_updates:
                losses = torch.stack(window)  # stacked only when logging: no per-update tensor arithmetic
                self.guard.check_losses(losses, self._window_first)
                self._log(out, losses.float().mean())
                window.clear()
                self._window_first = self.step + 1
            elif self.console is not None:
                self.console.tick(self.step)
            self._histograms(micro)
            reason = self._after_update()
            if reason is not None:
                return reason
        return None

    def _agree_fetch(self, empty: bool, stop: int) -> tuple[bool, int]:
        """Skip an update only if every rank skips it (one rank skipping alone would deadlock DDP); stop if any
        rank was stopped while waiting for its data. One collective, as before for the skip alone."""
        if dist.active():
            agreed = dist.agree_max([float(empty), float(stop)])
            return bool(agreed[0]), int(agreed[1])
        return empty, stop

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

    def _time_save_due(self) -> bool:
        """Rank 0's view (its clock decides for all): checkpoint.every_minutes since the last save."""
        minutes = self.cfg.checkpoint.every_minutes
        if not minutes:
            return False
        interval = self.budget.save_interval(minutes)
        if interval > minutes * 60 and not self._stretch_noted:
            self._stretch_noted = True
            log.info(
                "time-based saves every %.1f min instead of checkpoint.every_minutes=%g: a save takes %.1f s "
                "(saves are kept under 2%% of the time)",
                interval / 60,
                minutes,
                self.budget.save.value,
            )
        return time.monotonic() - self._last_save_clock >= interval

    def _after_update(self, owed_eval: bool = False) -> str | None:
        """Evaluate, save and decide (all ranks together) whether to stop."""
        local = 0
        if owed_eval or self._eval_due(self.step):
            result = self._evaluate()
            if result.abandoned:
                return result.abandoned  # every rank abandoned it together: stop (fit saves)
            if result.improved:
                self._save(best=True)
            elif self._periodic_save_due():
                self._save()
            local = CODES["early_stop"] if result.stop_early else 0
        elif self._periodic_save_due():
            self._save()
        if self.step >= self.total_updates:
            return None
        # The final evaluation (in _finish) needs room too.
        eval_next = self._eval_due(self.step + 1) or (self.has_val and self.step + 1 == self.total_updates)
        budget_reason = self.budget.local_stop_reason(eval_next=eval_next)
        if budget_reason:
            local = max(local, CODES[budget_reason])
        # One collective decides it all: stop (and why), a time-based save (rank 0's clock), and the first
        # non-finite update any rank has found so far.
        save_due = float(self.env.is_main and self._time_save_due())
        agreed = dist.agree_max([float(local), save_due, self.guard.code()])
        self.guard.raise_if(agreed[2])
        reason = REASONS[int(agreed[0])]
        if reason is None and agreed[1]:
            self._save()
        return reason

    # ---- evaluation ---------------------------------------------------------------------------------------

    def _evaluate(self) -> EvalResult:
        start = time.perf_counter()
        rng = rng_state()  # an abandoned evaluation must leave the random streams as it found them
        sums, stop = self.evaluate()
        seconds = time.perf_counter() - start
        self.timers.add("eval", seconds)
        if sums is None:
            set_rng_state(rng)
            self.budget.eval_owed = self.step  # carried in the checkpoint: the next hop runs it first
            if self.console is not None:
                self.console.message(
                    f"evaluation at step {self.step} cut short ({stop}): it runs after the resume"
                )
            return EvalResult(abandoned=stop)
        self.budget.eval_owed = None
        self.budget.eval.observe(seconds)
        metrics = self.task.finish_eval(sums)
        if self.env.is_main:
            self.trackers.log_scalars(self.step, metrics)
            if self.console is not None:
                shown = " | ".join(f"{k} {v:.4g}" for k, v in metrics.items())
                self.console.message(f"eval at step {self.step} | {shown}")
        key = self.cfg.checkpoint.best_metric
        if key not in metrics:
            return EvalResult()
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
        return EvalResult(improved, bool(patience) and self.evals_without_improvement >= patience)

    @torch.no_grad()
    def evaluate(self) -> tuple[dict[str, float] | None, str | None]:
        """Sums of the task's eval figures over the validation set and all ranks; (None, reason) when a stop
        cut the pass short (on every rank alike)."""
        for module in self.raw_modules.values():
            module.eval()
        try:
            sums, stop = self._eval_sums()
        finally:
            for module in self.raw_modules.values():
                module.train()
        if stop:
            return None, REASONS[stop]
        # Every rank must hold the same keys before the collective (a rank without val data adds zeros).
        keys: list[str] = dist.broadcast_object(sorted(sums))  # type: ignore[assignment]
        reduced = dist.sum_tensors({k: sums.get(k, torch.zeros((), dtype=torch.float64)) for k in keys})
        return {k: float(v) for k, v in reduced.items()}, None

    def _eval_sums(self) -> tuple[dict[str, torch.Tensor], int]:
        """This rank's sums over its validation batches, or a stop code when a stop (a signal, the deadline)
        came first: asked before each batch, so a long evaluation cannot run past the walltime.

        Under DDP the ranks agree every EVAL_AGREE_EVERY batches (one small max-reduction) whether any rank must
        stop and whether any still has batches. Every rank makes the same calls, also one that ran out of
        batches or stopped early, so nobody is left waiting in a collective and all abandon together."""
        sums: dict[str, torch.Tensor] = {}
        limit = self.cfg.train.eval_batches
        batches: Iterator[Any] = iter(self.task.build_data("val", self.cfg.run.seed) or ())
        per_round = EVAL_AGREE_EVERY if dist.active() else 1
        done, more = 0, True
        while True:
            stop = 0
            for _ in range(per_round):
                reason = self.budget.urgent_stop_reason()
                if reason or not more:
                    stop = CODES[reason] if reason else 0
                    break
                try:
                    batch = next(batches)
                except StopIteration:
                    more = False
                    break
                except StopRequested as requested:  # a staged validation set waiting for a file
                    stop = CODES[requested.reason]
                    break
                out = self.task.eval_step(self.task.to_device(batch, self.device), self.ctx)
                for key, value in out.items():
                    sums[key] = (
                        sums.get(key, torch.zeros((), dtype=torch.float64)) + value.detach().double().cpu()
                    )
                done += 1
                more = not (limit and done >= limit)
            agreed = dist.agree_max([float(stop), float(more)])
            if agreed[0]:
                return sums, int(agreed[0])
            if not agreed[1]:
                return sums, 0

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
        if self.guard.skip:
            scalars["nonfinite_skips"] = self.guard.skipped
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
        self._check_finite()
        start = time.perf_counter()
        self.keeper.save(best=best)
        seconds = time.perf_counter() - start
        self.timers.add("checkpoint", seconds)
        self.budget.save.observe(seconds)
        self._last_save_clock = time.monotonic()
        if self.chain is not None:
            self.chain.progress(self.step, self.timers.training_seconds)

    def _check_finite(self) -> None:
        """Before every save: the losses since the last check and the weights must be finite on every rank,
        else all ranks raise NonFinite instead of saving (one small collective per save)."""
        if self._window:
            self.guard.check_losses(torch.stack(self._window), self._window_first)
        self.guard.check_weights(self.raw_modules, self.step)
        self.guard.raise_if(dist.agree_max([self.guard.code()])[0])

    def _finish(self, reason: str) -> RunResult:
        improved = False
        if reason == "finished" and self.has_val:
            result = self._evaluate()  # the final evaluation (the only one when eval_every is 0)
            if result.abandoned:  # cut short by a stop: the next start runs it (the run is not finished)
                if self.keeper.last_saved_step != self.step:
                    self._save()
                return self._result("stopped", result.abandoned, EXIT_RESUMABLE)
            improved = result.improved
        self.finished = True
        self._save(best=improved)
        return self._result("finished", reason, EXIT_OK)

    def _data_failure(self) -> UserError:
        """The error to end with after a bad file met mid-run, once the updates before it are saved (every rank
        saved; the stream's position was put back before the failed fetch, so nothing is skipped)."""
        self._result("stopped", "data_error", EXIT_BAD_INPUT)
        cause = (
            str(self._data_error)
            if self._data_error is not None
            else "another rank met bad data (see its log)"
        )
        return UserError(
            f"{cause} (the {self.step} updates done so far are saved: once the data is fixed, the same command "
            "continues from there)"
        )

    def _failed(self, bad: NonFinite) -> RunResult:
        saved = self.keeper.last_saved_step
        kept = (
            f"checkpoints/latest stays at update {saved}" if saved is not None else "no checkpoint was saved"
        )
        skip = "" if self.guard.skip else " (train.on_nonfinite=skip_batch skips such updates)"
        again = "to continue from that checkpoint" if saved is not None else "(it starts afresh)"
        message = (
            f"{bad}; stopped at update {self.step} without saving: {kept}. Lower optim.lr, set "
            f"optim.grad_clip_norm or check the data{skip}, then run again {again}"
        )
        return self._result(
            "failed",
            "nonfinite",
            EXIT_FAILURE,
            message,
            nonfinite_update=bad.update,
            stopped_at_update=self.step,
        )

    def _result(self, status: str, reason: str, code: int, message: str = "", **extra: Any) -> RunResult:
        digest = params_sha256(self.raw_modules)
        if self.env.is_main and status != "already_finished":
            last = self.step
            if status == "failed":  # it got only as far as its last save: where a next start continues
                saved = self.keeper.last_saved_step
                last = saved if saved is not None else (self.resumed_step or 0)
            hop = self.chain.close_hop(last, self.timers.training_seconds, reason) if self.chain else {}
            totals = self.chain.totals() if self.chain else {}
            wall = hop.get("end", time.time()) - hop.get("start", time.time())
            summary = {
                "status": status,
                "reason": reason,
                "step": last,
                "total_updates": self.total_updates,
                "samples": self.samples,
                "params_sha256": digest,
                "wall_seconds": wall,
                "seconds": dict(self.timers.total),
                "goodput": hop.get("goodput"),
                "best": self.best,
                "job_id": self.env.job_id,
                "nonfinite_skips": self.guard.skipped,
                **extra,
                **totals,
            }
            write_summary(self.run_dir, summary)
        return RunResult(status, reason, self.step, digest, code, message)

    def close(self) -> None:
        try:
            self.keeper.close()
            self.keeper.remote.finish(self.budget)  # the last upload, never past the walltime
            for close in reversed(self._closers):
                close()
            self.trackers.close()
            if self.console is not None:
                self.console.close()
        finally:
            if self.lock is not None:
                self.lock.release()  # last: everything above may still write into the run folder
