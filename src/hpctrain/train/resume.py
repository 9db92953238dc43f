"""Resuming: which checkpoint a start continues from (a ResumePlan), and putting its snapshot back into the
trainer's parts in place.

The trainer hands `resume()` its parts (parts.py: networks, optimizers, scaler, counters, data position, task,
budget timings, trackers), the checkpoint store and where the run is. Rank 0 plans: checkpoint.resume's form
(resume_forms.py), this run folder's own checkpoints first (a remote checkpoint.dir fills an empty working copy,
remote_ckpt.py), then a given file; a fresh start over an earlier run's files moves them aside first (never
overwrites history). Every rank follows the plan and loads that very file: ranks falling back to different
checkpoints (a flaky read on one node) would disagree on the step and deadlock later. A refusal found on rank 0
crosses to every rank as the exception itself (UserError: exit 2; RunError: exit 1) and is raised on all.
Before a full restore the checkpoint's configuration is judged (config/identity.py): a run folder continues
only its own run.

Size (~430 lines, over the house's ~400): the plan and the restore it leads to are one protocol; split, the
invariants between them (which file every rank loads, what is recorded) would live in two places.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hpctrain.config.identity import GROWS, judge, refusal, show
from hpctrain.config.schema import ConfigBase
from hpctrain.errors import RunError, UserError
from hpctrain.fsutil import make_folders
from hpctrain.runtime import dist
from hpctrain.runtime.seeding import set_rng_state
from hpctrain.track.chain import read_chain
from hpctrain.train.checkpoint import (
    FULL_STATE_KEYS,
    CheckpointStore,
    Located,
    NotLocated,
    Unreadable,
    is_full_state,
    locate,
    read_checkpoint,
    strip_prefixes,
)
from hpctrain.train.counters import Counters
from hpctrain.train.length import length_change
from hpctrain.train.parts import Group, Parts
from hpctrain.train.remote_ckpt import claim_destinations, local_resume_path, pull_working_copy
from hpctrain.train.resume_forms import GIVEN_MISSING, note_rewind, rewound
from hpctrain.train.runlock import earlier_history, set_aside_previous_run

if TYPE_CHECKING:
    from hpctrain.runtime.env import ClusterEnv
    from hpctrain.train.optim import LRSchedule

log = logging.getLogger(__name__)

_FRESH_HINT = "to start afresh use another run.name, or checkpoint.resume=never (the old run is moved aside)"
_OTHER_HINT = "give a checkpoint of this model in checkpoint.resume"
_SHOWN = 3  # mismatching parameters named in an error line


class ResumeKind(enum.Enum):
    FRESH = "fresh"  # nothing to continue: update 0
    LATEST = "latest"  # this run folder's latest checkpoint
    REWIND = "rewind"  # checkpoint.resume=best | step_N: back to one of this folder's own checkpoints, once
    # checkpoint.resume=<path>, checkpoint.restart=true: everything from another checkpoint
    RESTART = "restart"
    FINETUNE = "finetune"  # checkpoint.resume=<path>, restart=false: its weights only


@dataclass(frozen=True)
class ResumePlan:
    """Rank 0's decision, followed by every rank."""

    kind: ResumeKind
    path: Path | None = None  # the checkpoint every rank loads (None: fresh)
    given: str = ""  # checkpoint.resume as written (rewind, restart, finetune)
    note: str = ""  # said after "starting a new run" (a previous run moved aside)


@dataclass
class Where:
    """Where the run is and what it is: what the plan and the identity check read besides the parts."""

    cfg: ConfigBase
    env: ClusterEnv
    run_dir: Path
    schedule: LRSchedule  # with base_lrs: what a new length does to the LR (train/length.py)
    base_lrs: dict[str, float]


