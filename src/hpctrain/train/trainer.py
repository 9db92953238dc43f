"""The trainer: counts updates, keeps to the time budget, saves and resumes exactly. It knows no model.

The loop is `_train` (one update: fetch, vote on skip/stop, step, then each part asks its cadence in cadence.py
whether it is due); what all ranks decide together at a check step is `_at_check` (one vote, cadence.CheckVotes,
whose fields carry their reduction; a hop ends for a runtime.budget.Stop). Set-up (setup.py), compiling
(compile/compiler.py), evaluation (evaluation.py), the log line and the finite check before a save (update_log.py),
outcomes and summary.json's keys (outcome.py), the parts a checkpoint holds (parts.py), saving (checkpointer.py),
finding a checkpoint (checkpoint.py `locate`), resuming (resume.py) and profiling (profile.py) live beside it.

Size (~510 lines, over the house's ~400): the loop and the decisions all ranks take together at its step
boundaries (stop, save, evaluate, skip) are kept in one place on purpose, so one file shows when anything
happens."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import torch

from hpctrain.config.schema import ConfigBase
from hpctrain.errors import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK, EXIT_RESUMABLE, OutOfMemory, UserError
from hpctrain.fsutil import make_folders
from hpctrain.runtime.budget import Stop, StopRequested, TimeBudget, watch_waits
from hpctrain.runtime.env import ClusterEnv
from hpctrain.runtime.seeding import RANK_STREAM, derive, seed_everything
from hpctrain.runtime.threads import CoreProbe
from hpctrain.track.base import Trackers
from hpctrain.track.build import build_tracking
from hpctrain.track.chain import ChainLog, NoChain, write_summary
from hpctrain.track.console import Console, NullConsole
from hpctrain.track.monitor import Monitor, NoMonitor
from hpctrain.train.cadence import EMPTY, GO, Cadences, CheckVotes, FetchVotes
from hpctrain.train.checkpoint import CheckpointStore
from hpctrain.train.checkpointer import Checkpointer
from hpctrain.train.compile.compiler import Compiler
from hpctrain.train.context import Context
from hpctrain.train.counters import Counters
from hpctrain.train.evaluation import EvalResult, Evaluator
from hpctrain.train.finished import start_finished_run
from hpctrain.train.nonfinite import NonFinite, NonFiniteGuard
from hpctrain.train.oom import OomGuard
from hpctrain.train.optim import LRSchedule
from hpctrain.train.outcome import (
    DeviceTimeline,
    NoTimeline,
    RunResult,
    Timers,
    continues_from,
    data_failure,
    nonfinite_message,
    summary_record,
)
from hpctrain.train.parts import Group, params_sha256
from hpctrain.train.profile import NoProfiler, WindowProfiler, build_profiler
from hpctrain.train.resume import Where, resume
from hpctrain.train.runlock import RunLock, lock_run_folder
from hpctrain.train.setup import Setup
from hpctrain.train.spikes import Rewind, SpikeGuard
from hpctrain.train.task import BatchStream, MicroBatch, StepOutput, Task, take_update
from hpctrain.train.update_log import LogLine, LossWindow
from hpctrain.train.watchdog import HangWatchdog, NoWatchdog, build_watchdog
from hpctrain.train.what_ran import hop_record

__all__ = ["RunResult", "Trainer"]


class Trainer:
    # Made by build() (the task's networks and data exist only then):
    raw_modules: dict[str, torch.nn.Module]
    modules: dict[str, torch.nn.Module]
    optimizers: dict[str, torch.optim.Optimizer]
    base_lrs: dict[str, float]
    ctx: Context
    oom: OomGuard
    train_stream: BatchStream
    schedule: LRSchedule
    has_val: bool
    evaluator: Evaluator
    cadence: Cadences

    def __init__(
        self,
        cfg: ConfigBase,
        task: Task[ConfigBase],
        env: ClusterEnv,
        run_dir: Path,
        budget: TimeBudget,
        config_file: str | None = None,
        probe: CoreProbe | None = None,
    ) -> None:
        """`probe`: how busy the cores were while the process started (runtime/threads.py)."""
        self.cfg = cfg
        self.config_file = config_file  # where the config came from: its git tree is recorded (what_ran.py)
        self.ran: dict[str, Any] = {}  # what ran in this hop (rank 0; made by build)
        self.task = task
        self.env = env
        self.run_dir = run_dir
        self.budget = budget
        self.chain: ChainLog = ChainLog(run_dir) if env.is_main else NoChain()
        self.setup = Setup(cfg, task, env, probe, self.chain.hops[-1] if self.chain.hops else None)
        self.device = self.setup.device
        self.compiler = Compiler(cfg, task, env, self.device, run_dir)  # torch.compile, all of it
        self.store = CheckpointStore(run_dir / "checkpoints", cfg.checkpoint.keep_last)
        # Stand-ins until start_tracking (and for good on ranks other than 0): "off" needs no `if`.
        self.trackers = Trackers()
        self.console: Console = NullConsole()
        self.timers = Timers()
        # CUDA: the GPU's own time per update, read at log steps (elsewhere the host's clock is the truth)
        cuda = self.device.type == "cuda"
        self.timeline: DeviceTimeline | NoTimeline = DeviceTimeline() if cuda else NoTimeline()
        self.monitor: Monitor | NoMonitor = NoMonitor()
        self.profiler: WindowProfiler | NoProfiler = NoProfiler()
        self.watchdog: HangWatchdog | NoWatchdog = NoWatchdog()
        self.counters = Counters()  # where the run is (saved as the snapshot's "counters")
        self.log_line = LogLine(env, self.device)
        # Rank 0 owns the run folder from build() to close(); close() is safe after a half-done build.
        self.lock = RunLock(run_dir, env.job_id, env.restart_count) if env.is_main else None
        self.checkpointer = Checkpointer(cfg, self.store, env.is_main)
        self._closers: list[Callable[[], None]] = []
        self.guard = NonFiniteGuard(cfg.train)
        self.spikes = SpikeGuard(cfg.train, lambda: self.checkpointer.last_saved_step)  # train.on_spike
        self._data_error: UserError | None = None  # a bad file met mid-run, said after the save
        self.window = LossWindow(self.guard, self.spikes)  # the losses since the last log line
        self._stop_reason: Stop | None = None  # why the hop ended (_result)

    # ---- set-up -------------------------------------------------------------------------------------------

    def build(self) -> None:
        chain = lock_run_folder(self.lock, self.run_dir, self.store.saves)
        self.chain = chain if chain is not None else self.chain
        if self.env.is_main:
            make_folders(self.run_dir / "checkpoints")
        seed_everything(self.cfg.run.seed)
        self.raw_modules = self.setup.networks()
        self.modules = self.setup.wrap(self.raw_modules, self.compiler, self.budget)
        self.compiler.begin(self.modules)
        self.optimizers, self.base_lrs = self.setup.optimizers(self.raw_modules)
        self.ctx = self.setup.context(
            self.modules, self.raw_modules, self.optimizers, self.guard, self.spikes
        )
        saved = lambda: self.checkpointer.last_saved_step  # noqa: E731
        self.oom = OomGuard(self.cfg.train, self.cfg.data, self.task, self.env, self.ctx, saved)
        self.train_stream = self.task.train_stream(self.cfg.run.seed)
        self._closers.append(self.train_stream.close)
        self.counters.total_updates = self.setup.total_updates(self.train_stream)
        self.schedule = LRSchedule(
            self.cfg.schedule, self.counters.total_updates, self.setup.updates_per_epoch(self.train_stream)
        )
        self.profiler = build_profiler(
            self.cfg.train.profile,
            self.run_dir,
            self.cfg.run.name or "run",
            self.env.rank,
            self.device.type == "cuda",
        )
        self._closers.append(self.profiler.close)
        self.has_val = self.setup.has_val()
        self.cadence = Cadences.build(self.cfg, self.counters.total_updates, self.has_val, self.budget)
        self.evaluator = Evaluator(
            self.task, self.ctx, self.budget, self.cfg.train, self.cfg.checkpoint, self.cfg.run.seed
        )
        progress = lambda: (self.counters.step, self.ctx.backwards, self.evaluator.batches)  # noqa: E731
        self.watchdog = build_watchdog(self.cfg.distributed, self.env, self.run_dir, progress, self._hung)
        self._closers.append(self.watchdog.close)
        # Per-rank random streams (dropout, sampling) after the shared initialisation.
        seed_everything(derive(self.cfg.run.seed, RANK_STREAM, self.env.rank))
        self.budget.save.initial = self.setup.save_guess(self.raw_modules)
        self.ran = hop_record(self.env, self.device, self.config_file)  # one gather, once per hop
        # the stateful parts a checkpoint holds (parts.py), by the names its snapshot keeps them under
        self.checkpointer.register(
            modules=Group(self.raw_modules), optimizers=Group(self.optimizers), counters=self.counters,
            data=self.train_stream, task=self.task, budget=self.budget, trackers=self.trackers, oom=self.oom,
            spikes=self.spikes, scaler=self.ctx.scaler,
        )  # fmt: skip

    def resume(self) -> str:
        """Load what checkpoint.resume/restart say into the parts (resume.py); returns what happened, for the
        log."""
        where = Where(self.cfg, self.env, self.run_dir, self.schedule, self.base_lrs)
        done = resume(self.checkpointer.parts, self.store, where)
        self.checkpointer.last_saved_step = done.last_saved_step
        self.checkpointer.config_changes, self.checkpointer.changes = done.config_changes, done.changes
        if self.env.is_main:
            self.chain = ChainLog(self.run_dir)  # a fresh start may have moved the old run's chain.json aside
        return f"{done.said}\n{done.length_note}" if done.length_note else done.said

    def start_tracking(self, log_file: TextIO | None = None) -> None:
        """Rank 0: trackers, the console (its plain lines also into `log_file`) and the hardware monitor."""
        if not self.env.is_main:
            return
        counters = self.counters
        hop = {
            "hop": len(self.chain.hops),
            "world_size": self.env.world_size,
            **self.checkpointer.hop_identity(),
        }
        where = (counters.step, counters.total_updates, counters.resumed_step)
        self.trackers, self.console, self.monitor = build_tracking(
            self.cfg, self.run_dir, self.env, where, counters.tracker_state, hop, self.ran, self.budget.remaining,
            log_file, self.device.type == "cuda",
        )  # fmt: skip
        self._closers.append(self.monitor.close)
        self.checkpointer.register(trackers=self.trackers)

    # ---- the loop ------------------------------------------------------------------------------------------

    @property
    def already_finished(self) -> bool:
        """Finished (or stopped early) with no more updates asked for than it had: nothing to train."""
        return self.counters.finished and self.counters.total_updates <= self.counters.finished_total

    def fit(self) -> RunResult:
        if self.already_finished:
            # Finished (or stopped early) with this many updates asked for: nothing to train, no new hop; only
            # what a kill after the final save left undone (the hop's close, summary.json) is done.
            result = self._result("already_finished", Stop.FINISHED, EXIT_OK)
            if self.env.is_main:
                args = (self.chain, self.store, self.run_dir, self.counters, self.cfg, self.checkpointer)
                start_finished_run(result, *args, self.budget)
            return result
        # Resumed from a finished checkpoint with more updates asked for: not finished until its own final save
        # (a save on the way that kept the flag would make that checkpoint "finished" short of the new length).
        self.counters.finished = False
        self.chain.open_hop(
            self.env.scheduler_job,  # what squeue knows it by (`hpctrain status`): <array>_<task> for a task
            self.env.node_list,
            self.counters.step,
            self.env.world_size,
            self.budget.deadline,
            identity={**self.checkpointer.hop_identity(), **self.setup.threads_record},
            ran=self.ran,
        )
        watch_waits(self.budget.urgent_stop_reason)  # data waits give up when a stop is due
        self.watchdog.start()
        try:
            while True:
                try:
                    return self._hop()
                except Rewind as spike:  # train.on_spike=rewind
                    self._rewind(spike)
        except NonFinite as bad:
            return self._failed(bad)
        except OutOfMemory as oom:  # nothing saved after it (the update was half done): `latest` stays
            self._result("failed", Stop.OUT_OF_MEMORY, oom.exit_code, str(oom), exit_code=oom.exit_code)
            raise
        finally:
            watch_waits(None)

    def _hop(self) -> RunResult:
        """Train, then end the hop as the reason says (finish, or save and stop)."""
        reason = self._train()
        if reason is None or reason == Stop.EARLY_STOP:
            return self._finish(reason or Stop.FINISHED)
        untrained = reason == Stop.DATA_ERROR and self.counters.step == 0  # a new run refused its data
        if self.checkpointer.last_saved_step != self.counters.step and not untrained:
            self._save()
        if reason == Stop.DATA_ERROR:
            self._result("stopped", Stop.DATA_ERROR, EXIT_BAD_INPUT)
            raise data_failure(self._data_error, self.counters.step)
        return self._result("stopped", reason, EXIT_RESUMABLE)

    def _rewind(self, spike: Rewind) -> None:
        """Back to the last checkpoint as a new hop would resume from it, the LR scaled (spikes.py)."""
        where = Where(self.cfg, self.env, self.run_dir, self.schedule, self.base_lrs)
        self.checkpointer.last_saved_step = self.spikes.rewind(
            spike, self.checkpointer.parts, self.store, where
        )
        self.window.restart(self.counters.step)  # the losses of the updates undone
        self.schedule.applied, self.log_line.last_step = None, self.counters.step

    def _train(self) -> Stop | None:
        """Updates until the last one (None) or an agreed stop (its reason): docs/training.md, "One update".

        Per update only what every update needs (its batches, LR, counters, timers); each other part asks its
        cadence (cadence.py) whether it is due: a log line (the loss window is read only then), histograms, and
        a check step (evaluation, saves, the budget and one vote of all ranks on what comes next)."""
        counters, stream, cadence, clock = self.counters, self.train_stream, self.cadence, time.perf_counter
        self._start_hop_loop(clock())
        out: StepOutput | None = None
        # A stop cut this update's evaluation short last hop: run it now, as an uninterrupted run did.
        owed = self.budget.eval_owed == counters.step and counters.step < counters.total_updates
        if owed and (reason := self._at_check(owed_eval=True)) is not None:
            return reason
        batches = iter(stream)
        ahead = self.compiler.ahead
        while counters.step < counters.total_updates:
            start = clock()
            before = stream.state_dict()
            micro, votes = self._fetch(batches)
            if votes.stop:  # every rank drops this update; batches some ranks already took are given back
                stream.load_state_dict(before)
                return self._stopping(votes.stop, out)
            if votes.empty:
                continue  # an empty batch (on any rank): nothing to learn from, nothing counted
            assert micro is not None  # not skipped means no rank was empty
            if ahead is not None and ahead.waiting:
                self.compiler.start_helper(micro, self.raw_modules, self.budget)
            self.schedule.apply(counters.step, self.spikes.lr_scale, self.optimizers, self.base_lrs)
            out, end = self._update(micro, start)
            if cadence.log.due(counters.step, end):
                self._log_window(out)
            else:
                self.console.tick(counters.step)
            if cadence.hist.due(counters.step):
                self._histograms(micro)
            if cadence.check.due(counters.step) and (reason := self._at_check()) is not None:
                return self._stopping(reason, out)
        return None

    def _start_hop_loop(self, now: float) -> None:
        self.cadence.save.saved()  # time-based saves count from the hop's start
        self.cadence.log.start(now)
        self.cadence.check.next = self.counters.step + 1
        self.window.first = self.counters.step + 1
        self.compiler.hop_began(self.counters.step)

    def _fetch(self, batches: Any) -> tuple[list[MicroBatch] | None, FetchVotes]:
        """The next update's micro-batches, and what all ranks agreed about it (one collective per update, none
        at world size 1): skip it (empty somewhere) or stop (a signal or the deadline during a data wait, or a
        bad file met mid-run under data.on_bad_file=fail: what was trained is kept). An empty update asks the
        budget too: skipped updates never reach a check step, and a run of them must still hear a stop."""
        try:
            micro = take_update(self.task, batches, self.cfg.train.grad_accum_steps, self.device)
            votes = GO if micro is not None else EMPTY
            if micro is None and (urgent := self.budget.urgent_stop_reason()) is not None:
                votes = FetchVotes(empty=True, stop=urgent)
        except StopRequested as stop:
            micro, votes = None, FetchVotes(stop=stop.reason)
        except UserError as bad:
            self._data_error, micro, votes = bad, None, FetchVotes(stop=Stop.DATA_ERROR)
        return micro, votes.agree()

    def _update(self, micro: list[MicroBatch], start: float) -> tuple[StepOutput, float]:
        """One optimizer update (the task's train_step) and its bookkeeping; returns its output and end time."""
        counters, timers, timeline, clock = self.counters, self.timers, self.timeline, time.perf_counter
        compute_start = clock()
        timeline.start()
        out = self.oom.train_step(micro, counters.step + 1)
        counters.step += 1
        samples = micro[0].samples if len(micro) == 1 else sum(m.samples for m in micro)
        counters.samples += samples * self.env.world_size
        loss = out.loss
        self.window.add(loss)
        if self.guard.skip:
            self.guard.note_update(self.ctx.skipped_steps, counters.step)
        end = clock()
        if self.compiler.compiling and self.compiler.compiled_in_update():
            # compile time: kept out of the step estimate and out of the shares
            timers.add("compile", end - start)
            timeline.end(counted=False)
        else:
            timers.add("data", compute_start - start)
            timers.add("step", end - compute_start)
            timeline.end()
            self.budget.step.observe(end - start)
        self.profiler.step(counters.step)
        return out, end

    def _stopping(self, reason: Stop | None, out: StepOutput | None) -> Stop | None:
        """A stop between log lines still records the hop's last metrics line (before fit's save)."""
        if self.window.losses and out is not None:
            self._log_window(out)
        return reason

    def _at_check(self, owed_eval: bool = False) -> Stop | None:
        """At a check step: evaluate and save when due, then every rank votes once on what comes next."""
        counters, cadence = self.counters, self.cadence
        self.compiler.at_check(counters.step, self.modules, self.budget, self.console.message)
        votes = CheckVotes()
        if owed_eval or cadence.eval_.due(counters.step):
            result = self._evaluate()
            if result.abandoned:
                return result.abandoned  # every rank abandoned it together: stop (fit saves)
            if result.improved:
                self._save(best=True)
            elif cadence.save.due(counters.step):
                self._save()
            votes.stop = Stop.EARLY_STOP if result.stop_early else None
        elif cadence.save.due(counters.step):
            self._save()
        if counters.step >= counters.total_updates:
            return None
        # Until the next check the run trains on unasked: the budget looks that many updates ahead, and at the
        # evaluation after the next update (the final one, in _finish, too).
        ahead = cadence.check.plan(counters.step, self.guard.skip, cadence.upcoming_checks(counters.step))
        budget_reason = self.budget.local_stop_reason(cadence.eval_.due_next(counters.step), ahead=ahead)
        votes.stop = votes.stop or budget_reason  # an early stop outranks the budget's (Stop.rank)
        votes.save_due = self.env.is_main and cadence.save.time_due()  # rank 0's clock decides for all
        votes.nonfinite, votes.spike = self.guard.first_bad, self.spikes.found
        votes.step_seconds = self.budget.step.value
        agreed = votes.agree()
        cadence.check.step_seconds = agreed.step_seconds
        self.guard.raise_if(agreed.nonfinite)
        self.spikes.raise_if(agreed.spike)
        if agreed.stop is None and agreed.save_due:
            self._save()
        return agreed.stop

    # ---- evaluation ---------------------------------------------------------------------------------------

    def _evaluate(self) -> EvalResult:
        self.console.flush()  # the progress lines so far out before the loop goes quiet
        self.trackers.show()
        result = self.evaluator.run(self.raw_modules, self.counters, self.console.message)
        self.timers.add("eval", result.seconds)
        if result.metrics and self.env.is_main:
            self.trackers.log_scalars(self.counters.step, result.metrics)
            shown = " | ".join(f"{k} {v:.4g}" for k, v in result.metrics.items())
            self.console.message(f"eval at update {self.counters.step} | {shown}")
        return result

    # ---- logging, saving, finishing ----------------------------------------------------------------------

    def _log_window(self, out: StepOutput) -> None:
        """At a log step: the losses since the last one are checked (every rank) and rank 0 logs the line."""
        losses = self.window.checked()  # read once, only when logging: no per-update tensor arithmetic
        busy = self.timeline.busy_seconds()  # CUDA: the GPU's own time (the read above already waited)
        if busy is not None:
            self.timers.rebook(busy)
        if self.env.is_main:
            lr = self.optimizers[next(iter(self.optimizers))].param_groups[0]["lr"]
            scalars = self.log_line.scalars(out, losses, self.counters, self.timers, lr, self.ctx.grad_norms)
            scalars.update(self.monitor.latest())
            if self.guard.skip:
                scalars["nonfinite_skips"] = self.guard.skipped
            self.trackers.log_scalars(self.counters.step, scalars)
            self.console.update(self.counters.step, scalars)
            self.timers.reset_window()
        self.window.restart(self.counters.step)

    def _histograms(self, micro: list[MicroBatch]) -> None:
        if self.env.is_main:
            values = self.task.histograms(micro[0].data)
            self.trackers.log_histograms(
                self.counters.step, {k: v.detach().float().cpu().numpy() for k, v in values.items()}
            )

    def _save(self, best: bool = False) -> None:
        self.window.check_for_save(self.raw_modules, self.counters.step)  # finite, or no save (update_log.py)
        seconds = self.checkpointer.save(self.counters.step, best=best)
        self.timers.add("checkpoint", seconds)
        self.budget.save.observe(seconds)
        self.cadence.save.saved()
        self.chain.progress(self.counters.step, self.timers.training_seconds)
        self.console.flush()  # (the trackers' lines: at the commit)

    def _finish(self, reason: Stop) -> RunResult:
        improved = False
        if reason == Stop.FINISHED and self.has_val:
            result = self._evaluate()  # the final evaluation (the only one when eval_every is 0)
            if result.abandoned:  # cut short by a stop: the next start runs it (the run is not finished)
                if self.checkpointer.last_saved_step != self.counters.step:
                    self._save()
                return self._result("stopped", result.abandoned, EXIT_RESUMABLE)
            improved = result.improved
        self.counters.finished = True
        self._save(best=improved)
        if self.env.is_main:
            self.task.after_training(self.raw_modules, self.counters.step)
        return self._result("finished", reason, EXIT_OK)

    def _failed(self, bad: NonFinite) -> RunResult:
        saved = self.checkpointer.last_saved_step
        return self._result(
            "failed",
            Stop.NONFINITE,
            EXIT_FAILURE,
            nonfinite_message(bad, self.counters.step, saved, self.guard.skip),
            nonfinite_update=bad.update,
            stopped_at_update=self.counters.step,
        )

    def _hung(self, line: str) -> None:
        """From the hang watchdog's thread, the loop stuck: the hop ends as a stop at the last save."""
        self._result("stopped", Stop.HANG, EXIT_RESUMABLE, line, hang=line)

    def _result(self, status: str, reason: Stop, code: int, message: str = "", **extra: Any) -> RunResult:
        self.console.close()  # the bar ends before the run's last line
        self._stop_reason = reason
        digest = params_sha256(self.raw_modules)
        copies: dict[str, str] = {}
        if self.env.is_main and status != "already_finished":
            # the copies of the last save first: summary.json and the exit code say whether they arrived
            copies = self.checkpointer.settle(self.budget)
            if copies and status == "finished":  # trained to the end, but its copy elsewhere is not: exit 1
                code = EXIT_FAILURE
            last = continues_from(status, reason, self.counters, self.checkpointer.last_saved_step)
            hop = self.chain.close_hop(last, self.timers.training_seconds, reason)
            summary = summary_record(status, reason, last, self.counters, digest, self.timers, hop)
            skips, spikes = self.guard.skipped, self.spikes.summary()
            summary.update(job_id=self.env.scheduler_job, nonfinite_skips=skips, ran=self.ran, **extra)
            summary.update(copy_failures=copies, **spikes)  # {checkpoint.mirror_to or a pelican:// dir: why}
            summary.update(self.compiler.summary(self.counters.step, self.timers.total.get("compile", 0.0)))
            write_summary(self.run_dir, {**summary, **self.chain.totals()})
        return RunResult(status, reason, self.counters.step, digest, code, message, copies)

    def close(self) -> None:
        try:
            self.checkpointer.close()
            self.checkpointer.remote.finish(self.budget)  # the last upload, never past the walltime
            for close in reversed(self._closers):
                close()
            self.trackers.close()
            self.console.close()
        finally:
            try:  # the helper's grace is time that would pass idle: after the trackers' own shutdown
                self.compiler.close(self.budget, self._stop_reason == Stop.TIME_BUDGET)
            finally:
                if self.lock is not None:
                    self.lock.release()  # last: everything above may still write into the run folder
