"""Another length on resume (train.total_updates, train.epochs): what it does to the LR, and whether it is taken.

The LR is a pure function of the update count and the run's length (optim.LRSchedule), so a new length can rewrite
the schedule under the updates already trained: a cosine decay over 800 updates, finished, then asked for 5000,
restarts its decay from the end LR back near the start LR. The rule:
- the new schedule gives every update already trained the LR it was trained with (a constant LR, stages of fixed
  length, a warmup not yet over, the stable phase of a warmup-stable-decay schedule): the run is exactly the one
  the new length would have made from the start. It goes on, with a note saying so and the LR it goes on with;
- otherwise the updates so far followed another schedule than the one the run would now claim: refused (one line,
  the LR before and after) unless `checkpoint.accept_changes` names the key. A finished run that would train
  nothing more (a total not above its own) needs nothing.
Nothing here touches the run folder: the refusal comes before anything is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpctrain.config.schema import ScheduleConfig
from hpctrain.train.optim import LRSchedule


@dataclass
class LengthChange:
    """A run at update `step` (finished or not) whose length goes from `old_total` to `new_total` updates."""

    step: int
    old_total: int
    new_total: int
    finished: bool
    old: LRSchedule  # the schedule over the old length (the checkpoint's stages)
    new: LRSchedule  # the schedule this hop trains with
    base_lrs: dict[str, float]  # each optimizer's LR before the schedule's factor
    # the first update already trained that the new schedule gives another LR (None: none)
    first_moved: int | None

    @property
    def trains_nothing(self) -> bool:
        """A finished run asked for no more than its own length stays finished: nothing is trained."""
        return self.finished and self.new_total <= self.old_total

    @property
    def needs_consent(self) -> bool:
        return self.first_moved is not None and not self.trains_nothing

    def effect(self) -> str:
        """What the new length does to the LR, for a refusal: `the cosine decay restarts at update 800 from lr
        3.0e-05 to 2.8e-03 (the cosine stage spans updates 0-5000 instead of 0-800)`."""
        before, after = self.old.factor(self.step), self.new.factor(self.step)
        index = self._stage(self.new)
        stage = self.new.stages[index] if self.new.stages else None
        kind = stage.type if stage is not None else "constant"
        if after == before:
            what = (
                f"the LR at update {self.step} stays lr {self._lrs(before)}, but updates {self.first_moved} to "
                f"{self.step} were trained with other LRs than the new length gives"
            )
        elif (
            after > before and stage is not None and _decays(stage) and self.step >= self.old.bounds[index][1]
        ):
            # the old schedule had ended this decay: the new one takes it up again from near its start
            what = f"the {kind} decay restarts at update {self.step} from lr {self._lrs(before)} to {self._lrs(after)}"
        else:
            move = "rises" if after > before else "drops"
            what = f"the LR at update {self.step} {move} from lr {self._lrs(before)} to {self._lrs(after)}"
        return what + self._span(index)

    def note(self) -> str:
        """The line said when the change goes through: why nothing trained so far changes and the LR from here,
        or, accepted, what it does to the LR ("" for a finished run that stays finished)."""
        if self.trains_nothing:
            return ""
        if self.finished and self.new_total > self.old_total:
            head = f"extending the finished run from {self.old_total} to {self.new_total} updates"
        else:
            head = f"the run's length changes from {self.old_total} to {self.new_total} updates"
        if self.needs_consent:
            return f"{head} (checkpoint.accept_changes): {self.effect()}"
        before, after = self.old.factor(self.step), self.new.factor(self.step)
        was = "" if after == before else f" (the old length gave lr {self._lrs(before)})"
        return (
            f"{head}: {self._why_same()}, so the updates so far are those the new length makes; update "
            f"{self.step + 1} trains at lr {self._lrs(after)}{was}"
        )

    def refusal(self, where: str, keys: list[str], old: str, new: str) -> str:
        """One line: the run, the change (of keys[0]: `old` -> `new`), what it does to the LR, and the two ways
        forward."""
        reached = (
            f"finished at update {self.step}"
            if self.finished
            else f"reached update {self.step} of {self.old_total}"
        )
        verb = "extend" if self.new_total > self.old_total else "shorten"
        return (
            f"{where} {reached}: {keys[0]} {old} -> {new} would rewrite its LR schedule: {self.effect()}; pass "
            f"checkpoint.accept_changes=[{','.join(keys)}] to {verb} it anyway, or keep {keys[0]} at {old}"
        )

    def _why_same(self) -> str:
        if not self.new.stages:
            return "the LR is constant"
        if self.new.bounds == self.old.bounds:
            return "no LR stage depends on the length"
        return f"the LR stages that depend on the length start after update {self.step}"

    def _stage(self, schedule: LRSchedule) -> int:
        """The stage the update after `step` falls in (the last one past the end)."""
        for index, (_, end) in enumerate(schedule.bounds):
            if self.step < end:
                return index
        return max(len(schedule.bounds) - 1, 0)

    def _span(self, index: int) -> str:
        if not self.new.stages or self.new.bounds[index] == self.old.bounds[index]:
            return ""
        (start, end), (old_start, old_end) = self.new.bounds[index], self.old.bounds[index]
        kind = self.new.stages[index].type
        return f" (the {kind} stage spans updates {start}-{end} instead of {old_start}-{old_end})"

    def _lrs(self, factor: float) -> str:
        """The LR of each optimizer at this factor: `2.8e-03`, or `generator 2.8e-03, critic 1.0e-03`."""
        if len(self.base_lrs) == 1:
            return f"{next(iter(self.base_lrs.values())) * factor:.1e}"
        return ", ".join(f"{name} {lr * factor:.1e}" for name, lr in self.base_lrs.items())


def length_change(
    counters: dict[str, Any], cfg: ScheduleConfig, schedule: LRSchedule, base_lrs: dict[str, float]
) -> LengthChange | None:
    """The change of length since the checkpoint (its counters), or None when the length stays or the checkpoint
    does not say its own. `schedule` is this hop's, over its length; the old one has the same stages over the old
    length: what the length alone does (a change of the stages themselves is an identity change, judged apart)."""
    old_total, new_total = counters.get("total_updates"), schedule.total_updates
    if not isinstance(old_total, int) or old_total == new_total:
        return None
    step = int(counters["step"])
    old = LRSchedule(cfg, old_total, schedule.updates_per_epoch)
    return LengthChange(
        step=step,
        old_total=old_total,
        new_total=new_total,
        finished=bool(counters.get("finished")),
        old=old,
        new=schedule,
        base_lrs=base_lrs,
        first_moved=first_moved(old, schedule, step),
    )


def first_moved(old: LRSchedule, new: LRSchedule, step: int) -> int | None:
    """The first of the updates 0 .. step-1 that `new` gives another LR factor than `old` (None: none), for two
    schedules of the same stages. The stages before the first one whose bounds differ give the same factors: only
    the updates from that stage's start are compared (none for a constant LR or stages of fixed length), piece by
    piece between the stage bounds of either; a piece that is flat in both (a constant stage, past the last stage)
    is compared once, so that the stable phase of a long run costs nothing."""
    moved = [min(a[0], b[0]) for a, b in zip(old.bounds, new.bounds) if a != b]
    if not moved:
        return None
    bounds = {edge for pair in [*old.bounds, *new.bounds] for edge in pair}
    cuts = sorted({min(moved), step, *(edge for edge in bounds if min(moved) < edge < step)})
    for low, high in zip(cuts, cuts[1:]):
        flat_old, flat_new = _flat(old, low), _flat(new, low)
        if flat_old is not None and flat_new is not None:
            if flat_old != flat_new:
                return low
            continue
        found = next((u for u in range(low, high) if old.factor(u) != new.factor(u)), None)
        if found is not None:
            return found
    return None


def _flat(schedule: LRSchedule, update: int) -> float | None:
    """The factor when `update` lies in a constant stage or past the last stage (the same up to the next bound),
    else None."""
    for stage, (_, end) in zip(schedule.stages, schedule.bounds):
        if update < end:
            return stage.start_factor if stage.type == "constant" else None
    return schedule.factor(update)


def _decays(stage: Any) -> bool:
    if stage.type == "exponential":
        return bool(stage.gamma is not None and stage.gamma < 1)
    return bool(stage.type in ("linear", "cosine") and stage.start_factor > stage.end_factor)