@dataclass
class Resumed:
    """What a resume did, for the log and for the saves to come."""

    said: str  # the line for the log
    # the update of the checkpoint loaded (None: nothing of this run loaded)
    last_saved_step: int | None = None
    config_changes: list[dict[str, Any]] = field(default_factory=list)  # every hop's, kept in each snapshot
    changes: dict[str, dict[str, list[Any]]] = field(default_factory=lambda: {"accepted": {}, "allowed": {}})
    length_note: str = ""  # what a new length does to the LR, said after the resume line


def resume(parts: Parts, store: CheckpointStore, where: Where) -> Resumed:
    """Plan on rank 0, follow on every rank, restore the parts in place. Raises UserError/RunError on all."""
    counters = parts["counters"]
    assert isinstance(counters, Counters)
    counters.resumed_step = None
    if where.env.is_main:
        store.clean_temporaries()
    dist.barrier()
    plan: ResumePlan | UserError | RunError = ResumePlan(ResumeKind.FRESH)
    snap: dict[str, Any] | None = None
    if where.env.is_main:
        try:
            plan, snap = _plan(store, where, counters.total_updates)
        except (UserError, RunError) as exc:
            plan = exc
    agreed = dist.broadcast_object(plan)
    if isinstance(agreed, (UserError, RunError)):
        raise type(agreed)(str(agreed)) from None
    assert isinstance(agreed, ResumePlan)
    if agreed.kind is ResumeKind.FRESH:
        return Resumed("starting a new run" + agreed.note)
    assert agreed.path is not None
    if snap is None:  # the other ranks read the file rank 0 chose
        try:  # a file the user named (restart, finetune) may come without its sidecar, as on rank 0
            snap = read_checkpoint(
                agreed.path, named=agreed.kind in (ResumeKind.RESTART, ResumeKind.FINETUNE)
            )
        except Unreadable as exc:
            raise RuntimeError(
                f"rank {where.env.rank} cannot read checkpoint {agreed.path} that rank 0 chose: {exc}"
            ) from None
    return _Restore(parts, counters, where).follow(agreed, snap)


def restore_latest(parts: Parts, store: CheckpointStore, where: Where) -> int | None:
    """This run's last checkpoint back into the parts on every rank (rank 0 picks the file); its update, or None
    when there is none. A rewind inside a hop (train.on_spike=rewind) loads what a new hop resuming would."""
    counters = parts["counters"]
    assert isinstance(counters, Counters)
    loaded = store.load_latest() if where.env.is_main else None
    path = dist.broadcast_object(str(loaded[1]) if loaded else None)
    if not isinstance(path, str):
        return None
    snap = loaded[0] if loaded else read_checkpoint(Path(path))
    _Restore(parts, counters, where)._full(snap, Path(path), f"checkpoint {path}", _FRESH_HINT)
    return counters.step


