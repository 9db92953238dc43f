"""NaN/inf guard: a run whose loss or weights went non-finite stops (exit 1) and never saves them.

`train.on_nonfinite=stop` (default) costs nothing per update: the trainer keeps the losses since its last log line
anyway (device tensors, no sync); they are checked at each log line and before every save, and the weights are
checked before every save. The first non-finite update found is agreed by all ranks in the collective that already
decides stops (`code()` is one element of that vector), so they stop together; a save that finds one is refused on
every rank (one small collective per save). `latest` stays on the last good checkpoint.

`train.on_nonfinite=skip_batch`: the UpdateContext skips each optimizer step whose gradients are non-finite (the
same on all ranks after DDP's all-reduce); this guard counts the skipped updates and stops after
`train.max_nonfinite_skips` of them in a row.
"""

from __future__ import annotations

import logging
import math

import torch
from torch import nn

from hpctrain.config.schema import TrainConfig

log = logging.getLogger(__name__)

_LOSS = "the training loss became non-finite (nan/inf) at update {update}"


class NonFinite(Exception):
    """All ranks agreed that the run went non-finite at `update`; the message says how."""

    def __init__(self, update: int, what: str) -> None:
        super().__init__(what.format(update=update))
        self.update = update


class NonFiniteGuard:
    def __init__(self, train_cfg: TrainConfig) -> None:
        self.skip = train_cfg.on_nonfinite == "skip_batch"
        self.max_skips = int(train_cfg.max_nonfinite_skips)
        self.first_bad: int | None = None  # this rank's first non-finite update, once found
        self.what = _LOSS  # how, once found: a format string of {update}
        self.skipped = 0  # updates with a skipped optimizer step, this hop
        self.streak = 0
        self._seen_steps = 0

    # ---- finding ---------------------------------------------------------------------------------------------

    def check_losses(self, losses: torch.Tensor | list[float], first_step: int) -> None:
        """Look at the losses (stacked, or read to the host already) of updates first_step, first_step+1, ...
        (one host sync for a tensor). Not under skip_batch: there a non-finite loss is handled by its
        gradients."""
        if self.skip or self.first_bad is not None:
            return
        values = losses.float().tolist() if isinstance(losses, torch.Tensor) else losses
        for i, value in enumerate(values):
            if not math.isfinite(value):
                self.first_bad = first_step + i
                return

    def note_update(self, skipped_steps: int, step: int) -> None:
        """skip_batch: called after each update with the context's count of skipped optimizer steps."""
        if skipped_steps == self._seen_steps:
            self.streak = 0
            return
        self._seen_steps = skipped_steps
        self.skipped += 1
        self.streak += 1
        log.warning("update %d: non-finite gradients, optimizer step skipped (%d so far)", step, self.skipped)
        if self.streak >= self.max_skips and self.first_bad is None:
            self.first_bad = step - self.streak + 1
            self.what = (
                f"{self.streak} updates in a row had non-finite gradients and were skipped, from update "
                f"{{update}} on (train.max_nonfinite_skips={self.max_skips})"
            )

    def check_weights(self, modules: dict[str, nn.Module], step: int) -> None:
        """Before a save: every parameter and floating buffer finite (a finite loss can still end in inf
        weights)."""
        if self.first_bad is not None:
            return
        flags = [
            torch.isfinite(t).all()
            for m in modules.values()
            for t in (*m.parameters(), *m.buffers())
            if t.is_floating_point()
        ]
        if flags and not bool(torch.stack(flags).all()):
            self.first_bad = step
            self.what = "the weights were non-finite (nan/inf) at the save of update {update}"

    # ---- agreeing ------------------------------------------------------------------------------------------

    def raise_if(self, update: int | None) -> None:
        """Raise NonFinite on every rank when some rank found one: `update` is the earliest any found (agreed by
        cadence.GuardVotes; None: all finite)."""
        if update is not None:
            # Another rank's finding: this rank knows the update, not how (the loss is the usual way).
            raise NonFinite(update, self.what if self.first_bad == update else _LOSS)
