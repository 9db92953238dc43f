"""Loss spikes (train.on_spike): a loss far above the recent ones is said, its step skipped, or undone.

The rule (`SpikeRule`, train.spike): a loss is a spike when it lies above the median of the last `window` losses
by more than `threshold` times their MAD (scaled by 1.4826 to a standard deviation, and at least 1% of the
median, so that a flat loss does not make every wiggle a spike). It judges once the window is full; spikes stay
out of the window. NaN/inf is the non-finite guard's (nonfinite.py), never a spike.

- warn: the update losses are judged where the trainer reads them anyway (each log line, each save): nothing per
  update. Every rank warns about its own; `max_in_row` spikes in a row are the loss's new level (the window
  starts again from them).
- skip_batch: each optimizer step's loss (what went into backward since the step before) is judged before the
  step (Context.optimizer_step); a spike on any rank skips it on every rank: one host sync per step, and under
  DDP one small collective. `max_in_row` skips in a row: the window starts again and the step is taken.
- rewind: judged as warn; the first spike any rank found is agreed at the next check step or before the next
  save (which never happens with it), and every rank goes back to the last checkpoint with the LR multiplied by
  `lr_factor` for the rest of the run. The rewind is a resume: the state a new hop would load from that
  checkpoint (the rule's window too), with the LR scaled, and kept in every checkpoint after it, so a run that
  rewound continues bit-exactly across later stops. A spike that comes back after `max_rewinds` rewinds to the
  same checkpoint stops the run (exit 1). A stop between the last save and the spike moves the checkpoint a
  rewind goes back to (the stop saves): such a run and an uninterrupted one rewind to different updates.
"""

from __future__ import annotations

import collections
import logging
import math
import statistics
from collections.abc import Callable
from typing import Any

import torch

from hpctrain.config.schema import SpikeConfig, TrainConfig
from hpctrain.runtime import dist
from hpctrain.train.checkpoint import CheckpointStore
from hpctrain.train.nonfinite import NonFinite
from hpctrain.train.parts import Parts
from hpctrain.train.resume import Where, restore_latest

log = logging.getLogger(__name__)


class Rewind(Exception):
    """Every rank agreed to go back from the spike at `update` (raised out of the loop; fit rewinds)."""

    def __init__(self, update: int) -> None:
        super().__init__(f"loss spike at update {update}")
        self.update = update


class SpikeRule:
    """The running window of recent losses and the spike rule over it (module docstring)."""

    def __init__(self, cfg: SpikeConfig) -> None:
        self.cfg = cfg
        self.values: collections.deque[float] = collections.deque(maxlen=cfg.window)

    def judge(self, value: float) -> str | None:
        """Why `value` is a spike, or None (not judged: the window is not full, or it is non-finite)."""
        if len(self.values) < self.cfg.window or not math.isfinite(value):
            return None
        median = statistics.median(self.values)
        mad = statistics.median(abs(v - median) for v in self.values)
        scale = max(1.4826 * mad, 0.01 * abs(median), 1e-12)
        if value <= median + self.cfg.threshold * scale:
            return None
        return (
            f"loss {value:.4g} is {(value - median) / scale:.1f} MADs above the median {median:.4g} of the last "
            f"{len(self.values)} (train.spike.threshold={self.cfg.threshold:g})"
        )

    def keep(self, value: float) -> None:
        if math.isfinite(value):
            self.values.append(value)