def _plan(store: CheckpointStore, where: Where, total: int) -> tuple[ResumePlan, dict[str, Any] | None]:
    """The plan and the snapshot it loads, on rank 0 (`total`: the updates this run is configured for)."""
    cfg, run_dir = where.cfg, where.run_dir
    claim_destinations(cfg, run_dir)  # first: another run's copies are refused before anything moves
    mode, form = cfg.checkpoint.resume, cfg.checkpoint.resume_form
    if form.kind == "never":
        if not earlier_history(run_dir):
            return ResumePlan(ResumeKind.FRESH), None
        if not _requeued_same_job(where.env, run_dir):
            return _fresh_over(store, run_dir, "checkpoint.resume=never"), None
        log.warning(
            "checkpoint.resume=never, but this run folder holds the run of this very job (SLURM job %s, "
            "requeued): continuing it",
            where.env.job_id,
        )
    if form.kind == "rewind" and not rewound(form, run_dir):  # best / step_N: back to one of its own, once
        found = _located(mode, store.folder, mode)
        return ResumePlan(ResumeKind.REWIND, found.file, mode), found.state
    # The run folder's own checkpoints come first, also with resume=<path>: a requeued fine-tuning job
    # continues its own run instead of starting again from the given file.
    pull_working_copy(cfg, store)  # a remote checkpoint.dir fills an empty working copy
    loaded = store.load_latest()
    if loaded is not None:
        return ResumePlan(ResumeKind.LATEST, loaded[1]), loaded[0]
    reached = _checkpointed_update(run_dir)
    if reached:
        raise RunError(
            f"chain.json of {run_dir} says this run saved checkpoints up to update {reached}, but "
            f"{store.folder} holds none; nothing was changed: if the file system is having trouble, try "
            "again later; to start afresh use checkpoint.resume=never (the old run is moved aside)"
        )
    if form.kind == "latest":
        raise UserError(
            f"checkpoint.resume=latest: {store.folder} holds no checkpoint to continue from; use auto to "
            "start afresh when there is none"
        )
    if form.kind == "given":
        given = local_resume_path(cfg, where.env, run_dir, mode)
        found = _located(given, given)
        path, snap = found.file, found.state
        kind = ResumeKind.RESTART if cfg.checkpoint.restart else ResumeKind.FINETUNE
        if kind is ResumeKind.RESTART:
            _refuse_nothing_to_train(snap, mode, total)
        # no checkpoint of this run, but its history (metrics, summary, ...): kept, never overwritten
        note = (
            _fresh_over(store, run_dir, "no checkpoint of it is left").note if _earlier_run(run_dir) else ""
        )
        return ResumePlan(kind, path, mode, note), snap
    if _earlier_run(run_dir):
        # No checkpoint and no chain.json that names one, but an earlier run's history (metrics, summary, an
        # empty or damaged chain.json, training.log): a fresh start would overwrite it.
        return _fresh_over(store, run_dir, "no checkpoint of it is left"), None
    return ResumePlan(ResumeKind.FRESH), None


def _refuse_nothing_to_train(snap: dict[str, Any], given: str, total: int) -> None:
    """A new run restoring everything from another run's final checkpoint, asked for no more updates than that
    run had: it would train nothing and write no checkpoint of its own (and its folder would look like a run
    killed after its final save). Refused before anything is changed, with the ways to what was meant."""
    saved = snap.get("counters")
    if not isinstance(saved, dict) or not saved.get("finished"):
        return
    step, old_total = int(saved.get("step", 0)), int(saved.get("total_updates", 0))
    if total > old_total:
        return  # it trains on from there: updates and checkpoints of its own
    ended = "all its updates done" if step >= old_total else "stopped early by train.early_stopping"
    raise UserError(
        f"checkpoint.resume={given}: the final checkpoint of a finished run (update {step} of {old_total}, "
        f"{ended}): restoring everything from it (checkpoint.restart=true) with train.total_updates={total} "
        f"leaves nothing to train, and this run would write no checkpoint of its own. Raise "
        f"train.total_updates above {old_total} to train further from it, or set checkpoint.restart=false to "
        "start a new run from its weights"
    )


def _earlier_run(run_dir: Path) -> bool:
    """Whether the folder holds an earlier run's history that a fresh start would overwrite. chain.json with
    hops (none of which committed a checkpoint) is this run's own record of hops that kept no update (killed
    before their first save, requeued): the run starts afresh in place and its chain goes on."""
    return bool(earlier_history(run_dir)) and not read_chain(run_dir / "chain.json").hops


def _fresh_over(store: CheckpointStore, run_dir: Path, why: str) -> ResumePlan:
    """A fresh start in a folder holding an earlier run's files: they move aside first (the trainer reads
    chain.json again after this)."""
    aside = set_aside_previous_run(run_dir)
    make_folders(store.folder)
    return ResumePlan(ResumeKind.FRESH, note=f" ({why}: the previous run was moved to {aside})")


def _requeued_same_job(env: ClusterEnv, run_dir: Path) -> bool:
    """Whether the run in the folder was started by this very SLURM job before it was requeued."""
    if env.restart_count < 1 or not env.job_id:
        return False
    hops = read_chain(run_dir / "chain.json").hops
    return bool(hops) and hops[-1].get("job_id") == env.scheduler_job


