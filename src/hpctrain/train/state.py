"""What a checkpoint holds, and putting it back: the trainer's state in and out of the commit protocol.

Size (~480 lines, over the house's ~400): saving, the resume decision (auto, never, latest, best/step_N, a given
file, a remote one) and the identity check on resume are one protocol that rank 0 decides and every rank follows;
split, the invariants between them (which file every rank loads, what is recorded) would live in two places."""

from __future__ import annotations

import hashlib
import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as torch_dist
from torch import nn

from hpctrain.config.identity import GROWS, judge, refusal, show
from hpctrain.config.loading import config_hash, dump_config
from hpctrain.config.schema import ConfigBase
from hpctrain.errors import RunError, UserError
from hpctrain.runtime import dist
from hpctrain.runtime.seeding import rng_state, set_rng_state
from hpctrain.track.chain import read_chain
from hpctrain.train.checkpoint import (
    FORMAT_VERSION,
    FULL_STATE_KEYS,
    CheckpointStore,
    Unreadable,
    follow_pointer,
    is_full_state,
    read_checkpoint,
    strip_prefixes,
)
from hpctrain.train.length import length_change
from hpctrain.train.remote_ckpt import RemoteCheckpoints, local_resume_path, pull_working_copy
from hpctrain.train.resume_forms import note_rewind, resume_form, rewind_target
from hpctrain.train.runlock import previous_run_files, set_aside_previous_run
from hpctrain.train.train_state import TrainState

if TYPE_CHECKING:
    from hpctrain.remote.mirror import FolderMirror
    from hpctrain.runtime.budget import TimeBudget
    from hpctrain.runtime.env import ClusterEnv
    from hpctrain.track.base import Trackers
    from hpctrain.train.context import Context
    from hpctrain.train.optim import LRSchedule
    from hpctrain.train.task import BatchStream, Task

log = logging.getLogger(__name__)

_FRESH_HINT = "to start afresh use another run.name, or checkpoint.resume=never (the old run is moved aside)"
_OTHER_HINT = "give a checkpoint of this model in checkpoint.resume"
_SHOWN = 3  # mismatching parameters named in an error line


