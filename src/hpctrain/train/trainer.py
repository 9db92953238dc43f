"""The trainer: counts updates, keeps to the time budget, saves and resumes exactly. It knows no model.

Size (~490 lines): the update loop and the decisions all ranks take together at its step boundaries (stop, save,
evaluate, skip) are kept in one place on purpose; set-up (setup.py), evaluation (evaluation.py), outcomes
(outcome.py), state (state.py, train_state.py) and profiling (profile.py) are already out."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import torch

from hpctrain.config.schema import ConfigBase
from hpctrain.errors import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK, EXIT_RESUMABLE, UserError
from hpctrain.runtime import dist
from hpctrain.runtime.budget import CODES, REASONS, StopRequested, TimeBudget, check_stride, watch_waits
from hpctrain.runtime.env import ClusterEnv
from hpctrain.runtime.seeding import RANK_STREAM, derive, rng_state, seed_everything, set_rng_state
from hpctrain.track.base import Trackers
from hpctrain.track.chain import ChainLog, NoChain, write_summary
from hpctrain.track.console import Console, NullConsole
from hpctrain.track.monitor import Monitor, NoMonitor, build_monitor
from hpctrain.train.checkpoint import CheckpointStore
from hpctrain.train.context import Context
from hpctrain.train.evaluation import EvalResult, Evaluator, judge
from hpctrain.train.finished import complete_finished_run
from hpctrain.train.memory import compiled_graphs, is_compiled
from hpctrain.train.nonfinite import NonFinite, NonFiniteGuard
from hpctrain.train.optim import LRSchedule, apply_lr
from hpctrain.train.outcome import (
    DeviceTimeline,
    NoTimeline,
    RunResult,
    Timers,
    data_failure,
    nonfinite_message,
    rates,
    summary_record,
    update_scalars,
)
from hpctrain.train.profile import NoProfiler, WindowProfiler, build_profiler
from hpctrain.train.runlock import RunLock
from hpctrain.train.setup import Setup
from hpctrain.train.state import StateKeeper, params_sha256
from hpctrain.train.task import BatchStream, MicroBatch, StepOutput, Task
from hpctrain.train.train_state import TrainState

log = logging.getLogger(__name__)

__all__ = ["RunResult", "Trainer"]


class Trainer:
    # Made by build() (the task's networks and data exist only then):
    raw_modules: dict[str, torch.nn.Module]
    modules: dict[str, torch.nn.Module]
    optimizers: dict[str, torch.optim.Optimizer]
    base_lrs: dict[str, float]
    ctx: Context
    train_stream: BatchStream
    schedule: LRSchedule
    has_val: bool
    evaluator: Evaluator

    def __init__(
        self, cfg: ConfigBase, task: Task[ConfigBase], env: ClusterEnv, run_dir: Path, budget: TimeBudget
    ) -> None:
        self.cfg = cfg
        self.task = task
        self.env = env
        self.run_dir = run_dir
        self.budget = budget
        self.setup = Setup(cfg, task, env)
        self.device = self.setup.device
        self.store = CheckpointStore(run_dir / "checkpoints", cfg.checkpoint.keep_last)
        # Stand-ins until start_tracking (and for good on ranks other than 0): "off" needs no `if`.
        self.trackers = Trackers()
        self.console: Console = NullConsole()
        self.chain: ChainLog = ChainLog(run_dir) if env.is_main else NoChain()
        self.timers = Timers()
        self.timeline: DeviceTimeline | NoTimeline = NoTimeline()
        self._compiling = False  # some network is compiled: updates that compile are booked apart
        self.monitor: Monitor | NoMonitor = NoMonitor()
        self.profiler: WindowProfiler | NoProfiler = NoProfiler()
        self.state = TrainState()
        self.last_log_step = 0
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
        # The update after which the budget is next asked and the ranks next agree (see _plan_next_check), and
        # the step time they agreed on last (it sets the stride: the same on every rank).
        self._next_check = 0
        self._step_agreed = 0.0
        self._lr_factor: float | None = None  # the LR factor last applied (it changes only with a schedule)

    # ---- set-up -------------------------------------------------------------------------------------------

    def build(self) -> None:
        self._lock_run_folder()
        if self.env.is_main:
            (self.run_dir / "checkpoints").mkdir(mode=0o755, parents=True, exist_ok=True)
        seed_everything(self.cfg.run.seed)
        self.raw_modules = self.task.build_modules()
        for module in self.raw_modules.values():
            module.to(self.device)
        # every rank takes rank 0's view of the hop's time (under SLURM only rank 0 asks for the end time)
        left = dist.broadcast_object(self.budget.remaining())
        self.modules = self.setup.wrap(self.raw_modules, left if isinstance(left, float) else None)
        self._compiling = any(is_compiled(m) for m in self.modules.values())
        if self.device.type == "cuda":
            self.timeline = DeviceTimeline()
        self.optimizers, self.base_lrs = self.setup.optimizers(self.raw_modules)
        self.ctx = self.setup.context(self.modules, self.raw_modules, self.optimizers, self.guard)
        self.train_stream = self.task.train_stream(self.cfg.run.seed)
        self._closers.append(self.train_stream.close)
        self.state.total_updates = self.setup.total_updates(self.train_stream)
        self.schedule = LRSchedule(
            self.cfg.schedule, self.state.total_updates, self.setup.updates_per_epoch(self.train_stream)
        )
        self.profiler = build_profiler(
            self.cfg.train.profile,
            self.run_dir,
            self.cfg.run.name or "run",
            self.env.rank,
            self.device.type == "cuda",
        )
        self._closers.append(self.profiler.close)
        self.has_val = self.task.build_data("val", self.cfg.run.seed) is not None
        self.evaluator = Evaluator(
            self.task, self.ctx, self.budget, self.cfg.train.eval_batches, self.cfg.run.seed
        )
        if self.cfg.train.eval_every and not self.has_val and self.env.is_main:
            log.warning(
                "train.eval_every=%d is ignored: this data has no validation set", self.cfg.train.eval_every
            )
        # Per-rank random streams (dropout, sampling) after the shared initialisation.
        seed_everything(derive(self.cfg.run.seed, RANK_STREAM, self.env.rank))
        self.budget.save.initial = self.setup.save_guess(self.raw_modules)

    def _lock_run_folder(self) -> None:
        """Rank 0 locks the run folder before anything writes into it; every rank learns the outcome."""
        problem = None
        if self.lock is not None:
            try:
                self.lock.acquire()
                self.chain = ChainLog(self.run_dir)  # read again now that no other process writes it
                self.chain.keep_aside_if_damaged(self.store.saves())
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
        said = self.keeper.resume()
        if self.keeper.length_note:
            said += f"\n{self.keeper.length_note}"
        if self.env.is_main:
            self.chain = ChainLog(self.run_dir)  # resume=never may have moved the old run's chain.json aside
        return said

    def start_tracking(self, log_file: TextIO | None = None) -> None:
        """Rank 0: trackers, the console (its plain lines also into `log_file`, the run's training.log) and the
        hardware monitor."""
        if not self.env.is_main:
            return
        from hpctrain.track.build import build_trackers

        hop = {"hop": len(self.chain.hops), "world_size": self.env.world_size}
        self.trackers = build_trackers(
            self.cfg,
            self.run_dir,
            self.env,
            resume_step=self.state.resumed_step,
            state=self.state.tracker_state,
            hop={**hop, **self.keeper.hop_identity()},
        )
        self.console = Console(
            self.state.total_updates,
            self.state.step,
            self.cfg.logging.progress,
            time_left=self.budget.remaining,
            log_file=log_file,
        )
        self.monitor = build_monitor(self.cfg.logging.gpu_every_seconds)
        self._closers.append(self.monitor.close)

    # ---- the loop ------------------------------------------------------------------------------------------

    @property
    def already_finished(self) -> bool:
        """Finished (or stopped early) with no more updates asked for than it had: nothing to train."""
        return self.state.finished and self.state.total_updates <= self.state.finished_total

    def fit(self) -> RunResult:
        if self.already_finished:
            # Finished (or stopped early) with this many updates asked for: nothing to train, no new hop; only
            # what a kill after the final save left undone (the hop's close, summary.json) is done.
            result = self._result("already_finished", "finished", EXIT_OK)
            if self.env.is_main:
                complete_finished_run(
                    self.chain,
                    self.store,
                    self.run_dir,
                    self.state,
                    self.cfg,
                    result.params_sha256,
                    self.keeper.remote,
                )
            return result
        self.chain.open_hop(
            self.env.scheduler_job,  # what squeue knows it by (`hpctrain status`): <array>_<task> for a task
            self.env.node_list,
            self.state.step,
            self.env.world_size,
            self.budget.deadline,
            identity=self.keeper.hop_identity(),
        )
        watch_waits(self.budget.urgent_stop_reason)  # data waits give up when a stop is due
        try:
            reason = self._train()
            if reason is None or reason == "early_stop":
                return self._finish(reason or "finished")
            if self.keeper.last_saved_step != self.state.step:
                self._save()
            if reason == "data_error":
                self._result("stopped", "data_error", EXIT_BAD_INPUT)
                raise data_failure(self._data_error, self.state.step)
            return self._result("stopped", reason, EXIT_RESUMABLE)
        except NonFinite as bad:
            return self._failed(bad)
        finally:
            watch_waits(None)

    def _train(self) -> str | None:
        """Updates until the last one (None) or an agreed stop (its reason).

        Per update only what every update needs: its batch, its LR, the step, the counters and the timers. The
        rest waits for log steps (the loss window, read then) and check steps (the budget, the stop decision,
        evaluations and saves): see _plan_next_check."""
        self._last_save_clock = time.monotonic()
        self._window_first = self.state.step + 1
        self._next_check = self.state.step + 1
        if self.budget.eval_owed == self.state.step and self.state.step < self.state.total_updates:
            # A stop cut this update's evaluation short last hop: run it now, as an uninterrupted run did.
            reason = self._after_update(owed_eval=True)
            if reason is not None:
                return reason
        batches = iter(self.train_stream)
        state, stream, timers, window = self.state, self.train_stream, self.timers, self._window
        clock, observe, timeline = time.perf_counter, self.budget.step.observe, self.timeline
        graphs = compiled_graphs() if self._compiling else 0
        log_every, hist_every = self.cfg.logging.log_every, self.cfg.logging.tensorboard.hist_every
        while state.step < state.total_updates:
            step_start = clock()
            before = stream.state_dict()
            try:
                micro, waited = self._next_update(batches), 0
            except StopRequested as stop:  # a signal or the deadline while waiting for data
                micro, waited = None, CODES[stop.reason]
            except UserError as bad:  # a bad file met mid-run (data.on_bad_file=fail): keep what was trained
                self._data_error, micro, waited = bad, None, CODES["data_error"]
            empty, stop_code = self._agree_fetch(micro is None and not waited, waited)
            if stop_code:
                # Every rank drops this update; batches some ranks already took are given back.
                stream.load_state_dict(before)
                return REASONS[stop_code]
            if empty:
                continue  # an empty batch (on any rank): nothing to learn from, nothing counted
            assert micro is not None  # not skipped means no rank was empty
            self._set_lr()
            compute_start = clock()
            timeline.start()
            out = self.task.train_step(micro, self.ctx)
            state.step += 1
            samples = micro[0].samples if len(micro) == 1 else sum(m.samples for m in micro)
            state.samples += samples * self.env.world_size
            loss = out.loss
            window.append(loss.detach() if loss.requires_grad else loss)  # device tensors, read at log steps
            if self.guard.skip:
                self.guard.note_update(self.ctx.skipped_steps, state.step)
            end = clock()
            if self._compiling and graphs != (graphs := compiled_graphs()):
                # torch.compile compiled in this update: compile time, kept out of the step estimate (a
                # first update of 30 s would make the budget stop a hop after it) and out of the shares
                timers.add("compile", end - step_start)
                timeline.end(counted=False)
            else:
                timers.add("data", compute_start - step_start)
                timers.add("step", end - compute_start)
                timeline.end()
                observe(end - step_start)
            self.profiler.step(state.step)
            if state.step % log_every == 0 or state.step == state.total_updates:
                self._log_window(out)
            else:
                self.console.tick(state.step)
            if hist_every and state.step % hist_every == 0:
                self._histograms(micro)
            if state.step >= self._next_check:
                reason = self._after_update()
                if reason is not None:
                    return reason
        return None

    def _agree_fetch(self, empty: bool, stop: int) -> tuple[bool, int]:
        """Skip an update only if every rank skips it (one rank skipping alone would deadlock DDP); stop if any
        rank was stopped while waiting for its data. One collective per update (none at world size 1)."""
        if dist.active():
            agreed = dist.agree_max([float(empty), float(stop)])
            return bool(agreed[0]), int(agreed[1])
        return empty, stop

    def _next_update(self, batches: Any) -> list[MicroBatch] | None:
        split, device, to_device = self.task.split, self.device, self.task.to_device
        micro = split(next(batches))
        for _ in range(self.cfg.train.grad_accum_steps - 1):
            micro = micro + split(next(batches))
        if len(micro) == 1:  # the common case, one piece: no passes over a list
            m = micro[0]
            return [MicroBatch(to_device(m.data, device), 1.0, m.samples)] if m.samples else None
        total = sum(m.samples for m in micro)
        if total == 0:
            return None
        return [
            MicroBatch(to_device(m.data, device), m.samples / total, m.samples) for m in micro if m.samples
        ]

    def _set_lr(self) -> None:
        """The schedule's LR for this update (a pure function of the update count), set when it changes."""
        factor = self.schedule.factor(self.state.step)
        if factor == self._lr_factor:
            return
        self._lr_factor = factor
        for name, optimizer in self.optimizers.items():
            apply_lr(optimizer, self.base_lrs[name], factor)

    def _periodic_save_due(self) -> bool:
        every = self.cfg.checkpoint.every
        # The last update is saved by _finish (with the finished flag): never twice.
        return bool(every) and self.state.step % every == 0 and self.state.step < self.state.total_updates

    def _eval_due(self, step: int) -> bool:
        every = self.cfg.train.eval_every
        return bool(every) and self.has_val and step % every == 0 and step < self.state.total_updates

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

    def _plan_next_check(self) -> int:
        """The next update after which the budget is asked and the ranks agree: a stride of about
        CHECK_SECONDS of training away (from the step time agreed last, so the same on every rank), or sooner at
        the next update that logs (the NaN guard's findings are agreed there), evaluates, saves, ends the run, or
        comes right before an evaluation (whether it fits is decided there). Every update under skip_batch (the
        guard may stop after any one). All of it is a function of agreed figures and the update count: every
        rank calls the collective at the same updates."""
        step, total = self.state.step, self.state.total_updates
        stride = 1 if self.guard.skip else check_stride(self._step_agreed)
        due = [step + stride, total, _next_multiple(step, self.cfg.logging.log_every)]
        if self.cfg.checkpoint.every:
            due.append(_next_multiple(step, self.cfg.checkpoint.every))
        if self.has_val:
            evals = [total] + (
                [_next_multiple(step, self.cfg.train.eval_every)] if self.cfg.train.eval_every else []
            )
            due += [e - 1 if e - 1 > step else e for e in evals]
        return min(due)

    def _after_update(self, owed_eval: bool = False) -> str | None:
        """At a check step: evaluate, save and decide (all ranks together) whether to stop."""
        local = 0
        if owed_eval or self._eval_due(self.state.step):
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
        if self.state.step >= self.state.total_updates:
            return None
        # The final evaluation (in _finish) needs room too.
        eval_next = self._eval_due(self.state.step + 1) or (
            self.has_val and self.state.step + 1 == self.state.total_updates
        )
        # Until the next check the run trains on unasked: the budget looks that many updates ahead.
        self._next_check = self._plan_next_check()
        budget_reason = self.budget.local_stop_reason(eval_next, ahead=self._next_check - self.state.step)
        if budget_reason:
            local = max(local, CODES[budget_reason])
        # One collective decides it all: stop (and why), a time-based save (rank 0's clock), the first
        # non-finite update any rank has found so far, and the slowest rank's step time (the next stride).
        save_due = float(self.env.is_main and self._time_save_due())
        agreed = dist.agree_max([float(local), save_due, self.guard.code(), self.budget.step.value])
        self._step_agreed = agreed[3]
        self.guard.raise_if(agreed[2])
        reason = REASONS[int(agreed[0])]
        if reason is None and agreed[1]:
            self._save()
        return reason

    # ---- evaluation ---------------------------------------------------------------------------------------

    def _evaluate(self) -> EvalResult:
        self.console.flush()  # the progress lines so far out before the loop goes quiet
        self.trackers.show()
        start = time.perf_counter()
        rng = rng_state()  # an abandoned evaluation must leave the random streams as it found them
        sums, stop = self.evaluator.sums(self.raw_modules)
        seconds = time.perf_counter() - start
        self.timers.add("eval", seconds)
        if sums is None:
            set_rng_state(rng)
            self.budget.eval_owed = self.state.step  # carried in the checkpoint: the next hop runs it first
            self.console.message(
                f"evaluation at update {self.state.step} cut short ({stop}): it runs after the resume"
            )
            return EvalResult(abandoned=stop)
        self.budget.eval_owed = None
        self.budget.eval.observe(seconds)
        metrics = self.task.finish_eval(sums)
        if self.env.is_main:
            self.trackers.log_scalars(self.state.step, metrics)
            shown = " | ".join(f"{k} {v:.4g}" for k, v in metrics.items())
            self.console.message(f"eval at update {self.state.step} | {shown}")
        return judge(metrics, self.state, self.cfg.checkpoint, self.cfg.train.early_stopping)

    # ---- logging, saving, finishing ----------------------------------------------------------------------

    def _log_window(self, out: StepOutput) -> None:
        """At a log step: the losses since the last one are checked (every rank) and their mean logged."""
        # read once, only when logging (no per-update tensor arithmetic); checked and averaged on the host
        losses = torch.stack(self._window).float().tolist()
        busy = self.timeline.busy_seconds()  # CUDA: the GPU's own time (the sync above already waited)
        if busy is not None:
            self.timers.rebook(busy)
        self.guard.check_losses(losses, self._window_first)
        self._log(out, math.fsum(losses) / len(losses))
        self._window.clear()
        self._window_first = self.state.step + 1

    def _log(self, out: StepOutput, mean_loss: float) -> None:
        if not self.env.is_main:
            return
        shares, elapsed = self.timers.shares()
        updates = max(self.state.step - max(self.last_log_step, self.state.resumed_step or 0), 1)
        self.last_log_step = self.state.step
        lr = self.optimizers[next(iter(self.optimizers))].param_groups[0]["lr"]
        scalars = update_scalars(out, mean_loss, self.ctx.grad_norms, lr)
        scalars.update(rates(out, updates, elapsed, self.env.world_size))
        scalars.update(shares)
        scalars.update(self.monitor.latest())
        if self.guard.skip:
            scalars["nonfinite_skips"] = self.guard.skipped
        if self.device.type == "cuda":
            scalars["gpu_mem_peak_gb"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        self.trackers.log_scalars(self.state.step, scalars)
        self.console.update(self.state.step, scalars)
        self.timers.reset_window()

    def _histograms(self, micro: list[MicroBatch]) -> None:
        if self.env.is_main:
            values = self.task.histograms(micro[0].data)
            self.trackers.log_histograms(
                self.state.step, {k: v.detach().float().cpu().numpy() for k, v in values.items()}
            )

    def _save(self, best: bool = False) -> None:
        self._check_finite()
        start = time.perf_counter()
        self.keeper.save(best=best)
        seconds = time.perf_counter() - start
        self.timers.add("checkpoint", seconds)
        self.budget.save.observe(seconds)
        self._last_save_clock = time.monotonic()
        self.chain.progress(self.state.step, self.timers.training_seconds)
        self.console.flush()  # (the trackers' lines: at the commit)

    def _check_finite(self) -> None:
        """Before every save: the losses since the last check and the weights must be finite on every rank,
        else all ranks raise NonFinite instead of saving (one small collective per save)."""
        if self._window:
            self.guard.check_losses(torch.stack(self._window), self._window_first)
        self.guard.check_weights(self.raw_modules, self.state.step)
        self.guard.raise_if(dist.agree_max([self.guard.code()])[0])

    def _finish(self, reason: str) -> RunResult:
        improved = False
        if reason == "finished" and self.has_val:
            result = self._evaluate()  # the final evaluation (the only one when eval_every is 0)
            if result.abandoned:  # cut short by a stop: the next start runs it (the run is not finished)
                if self.keeper.last_saved_step != self.state.step:
                    self._save()
                return self._result("stopped", result.abandoned, EXIT_RESUMABLE)
            improved = result.improved
        self.state.finished = True
        self._save(best=improved)
        if self.env.is_main:
            self.task.after_training(self.raw_modules, self.state.step)
        return self._result("finished", reason, EXIT_OK)

    def _failed(self, bad: NonFinite) -> RunResult:
        saved = self.keeper.last_saved_step
        return self._result(
            "failed",
            "nonfinite",
            EXIT_FAILURE,
            nonfinite_message(bad, self.state.step, saved, self.guard.skip),
            nonfinite_update=bad.update,
            stopped_at_update=self.state.step,
        )

    def _result(self, status: str, reason: str, code: int, message: str = "", **extra: Any) -> RunResult:
        self.console.close()  # the bar ends before the run's last line
        digest = params_sha256(self.raw_modules)
        if self.env.is_main and status != "already_finished":
            last = self.state.step
            if status == "failed":  # it got only as far as its last save: where a next start continues
                saved = self.keeper.last_saved_step
                last = saved if saved is not None else (self.state.resumed_step or 0)
            hop = self.chain.close_hop(last, self.timers.training_seconds, reason)
            summary = summary_record(status, reason, last, self.state, digest, self.timers, hop)
            summary.update(job_id=self.env.scheduler_job, nonfinite_skips=self.guard.skipped, **extra)
            write_summary(self.run_dir, {**summary, **self.chain.totals()})
        return RunResult(status, reason, self.state.step, digest, code, message)

    def close(self) -> None:
        try:
            self.keeper.close()
            self.keeper.remote.finish(self.budget)  # the last upload, never past the walltime
            for close in reversed(self._closers):
                close()
            self.trackers.close()
            self.console.close()
        finally:
            if self.lock is not None:
                self.lock.release()  # last: everything above may still write into the run folder


def _next_multiple(step: int, every: int) -> int:
    """The first multiple of `every` after `step`."""
    return (step // every + 1) * every