def _previous_hop(run_dir: Path) -> str:
    """`; hop N of this run (the last one: job J, ended <reason>)`, from chain.json (empty if unknown)."""
    hops = read_chain(run_dir / "chain.json").hops
    if not hops:
        return ""
    last = hops[-1]
    job = f"job {last['job_id']}" if last.get("job_id") else "no job"
    ended = last.get("exit_reason") or "without closing its record (killed)"
    return f"; hop {len(hops) + 1} of this run (the last one: {job}, ended {ended})"


class _Restore:
    """Putting one snapshot back into the parts, with a line for each way it can fail to fit."""

    def __init__(self, parts: Parts, counters: Counters, where: Where) -> None:
        self.parts, self.counters, self.where = parts, counters, where
        modules, optimizers = parts["modules"], parts["optimizers"]
        assert isinstance(modules, Group) and isinstance(optimizers, Group)
        self.modules: dict[str, nn.Module] = modules.members
        self.optimizers: dict[str, torch.optim.Optimizer] = optimizers.members
        self.done = Resumed("")

    def follow(self, plan: ResumePlan, snap: dict[str, Any]) -> Resumed:
        path, counters, done = plan.path, self.counters, self.done
        assert path is not None
        given = f"checkpoint.resume={plan.given}"
        if plan.kind is ResumeKind.LATEST:
            self._full(snap, path, f"checkpoint {path}", _FRESH_HINT)
            done.said = f"resumed from {path} at update {counters.step}{_previous_hop(self.where.run_dir)}"
        elif plan.kind is ResumeKind.REWIND:
            self._full(snap, path, given, _FRESH_HINT)
            if self.where.env.is_main:
                note_rewind(self.where.run_dir, self.where.cfg.checkpoint.resume_form, path, counters.step)
            done.said = f"went back to {path} ({given}) at update {counters.step}"
        elif plan.kind is ResumeKind.RESTART:
            self._full(snap, path, given, _OTHER_HINT)
            done.said = f"restored everything from {plan.given} at update {counters.step}"
        else:
            self._modules(snap, given, _OTHER_HINT)
            done.said = f"fine-tuning from the weights of {plan.given} (fresh optimizer and schedule)"
        done.said += plan.note
        return done

    def _modules(self, state: dict[str, Any], source: str, hint: str) -> None:
        saved = state["modules"]
        for name, module in self.modules.items():
            if name not in saved:
                raise UserError(f"{source} has no network {name!r} (it has {sorted(saved)}); {hint}")
            weights = strip_prefixes(saved[name])
            problem = _mismatch(module, weights)
            if problem:
                raise UserError(f"{source} does not fit network {name!r}: {problem}; {hint}")
            try:
                module.load_state_dict(weights)
            except (RuntimeError, ValueError, KeyError) as exc:
                first = str(exc).strip().splitlines()[0][:300]
                raise UserError(f"{source} does not fit network {name!r}: {first}; {hint}") from None

    def _optimizer(
        self, name: str, optimizer: torch.optim.Optimizer, state: dict[str, Any], path: Path, source: str
    ) -> None:
        """Load one optimizer's state; another optimizer type's state is one line, not a KeyError mid-update."""
        fresh = "to go on from its weights with a fresh optimizer, start another run.name with "
        fresh += f"checkpoint.resume={path} and checkpoint.restart=false"
        saved_type = state.get("optimizer_types", {}).get(name)
        if saved_type is not None and saved_type != type(optimizer).__name__:
            raise UserError(
                f"{source} holds {saved_type} state for optimizer {name!r}, this run uses "
                f"{type(optimizer).__name__} (optim.name changed?): set it back, or {fresh}"
            )
        if name not in state["optimizers"]:
            raise UserError(
                f"{source} has no optimizer {name!r} (it has {sorted(state['optimizers'])}): {fresh}"
            )
        try:
            optimizer.load_state_dict(state["optimizers"][name])
        except (KeyError, ValueError, RuntimeError) as exc:
            first = str(exc).strip().splitlines()[0][:300] if str(exc) else type(exc).__name__
            raise UserError(
                f"{source}: its state does not fit optimizer {name!r} ({first}): {fresh}"
            ) from None

    def _full(self, state: dict[str, Any], path: Path, source: str, hint: str) -> None:
        if not is_full_state(state):
            missing = [key for key in FULL_STATE_KEYS if key not in state]
            raise UserError(
                f"{source} holds no full training state (no {', '.join(missing)}); to take its weights only "
                "use checkpoint.restart=false"
            )
        self._judge_config(state)
        self._modules(state, source, hint)
        for name, optimizer in self.optimizers.items():
            self._optimizer(name, optimizer, state, path, source)
        scaler = self.parts.get("scaler")
        if scaler is not None and state.get("scaler"):
            scaler.load_state_dict(state["scaler"])  # type: ignore[attr-defined]
        self.counters.load_state_dict(state["counters"])
        self._best_afresh_if_judged_otherwise()
        for name in ("data", "task", "budget", "oom", "spikes"):  # the data position exactly; others if saved
            self.parts[name].load_state_dict(state[name] if name == "data" else state.get(name, {}))  # type: ignore[attr-defined]
        self.counters.tracker_state = state.get("trackers", {})  # the trackers are built after the resume
        rngs = state["rng"]
        self.done.last_saved_step = self.counters.step
        env = self.where.env
        if len(rngs) == env.world_size:
            set_rng_state(rngs[env.rank])
        elif env.is_main:
            log.info(
                "checkpoint written by %d rank(s), this run has %d: the data position stays exact (one global "
                "sample order), the random streams restart from the seed",
                len(rngs),
                env.world_size,
            )

    def _best_afresh_if_judged_otherwise(self) -> None:
        """checkpoint.best_metric or best_mode changed since the checkpoint: the best kept is of another measure,
        so best.pt (and early stopping's patience) start afresh at the next evaluation."""
        changed = {**self.done.changes["accepted"], **self.done.changes["allowed"]}
        keys = [k for k in ("checkpoint.best_metric", "checkpoint.best_mode") if k in changed]
        if not keys or self.counters.best is None:
            return
        if self.where.env.is_main:
            log.info(
                "%s changed: the best so far (%.6g) was of %s, so best.pt is chosen afresh from the next evaluation",
                " and ".join(keys),
                self.counters.best,
                " ".join(str(changed[k][0]) for k in keys),
            )
        self.counters.best, self.counters.evals_without_improvement = None, 0

    def _judge_config(self, state: dict[str, Any]) -> None:
        """A run folder continues only its own run (config/identity.py): identity keys that differ from the
        checkpoint's are refused unless accepted; what changed is logged, and recorded in the checkpoint and the
        hop record. Every rank judges the same checkpoint and config, so all refuse together."""
        cfg, env, counters, done = self.where.cfg, self.where.env, self.counters, self.done
        done.config_changes = list(state.get("config_changes", []))
        old = state.get("config")
        saved = state["counters"]
        if not isinstance(old, dict):
            if env.is_main:
                log.info("this checkpoint holds no configuration (an older version): nothing to compare")
            return
        step = int(saved["step"])
        old_world = len(state.get("rng") or [None])  # one random state per rank that wrote it
        length = length_change(saved, cfg.schedule, self.where.schedule, self.where.base_lrs)
        verdict = judge(
            old,
            cfg,
            old_total=saved.get("total_updates"),
            new_total=counters.total_updates,
            old_world=old_world,
            new_world=env.world_size,
            length_effect=length.effect() if length is not None and length.needs_consent else None,
        )
        where, remedy = self._ways_forward()
        if counters.total_updates < step:
            raise UserError(
                f"train.total_updates={counters.total_updates} is below update {step}, which {where} has reached: a run "
                f"cannot be shortened; {remedy}"
            )
        if verdict.refused and all(c.mark == GROWS for c in verdict.refused):
            assert length is not None  # a length is refused only for what it does to the LR
            first, keys = verdict.refused[0], [c.key for c in verdict.refused]
            raise UserError(length.refusal(where, keys, show(first.old), show(first.new)))
        if verdict.refused:
            raise UserError(refusal(where, verdict.refused, remedy))
        done.length_note = length.note() if length is not None else ""
        done.changes = verdict.record()
        if verdict.accepted or verdict.allowed:
            done.config_changes.append({"step": step, **done.changes})
        if env.is_main and verdict.accepted:
            log.info(
                "accepted changes (checkpoint.accept_changes): %s", ", ".join(map(str, verdict.accepted))
            )
        if env.is_main and verdict.allowed:
            shown = ", ".join(
                f"world size {show(c.old)} -> {show(c.new)}" if c.key == "world_size" else str(c)
                for c in verdict.allowed
            )
            log.info("changed since the checkpoint (may change between hops): %s", shown)

    def _ways_forward(self) -> tuple[str, str]:
        """Whose configuration differs, and how to start a run of one's own instead."""
        cfg, run_dir = self.where.cfg, self.where.run_dir
        mode = cfg.checkpoint.resume
        if cfg.checkpoint.resume_form.kind == "given":
            return f"checkpoint {mode}", "start from its weights alone with checkpoint.restart=false"
        name, n = cfg.run.name, 2
        while (run_dir.parent / f"{name}-{n}").exists():
            n += 1
        return str(run_dir), f"start a new run with run.name={name}-{n}"


