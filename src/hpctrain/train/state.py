"""What a checkpoint holds, and putting it back: the trainer's state in and out of the commit protocol."""

from __future__ import annotations

import hashlib
import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as torch_dist
from torch import nn

from hpctrain.config.identity import judge, refusal, show
from hpctrain.config.loading import config_hash, dump_config
from hpctrain.errors import UserError
from hpctrain.runtime import dist
from hpctrain.runtime.seeding import rng_state, set_rng_state
from hpctrain.train.checkpoint import FORMAT_VERSION, load_verified, strip_prefixes

if TYPE_CHECKING:
    from hpctrain.train.trainer import Trainer

log = logging.getLogger(__name__)


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


class StateKeeper:
    def __init__(self, trainer: Trainer) -> None:
        self.t = trainer
        self.last_saved_step: int | None = None
        self._mirror: threading.Thread | None = None
        # What changed since the checkpoint this hop resumed from ({"accepted": {key: [old, new]}, "allowed": ...}),
        # and every hop's changes so far (kept in the checkpoint).
        self.changes: dict[str, dict[str, list[Any]]] = {"accepted": {}, "allowed": {}}
        self.history: list[dict[str, Any]] = []

    def state(self) -> dict[str, Any]:
        t = self.t
        return {
            "format": FORMAT_VERSION,
            "modules": {name: m.state_dict() for name, m in t.raw_modules.items()},
            "optimizers": {name: o.state_dict() for name, o in t.optimizers.items()},
            "scaler": t.ctx.scaler.state_dict() if t.ctx.scaler is not None else None,
            "counters": {
                "step": t.step,
                "samples": t.samples,
                "total_updates": t.total_updates,
                "finished": t.finished,
                "best": t.best,
                "evals_without_improvement": t.evals_without_improvement,
                "world_size": t.env.world_size,
            },
            "rng": _gather_rng(),
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
            path = self.t.store.save(state, self.t.step, best=best)
            self.t.trackers.flush()
            if self.t.cfg.checkpoint.mirror_to:
                self._mirror_in_background(path.parent, self.t.cfg.checkpoint.mirror_to)
        self.last_saved_step = self.t.step
        dist.barrier()

    def _mirror_in_background(self, folder: Path, dest: str) -> None:
        """A slow remote copy must not hold the other ranks at a collective past distributed.timeout."""
        from hpctrain.data.remote import mirror as mirror_copy

        self.close()

        def copy() -> None:
            try:
                mirror_copy(str(folder), dest)
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
        t = self.t
        t.resumed_step = None
        mode = t.cfg.checkpoint.resume
        loaded = None
        if mode != "never":
            # Rank 0 chooses and every rank loads that very file: ranks falling back to different checkpoints
            # (a flaky read on one node) would disagree on the step and deadlock later.
            if t.env.is_main:
                loaded = t.store.load_latest()
            chosen = dist.broadcast_object(str(loaded[1]) if loaded else None)
            if chosen and not t.env.is_main:
                state = load_verified(Path(str(chosen)))
                if state is None:
                    raise RuntimeError(f"rank {t.env.rank} cannot read checkpoint {chosen} that rank 0 chose")
                loaded = (state, Path(str(chosen)))
        if loaded is not None:
            state, path = loaded
            self._restore_full(state)
            return f"resumed from {path} at update {t.step}"
        if mode not in ("auto", "never"):
            given = load_verified(Path(mode))
            if given is None:
                raise UserError(f"checkpoint.resume={mode!r}: not a readable hpctrain checkpoint")
            if t.cfg.checkpoint.restart:
                self._restore_full(given)
                return f"restored everything from {mode} at update {t.step}"
            self._restore_modules(given)
            return f"fine-tuning from the weights of {mode} (fresh optimizer and schedule)"
        return "starting a new run"

    def _restore_modules(self, state: dict[str, Any]) -> None:
        for name, module in self.t.raw_modules.items():
            if name not in state["modules"]:
                raise UserError(f"checkpoint has no network {name!r} (it has {sorted(state['modules'])})")
            module.load_state_dict(strip_prefixes(state["modules"][name]))

    def _restore_full(self, state: dict[str, Any]) -> None:
        t = self.t
        self._judge_config(state)
        self._restore_modules(state)
        for name, optimizer in t.optimizers.items():
            optimizer.load_state_dict(state["optimizers"][name])
        if t.ctx.scaler is not None and state.get("scaler"):
            t.ctx.scaler.load_state_dict(state["scaler"])
        counters = state["counters"]
        t.step = int(counters["step"])
        t.resumed_step = t.step
        t.samples = int(counters["samples"])
        t.finished = bool(counters.get("finished"))
        t.finished_total = int(counters.get("total_updates", 0)) if t.finished else 0
        t.best = counters.get("best")
        t.evals_without_improvement = int(counters.get("evals_without_improvement", 0))
        t.train_stream.load_state_dict(state["data"])
        t.task.load_state_dict(state.get("task", {}))
        t.budget.load_state_dict(state.get("budget", {}))
        t.tracker_state = state.get("trackers", {})
        rngs = state["rng"]
        self.last_saved_step = t.step
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
        old_world = int(counters.get("world_size") or len(state.get("rng") or [None]))
        verdict = judge(
            old,
            t.cfg,
            old_total=counters.get("total_updates"),
            new_total=t.total_updates,
            old_world=old_world,
            new_world=t.env.world_size,
        )
        where, remedy = self._ways_forward()
        if t.total_updates < step:
            raise UserError(
                f"train.total_updates={t.total_updates} is below update {step}, which {where} has reached: a run "
                f"cannot be shortened; {remedy}"
            )
        if verdict.refused:
            raise UserError(refusal(where, verdict.refused, remedy))
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
        if mode not in ("auto", "never"):
            return f"checkpoint {mode}", "start from its weights alone with checkpoint.restart=false"
        name, n = t.cfg.run.name, 2
        while (t.run_dir.parent / f"{name}-{n}").exists():
            n += 1
        return str(t.run_dir), f"start a new run with run.name={name}-{n}"