def params_sha256(modules: dict[str, nn.Module]) -> str:
    """SHA-256 over every network's state dict, networks by name, tensors in key order."""
    digest = hashlib.sha256()
    for name in sorted(modules):
        for key, tensor in modules[name].state_dict().items():
            digest.update(f"{name}.{key}".encode())
            data = tensor.detach().cpu().contiguous().reshape(-1)
            digest.update(data.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _gather_rng() -> list[dict[str, Any]]:
    """Every rank's RNG state (each rank draws its own dropout/sampling stream)."""
    mine = rng_state()
    if not dist.active():
        return [mine]
    gathered: list[Any] = [None] * torch_dist.get_world_size()
    torch_dist.all_gather_object(gathered, mine)
    return gathered


class Owner(Protocol):
    """What the keeper reads from the trainer whose state it saves and puts back. It writes only into `state`
    (the counters) and into the parts themselves (networks, optimizers, stream, task, budget)."""

    @property
    def cfg(self) -> ConfigBase: ...
    @property
    def env(self) -> ClusterEnv: ...
    @property
    def run_dir(self) -> Path: ...
    @property
    def store(self) -> CheckpointStore: ...
    @property
    def state(self) -> TrainState: ...
    @property
    def raw_modules(self) -> dict[str, nn.Module]: ...
    @property
    def optimizers(self) -> dict[str, torch.optim.Optimizer]: ...
    @property
    def ctx(self) -> Context: ...
    @property
    def train_stream(self) -> BatchStream: ...
    @property
    def task(self) -> Task[ConfigBase]: ...
    @property
    def budget(self) -> TimeBudget: ...
    @property
    def schedule(self) -> LRSchedule: ...
    @property
    def base_lrs(self) -> dict[str, float]: ...
    @property
    def trackers(self) -> Trackers: ...


class StateKeeper:
    def __init__(self, owner: Owner) -> None:
        self.t = owner
        self.last_saved_step: int | None = None
        self._mirror: threading.Thread | None = None
        # What changed since the checkpoint this hop resumed from ({"accepted": {key: [old, new]}, "allowed": ...}),
        # and every hop's changes so far (kept in the checkpoint).
        self.changes: dict[str, dict[str, list[Any]]] = {"accepted": {}, "allowed": {}}
        self.history: list[dict[str, Any]] = []
        self._mirror_copier: FolderMirror | None = None  # one per run: it remembers what a remote has
        self.remote = RemoteCheckpoints(owner.cfg)  # pelican:// checkpoint.dir / mirror_to uploads
        # What a new length does to the LR (train/length.py), said after the resume line.
        self.length_note = ""

    def state(self) -> dict[str, Any]:
        t = self.t
        return {
            "format": FORMAT_VERSION,
            "modules": {name: m.state_dict() for name, m in t.raw_modules.items()},
            "optimizers": {name: o.state_dict() for name, o in t.optimizers.items()},
            "optimizer_types": {name: type(o).__name__ for name, o in t.optimizers.items()},
            "scaler": t.ctx.scaler.state_dict() if t.ctx.scaler is not None else None,
            "counters": t.state.state_dict(),
            "rng": _gather_rng(),  # one entry per rank: its length is the world size that wrote it
            "data": t.train_stream.state_dict(),
            "task": t.task.state_dict(),
            "budget": t.budget.state_dict(),
            "trackers": t.trackers.state_dict(),
            "config": dump_config(t.cfg),
            "config_hash": config_hash(t.cfg),
            "config_changes": self.history,
        }

    def hop_identity(self) -> dict[str, Any]:
        """What chain.json and the hop's first metrics record say about this hop's configuration."""
        return {
            "config_hash": config_hash(self.t.cfg),
            "accepted_changes": self.changes["accepted"],
            "allowed_changes": self.changes["allowed"],
        }

    def save(self, best: bool = False) -> None:
        state = self.state()  # a collective inside: every rank builds it
        if self.t.env.is_main:
            # The previous mirror copy reads files this save replaces and prunes: let it finish first.
            self.close()
            # Before the commit: what was logged up to this update is on disk once `latest` names it (a run
            # resumed from it logs only the updates after it).
            self.t.trackers.flush()
            try:
                path = self.t.store.save(state, self.t.state.step, best=best)
            except (
                OSError
            ) as exc:  # a full disk, a quota, a read-only folder: nothing of the last commit is lost
                kept = f"update {self.last_saved_step}" if self.last_saved_step is not None else "nothing yet"
                raise RunError(
                    f"cannot write the checkpoint of update {self.t.state.step} into {self.t.store.folder}: "
                    f"{exc.strerror or exc}; the last complete checkpoint ({kept}) is kept: free space (or fix "
                    "the folder's permissions, or set run.out_dir elsewhere) and run the same command again"
                ) from None
            # pelican:// checkpoint.dir / mirror_to: in the background, the newest wins (else nothing)
            self.remote.submit(path.parent)
            if self.t.cfg.checkpoint.mirror_to and not self.remote.takes(self.t.cfg.checkpoint.mirror_to):
                self._mirror_in_background(path.parent, self.t.cfg.checkpoint.mirror_to)
        self.last_saved_step = self.t.state.step
        dist.barrier()

    def _mirror_in_background(self, folder: Path, dest: str) -> None:
        """Copy in a thread: the training goes on meanwhile (the next save waits for it, see save)."""
        from hpctrain.remote.mirror import FolderMirror

        if self._mirror_copier is None:
            self._mirror_copier = FolderMirror(dest)
        copier = self._mirror_copier

        def copy() -> None:
            try:
                copier.sync(folder, last=("latest",))
            except Exception as exc:  # a failed mirror loses nothing local: warn and go on
                log.warning("mirroring checkpoints to %s failed: %s", dest, exc)

        self._mirror = threading.Thread(target=copy, name="checkpoint-mirror", daemon=False)
        self._mirror.start()

    def close(self) -> None:
        """Wait for a mirror copy under way."""
        if self._mirror is not None:
            self._mirror.join()
            self._mirror = None

    # ---- resume -------------------------------------------------------------------------------------------

    def resume(self) -> str:
        """Rank 0 decides what to load and every rank loads that very file: ranks falling back to different
        checkpoints (a flaky read on one node) would disagree on the step and deadlock later. A mistake found
        on rank 0 is raised on every rank."""
        t = self.t
        t.state.resumed_step = None
        decision: tuple[str, str | None, str] = ("fresh", None, "")
        state: dict[str, Any] | None = None
        if t.env.is_main:
            try:
                decision, state = self._decide()
            except (UserError, RunError) as exc:
                decision = (type(exc).__name__, None, str(exc))
        agreed: tuple[str, str | None, str] = dist.broadcast_object(decision)  # type: ignore[assignment]
        kind, chosen, note = agreed
        if kind == "UserError":
            raise UserError(note)
        if kind == "RunError":
            raise RunError(note)
        if kind == "fresh":
            return "starting a new run" + note
        assert chosen is not None
        path = Path(chosen)
        if state is None:  # the other ranks read the file rank 0 chose
            try:  # a file the user named (restart, finetune) may come without its sidecar, as on rank 0
                state = read_checkpoint(path, named=kind in ("restart", "finetune"))
            except Unreadable as exc:
                raise RuntimeError(
                    f"rank {t.env.rank} cannot read checkpoint {path} that rank 0 chose: {exc}"
                ) from None
        if kind == "resume":
            self._restore_full(state, path, f"checkpoint {path}", _FRESH_HINT)
            return f"resumed from {path} at update {t.state.step}{self._previous_hop()}"
        if kind == "rewind":
            self._restore_full(state, path, f"checkpoint.resume={note}", _FRESH_HINT)
            if t.env.is_main:
                note_rewind(t.run_dir, resume_form(note), path, t.state.step)
            return f"went back to {path} (checkpoint.resume={note}) at update {t.state.step}"
        given = f"checkpoint.resume={note}"
        if kind == "restart":
            self._restore_full(state, path, given, _OTHER_HINT)
            return f"restored everything from {note} at update {t.state.step}"
        self._restore_modules(state, given, _OTHER_HINT)
        return f"fine-tuning from the weights of {note} (fresh optimizer and schedule)"

    def _decide(self) -> tuple[tuple[str, str | None, str], dict[str, Any] | None]:
        """(kind, file, note) and the loaded state, on rank 0. Kinds: resume (this run folder's checkpoint),
        restart / finetune (checkpoint.resume=<path>, only while the folder holds none), fresh."""
        t = self.t
        mode = t.cfg.checkpoint.resume
        if mode == "never":
            if not previous_run_files(t.run_dir):
                return ("fresh", None, ""), None
            if not self._requeued_same_job():
                aside = set_aside_previous_run(t.run_dir)  # the trainer reads chain.json again after this
                t.store.folder.mkdir(mode=0o755, parents=True, exist_ok=True)
                return (
                    "fresh",
                    None,
                    f" (checkpoint.resume=never: the previous run was moved to {aside})",
                ), None
            log.warning(
                "checkpoint.resume=never, but this run folder holds the run of this very job (SLURM job %s, "
                "requeued): continuing it",
                t.env.job_id,
            )
        form = resume_form(mode)
        if form.kind == "rewind":  # best / step_N: this run goes back to one of its own checkpoints, once
            target = rewind_target(form, t.store, t.run_dir)
            if target is not None:
                try:
                    return ("rewind", str(target), mode), read_checkpoint(target)
                except Unreadable as exc:
                    raise UserError(f"checkpoint.resume={mode}: cannot be used: {exc}") from None
        # The run folder's own checkpoints come first, also with resume=<path>: a requeued fine-tuning job
        # continues its own run instead of starting again from the given file.
        pull_working_copy(t)  # a remote checkpoint.dir fills an empty working copy
        loaded = t.store.load_latest()
        if loaded is not None:
            return ("resume", str(loaded[1]), ""), loaded[0]
        reached = _checkpointed_update(t.run_dir)
        if reached:
            raise RunError(
                f"chain.json of {t.run_dir} says this run saved checkpoints up to update {reached}, but "
                f"{t.store.folder} holds none; nothing was changed: if the file system is having trouble, try "
                "again later; to start afresh use checkpoint.resume=never (the old run is moved aside)"
            )
        if form.kind == "latest":
            raise UserError(
                f"checkpoint.resume=latest: {t.store.folder} holds no checkpoint to continue from; use auto to "
                "start afresh when there is none"
            )
        if form.kind != "given":
            return ("fresh", None, ""), None
        path, state = _given_checkpoint(local_resume_path(t, mode))
        return ("restart" if t.cfg.checkpoint.restart else "finetune", str(path), mode), state

    def _previous_hop(self) -> str:
        """`; hop N of this run (the last one: job J, ended <reason>)`, from chain.json (empty if unknown)."""
        hops = read_chain(self.t.run_dir / "chain.json").hops
        if not hops:
            return ""
        last = hops[-1]
        job = f"job {last['job_id']}" if last.get("job_id") else "no job"
        ended = last.get("exit_reason") or "without closing its record (killed)"
        return f"; hop {len(hops) + 1} of this run (the last one: {job}, ended {ended})"

    def _requeued_same_job(self) -> bool:
        """Whether the run in the folder was started by this very SLURM job before it was requeued."""
        env = self.t.env
        if env.restart_count < 1 or not env.job_id:
            return False
        hops = read_chain(self.t.run_dir / "chain.json").hops
        return bool(hops) and hops[-1].get("job_id") == env.scheduler_job

    def _restore_modules(self, state: dict[str, Any], source: str, hint: str) -> None:
        saved = state["modules"]
        for name, module in self.t.raw_modules.items():
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

    def _restore_optimizer(
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

    def _restore_full(self, state: dict[str, Any], path: Path, source: str, hint: str) -> None:
        t = self.t
        if not is_full_state(state):
            missing = [key for key in FULL_STATE_KEYS if key not in state]
            raise UserError(
                f"{source} holds no full training state (no {', '.join(missing)}); to take its weights only "
                "use checkpoint.restart=false"
            )
        self._judge_config(state)
        self._restore_modules(state, source, hint)
        for name, optimizer in t.optimizers.items():
            self._restore_optimizer(name, optimizer, state, path, source)
        if t.ctx.scaler is not None and state.get("scaler"):
            t.ctx.scaler.load_state_dict(state["scaler"])
        t.state.load_state_dict(state["counters"])
        t.train_stream.load_state_dict(state["data"])
        t.task.load_state_dict(state.get("task", {}))
        t.budget.load_state_dict(state.get("budget", {}))
        t.state.tracker_state = state.get("trackers", {})
        rngs = state["rng"]
        self.last_saved_step = t.state.step
        if len(rngs) == t.env.world_size:
            set_rng_state(rngs[t.env.rank])
        elif t.env.is_main:
            log.info(
                "checkpoint written by %d rank(s), this run has %d: the data position stays exact (one global "
                "sample order), the random streams restart from the seed",
                len(rngs),
                t.env.world_size,
            )

    def _judge_config(self, state: dict[str, Any]) -> None:
        """A run folder continues only its own run (config/identity.py): identity keys that differ from the
        checkpoint's are refused unless accepted; what changed is logged, and recorded in the checkpoint and the
        hop record. Every rank judges the same checkpoint and config, so all refuse together."""
        t = self.t
        self.history = list(state.get("config_changes", []))
        old = state.get("config")
        counters = state["counters"]
        if not isinstance(old, dict):
            if t.env.is_main:
                log.info("this checkpoint holds no configuration (an older version): nothing to compare")
            return
        step = int(counters["step"])
        old_world = len(state.get("rng") or [None])  # one random state per rank that wrote it
        length = length_change(counters, t.cfg.schedule, t.schedule, t.base_lrs)
        verdict = judge(
            old,
            t.cfg,
            old_total=counters.get("total_updates"),
            new_total=t.state.total_updates,
            old_world=old_world,
            new_world=t.env.world_size,
            length_effect=length.effect() if length is not None and length.needs_consent else None,
        )
        where, remedy = self._ways_forward()
        if t.state.total_updates < step:
            raise UserError(
                f"train.total_updates={t.state.total_updates} is below update {step}, which {where} has reached: a run "
                f"cannot be shortened; {remedy}"
            )
        if verdict.refused and all(c.mark == GROWS for c in verdict.refused):
            assert length is not None  # a length is refused only for what it does to the LR
            first, keys = verdict.refused[0], [c.key for c in verdict.refused]
            raise UserError(length.refusal(where, keys, show(first.old), show(first.new)))
        if verdict.refused:
            raise UserError(refusal(where, verdict.refused, remedy))
        self.length_note = length.note() if length is not None else ""
        self.changes = verdict.record()
        if verdict.accepted or verdict.allowed:
            self.history.append({"step": step, **self.changes})
        if t.env.is_main and verdict.accepted:
            log.info(
                "accepted changes (checkpoint.accept_changes): %s", ", ".join(map(str, verdict.accepted))
            )
        if t.env.is_main and verdict.allowed:
            shown = ", ".join(
                f"world size {show(c.old)} -> {show(c.new)}" if c.key == "world_size" else str(c)
                for c in verdict.allowed
            )
            log.info("changed since the checkpoint (may change between hops): %s", shown)

    def _ways_forward(self) -> tuple[str, str]:
        """Whose configuration differs, and how to start a run of one's own instead."""
        t = self.t
        mode = t.cfg.checkpoint.resume
        if resume_form(mode).kind == "given":
            return f"checkpoint {mode}", "start from its weights alone with checkpoint.restart=false"
        name, n = t.cfg.run.name, 2
        while (t.run_dir.parent / f"{name}-{n}").exists():
            n += 1
        return str(t.run_dir), f"start a new run with run.name={name}-{n}"


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


def _given_checkpoint(given: str) -> tuple[Path, dict[str, Any]]:
    """The checkpoint `checkpoint.resume=<given>` names: a file, a run folder or a checkpoints folder."""
    path = Path(given).expanduser()
    if not path.exists():
        raise UserError(
            f"checkpoint.resume={given}: no such file or folder (give a checkpoint file or a run folder, or "
            "auto | never | latest | best | step_N)"
        )
    try:
        if path.is_dir():
            folder = path / "checkpoints" if (path / "checkpoints").is_dir() else path
            loaded = CheckpointStore(folder, keep_last=1).load_latest()
            if loaded is None:
                raise UserError(f"checkpoint.resume={given}: no checkpoint in this folder")
            return loaded[1], loaded[0]
        path = follow_pointer(path)  # <run>/checkpoints/latest: the file it names
        return path, read_checkpoint(path, named=True)
    except (Unreadable, RunError) as exc:
        raise UserError(
            f"checkpoint.resume={given}: cannot be used: {exc}; give a checkpoint file (step_N.pt, best.pt), "
            "a run folder or its checkpoints folder"
        ) from None