class SpikeGuard:
    """train.on_spike for the trainer (warn, rewind) and its UpdateContext (skip_batch). A part of the checkpoint."""

    def __init__(self, cfg: TrainConfig, last_saved: Callable[[], int | None]) -> None:
        """`last_saved`: the update of the run's last checkpoint (None: nothing to rewind to yet)."""
        self.mode, self.cfg, self.last_saved = cfg.on_spike, cfg.spike, last_saved
        self.rule = SpikeRule(cfg.spike)  # the update losses (warn, rewind)
        self.steps: dict[str, SpikeRule] = {}  # each optimizer's step losses (skip_batch)
        self.next = 1  # the first update whose loss the rule has not seen
        self.in_row = 0  # spikes in a row (warn: this rank's; skip_batch: agreed skips)
        self.skipped = 0  # skip_batch: optimizer steps skipped
        self.lr_scale = 1.0  # rewind: the product of lr_factor over the rewinds so far
        self.rewinds = 0
        self.target: int | None = None  # the checkpoint the last rewind went back to
        self.again = 0  # rewinds in a row to that checkpoint
        self.found: int | None = None  # rewind: the first spike this rank found, not yet agreed
        self._pending: torch.Tensor | None = None  # skip_batch: the loss of the step under way

    # ---- warn, rewind: the update losses where the trainer reads them -----------------------------------------

    def observe(self, losses: torch.Tensor | list[float], first: int) -> None:
        """The losses of updates first, first+1, ... (each judged once, whatever the reads overlap)."""
        if self.mode not in ("warn", "rewind") or self.found is not None:
            return
        values = losses.float().tolist() if isinstance(losses, torch.Tensor) else losses
        for update, value in enumerate(values, start=first):
            if update < self.next:
                continue
            self.next = update + 1
            said = self.rule.judge(value)
            if said is None:
                self.rule.keep(value)
                self.in_row = 0
            elif self.mode == "rewind" and self.last_saved() is not None:
                self.found = update
                log.warning("update %d: %s: going back to the last checkpoint", update, said)
                return
            else:
                self._warn(update, said, value)

    def _warn(self, update: int, said: str, value: float) -> None:
        self.in_row += 1
        if self.in_row < self.cfg.max_in_row:
            why = " (no checkpoint to rewind to yet)" if self.mode == "rewind" else ""
            log.warning("update %d: %s%s", update, said, why)
            return
        log.warning(
            "update %d: %s, the %d-th spike in a row: taken for the loss's new level, the window starts again",
            update,
            said,
            self.in_row,
        )
        self.rule.values.clear()
        self.rule.keep(value)
        self.in_row = 0

    def raise_if(self, update: int | None) -> None:
        """Rewind on every rank from the first spike any rank found (agreed by cadence.GuardVotes; None: none)."""
        if update is not None:
            raise Rewind(update)

    def rewind(self, spike: Rewind, parts: Parts, store: CheckpointStore, where: Where) -> int:
        """Back to the last checkpoint (every rank), the LR scaled: returns its update. What the rule had seen
        comes back with it; the rewinds and the LR scale carry on. NonFinite once the spike came back after
        train.spike.max_rewinds rewinds to one checkpoint."""
        live = (self.lr_scale, self.rewinds, self.target, self.again)
        target = restore_latest(parts, store, where)
        assert target is not None  # a spike is taken for a rewind only once a checkpoint exists
        self.lr_scale, self.rewinds = live[0] * self.cfg.lr_factor, live[1] + 1
        self.again = live[3] + 1 if live[2] == target else 1
        self.target, self.found = target, None
        if self.again > self.cfg.max_rewinds:
            raise NonFinite(
                spike.update,
                f"the loss spiked again at update {{update}} after {self.again - 1} rewinds to update {target} "
                f"(train.spike.max_rewinds={self.cfg.max_rewinds}, the LR now x{self.lr_scale:.3g})",
            )
        log.warning(
            "loss spike at update %d: went back to the checkpoint of update %d; the LR is x%.3g from now on "
            "(rewind %d of the run)",
            spike.update,
            target,
            self.lr_scale,
            self.rewinds,
        )
        return target

    # ---- skip_batch: each optimizer step, from the UpdateContext --------------------------------------------

    def add(self, loss: torch.Tensor) -> None:
        """A loss going into backward (weighted by its micro-batch's share): part of the next step's loss."""
        value = loss.detach().float()
        self._pending = value if self._pending is None else self._pending + value

    def forget(self) -> None:
        """The step under way was abandoned (out of memory, done again): its loss so far is no step's."""
        self._pending = None

    def skip(self, name: str) -> bool:
        """Whether optimizer `name`'s step is skipped: its loss is a spike on some rank (agreed)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return False
        value = float(pending)  # the host sync skip_batch costs
        rule = self.steps.setdefault(name, SpikeRule(self.cfg))
        said = rule.judge(value)
        if not dist.any_rank(bool(said)):
            rule.keep(value)
            self.in_row = 0
            return False
        self.in_row += 1
        if self.in_row >= self.cfg.max_in_row:  # agreed by every rank alike: all restart their windows
            log.warning(
                "optimizer %s: %d spikes in a row: taken for the loss's new level, the window starts again",
                name,
                self.in_row,
            )
            for each in self.steps.values():
                each.values.clear()
            rule.keep(value)
            self.in_row = 0
            return False
        self.skipped += 1
        log.warning("optimizer %s: %s: step skipped", name, said or "another rank's loss spiked")
        return True

    # ---- state ----------------------------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """For summary.json (nothing when off)."""
        if self.mode == "off":
            return {}
        return {"spikes": {"skipped": self.skipped, "rewinds": self.rewinds, "lr_scale": self.lr_scale}}

    def state_dict(self) -> dict[str, Any]:
        return {
            "window": list(self.rule.values),
            "steps": {name: list(rule.values) for name, rule in self.steps.items()},
            "next": self.next,
            "in_row": self.in_row,
            "skipped": self.skipped,
            "lr_scale": self.lr_scale,
            "rewinds": self.rewinds,
            "target": self.target,
            "again": self.again,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """What a checkpoint holds (nothing: a run from before on_spike, judged afresh, the LR unscaled)."""
        self.rule.values.clear()
        self.rule.values.extend(state.get("window", []))
        self.steps = {}
        for name, values in state.get("steps", {}).items():
            self.steps[name] = SpikeRule(self.cfg)
            self.steps[name].values.extend(values)
        self.next = int(state.get("next", 1))
        self.in_row, self.skipped = int(state.get("in_row", 0)), int(state.get("skipped", 0))
        self.lr_scale, self.rewinds = float(state.get("lr_scale", 1.0)), int(state.get("rewinds", 0))
        self.target, self.again = state.get("target"), int(state.get("again", 0))
        self.found, self._pending = None, None