def _mismatch(module: nn.Module, weights: dict[str, Any]) -> str:
    """What keeps `weights` from loading into `module` (shapes, missing and unexpected keys), or ""."""
    own = module.state_dict()
    differ = [
        f"{key}: checkpoint {list(value.shape)}, model {list(own[key].shape)}"
        for key, value in weights.items()
        if key in own and isinstance(value, torch.Tensor) and value.shape != own[key].shape
    ]
    missing = [key for key in own if key not in weights]
    unexpected = [key for key in weights if key not in own]
    parts = []
    for template, items in (
        ("shapes differ for {n} ({shown})", differ),
        ("{n} of the model missing from the checkpoint ({shown})", missing),
        ("{n} in the checkpoint not in the model ({shown})", unexpected),
    ):
        if items:
            more = f", and {len(items) - _SHOWN} more" if len(items) > _SHOWN else ""
            count = f"{len(items)} parameter{'s' if len(items) > 1 else ''}"
            parts.append(template.format(n=count, shown="; ".join(items[:_SHOWN]) + more))
    return "; ".join(parts)


def _checkpointed_update(run_dir: Path) -> int:
    """The highest update chain.json says a checkpoint was committed at (0: none)."""
    return max((int(h.get("last_update") or 0) for h in read_chain(run_dir / "chain.json").hops), default=0)


def _located(given: str, path: str | Path, which: str = "latest") -> Located:
    """The checkpoint checkpoint.resume=<given> names (train/checkpoint.py's locate: `which` of the folder
    `path`, or the file or folder `path` names), its refusals said as checkpoint.resume's."""
    try:
        return locate(path, which, exports=False)
    except NotLocated as exc:
        setting = f"checkpoint.resume={given}"
        if which != "latest" and exc.reason == "missing":
            line = (
                f"{setting}: no {exc.name} in {exc.folder} (it holds: {exc.held}); give one of those, latest or auto"
                if exc.held
                else f"{setting}: no {exc.name} in {exc.folder}, which holds no checkpoint (auto starts afresh)"
            )
        elif which != "latest":
            line = f"{setting}: cannot be used: {exc.why}"
        elif exc.reason == "missing":
            line = f"{setting}: {GIVEN_MISSING}"
        elif exc.reason == "empty":
            line = f"{setting}: no checkpoint in this folder"
        else:
            line = (
                f"{setting}: cannot be used: {exc.why}; give a checkpoint file (step_N.pt, best.pt), a run "
                "folder or its checkpoints folder"
            )
        raise UserError(line) from None
