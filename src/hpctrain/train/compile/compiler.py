"""The one object the trainer talks to about torch.compile: at build it decides which networks compile, where
(this process, the background helper, not at all) and says why; per update it tells whether that update compiled
(compile time, kept out of the step estimate); at a check step it switches to the helper's code; at the hop's end
it gives the summary line and marks what the kept cache holds; at close it ends the helper. The loop knows
nothing else of compiling."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hpctrain.config.schema import ConfigBase
from hpctrain.runtime import dist
from hpctrain.runtime.budget import TimeBudget
from hpctrain.runtime.env import ClusterEnv
from hpctrain.train.compile.ahead import AHEAD_MIN_SECONDS, CompileAhead
from hpctrain.train.compile.cache import compile_key, compiled_before, keep_compiled_code, remember_compiled
from hpctrain.train.compile.policy import (
    AUTO_COMPILE_MIN_SECONDS,
    check_compile_names,
    compile_in_background,
    compile_network,
    is_compiled,
    short_hop,
)
from hpctrain.train.compile.stats import compile_stats, compile_summary, compiled_graphs, watch_compiles
from hpctrain.train.task import MicroBatch, Task


@dataclass
class Plan:
    """What `Compiler.plan` decided for the networks of this hop."""

    modes: dict[str, str]  # network -> its mode in this hop ("off": eager throughout)
    notes: dict[str, list[str]] = field(default_factory=dict)  # network -> why it is not compiled as asked
    cache: list[str] = field(default_factory=list)  # said with the first compiled network
    ignored: str = ""  # train.compile_background asked for with nothing to compile


class Compiler:
    """torch.compile for one process: the training process (`run_dir` given: it may start the helper) or the
    background helper itself (commands/compile_ahead.py, compiling with the same calls)."""

    def __init__(
        self,
        cfg: ConfigBase,
        task: Task[ConfigBase],
        env: ClusterEnv,
        device: torch.device,
        run_dir: Path | None = None,
    ) -> None:
        self.cfg, self.task, self.env, self.device, self.run_dir = cfg, task, env, device, run_dir
        self.key = ""  # what the compiled code depends on (cache.compile_key), when any network compiles
        self.background = False  # the networks compile in the helper (decided by `plan`)
        self.eager_until_switch: dict[str, str] = {}  # networks left eager for the helper: name -> mode
        self.ahead: CompileAhead | None = None  # the helper of this hop (train.compile_background)
        self.compiling = False  # some network is compiled (or will be): updates that compile are booked apart
        self._graphs = 0  # torch.compile's graph count after the last update (a change: that update compiled)
        self._updates = 0  # updates of this hop that compiled
        self._before: dict[str, int] = {}  # torch.compile's counts when the hop began
        self._hop_first = 0  # the update count when this hop's loop began

    # ---- build ----------------------------------------------------------------------------------------------

    def plan(self, raw: dict[str, nn.Module], seconds_left: float | None) -> Plan:
        """Each network's mode in this hop, and where it compiles. Under 10 minutes left (`seconds_left`, the
        same on every rank), networks not in the kept cache are not compiled in this process, where nothing
        could stop the compile at the deadline: `auto` leaves them eager, an explicit mode compiles them in the
        background (one process), not at all (DDP), or here only when train.compile_background=false says so."""
        train = self.cfg.train
        check_compile_names(train.compile, list(raw), self.cfg.model.type)
        self.background = compile_in_background(
            train.compile_background, self.device.type == "cuda", self.env.world_size
        )
        asked = {name: self.task.compile_mode(name) for name in raw}
        plan = Plan(dict(asked), {name: [] for name in raw})
        compiled = [name for name, mode in asked.items() if mode != "off"]
        if not compiled:
            if train.compile_background:  # asked for and ignored: said, never silently dropped
                plan.ignored = "train.compile_background=true: nothing is compiled (train.compile is off here), no helper"
            self.background = False
            return plan
        warm = self._warm({name: asked[name] for name in compiled}, raw, plan)
        if warm and self.background:
            plan.cache.append("compiled in this process: the kept cache holds these networks' code")
            self.background = False
        # a cold compile blocks the training process for a minute or more, and nothing can stop it at the
        # deadline: in a short hop it goes to the background helper, which is ended with the hop
        cold_short = not warm and short_hop(seconds_left)
        left = f"{seconds_left or 0.0:.0f} s"
        if (
            cold_short
            and not self.background
            and train.compile_background is None
            and self.env.world_size == 1
        ):
            self.background = True
            plan.cache.append(
                f"compiled in the background: {left} left in this hop and nothing of these networks in the kept "
                "cache (a cold compile here could outlast the deadline)"
            )
        for name in compiled:
            auto = self.task.compile_setting(name) == "auto"
            if self.background or warm or not short_hop(seconds_left):
                continue
            if auto:
                plan.notes[name].append(
                    f"{name}: not compiled (train.compile=auto and {left} left in this hop: compiling pays from "
                    f"about {AUTO_COMPILE_MIN_SECONDS / 60:.0f} minutes on)"
                )
                plan.modes[name] = "off"
            elif self.env.world_size > 1:  # every rank would block on its own cold compile
                plan.notes[name].append(
                    f"{name}: not compiled in this hop (train.compile={asked[name]}, {left} left and not in the "
                    f"kept cache: a cold compile in every rank could outlast the deadline; a hop with "
                    f"{AUTO_COMPILE_MIN_SECONDS / 60:.0f} minutes or more compiles it)"
                )
                plan.modes[name] = "off"
            else:  # train.compile_background=false said so
                plan.notes[name].append(
                    f"{name}: compiled in this process although only {left} are left in this hop "
                    "(train.compile_background=false): a cold compile can outlast the deadline"
                )
        return plan

    def _warm(self, modes: dict[str, str], raw: dict[str, nn.Module], plan: Plan) -> bool:
        """Whether a hop compiled these networks into the kept cache before (loading their code takes seconds,
        here, without a helper): rank 0's view on every rank (a node-local cache may differ), so that all
        compile alike. Points torch.compile at the kept cache first."""
        train = self.cfg.train
        plan.cache.append(keep_compiled_code(Path(self.cfg.run.out_dir)))  # said with the first network
        # what the code also depends on beyond the networks' repr: their hyperparameters, the data settings (the
        # batch's shapes, static for most workloads), the card (Triton's binaries) or on a CPU the thread count
        # (Inductor's CPU code is keyed on it; train.threads auto follows the load). More than needed only costs
        # a helper (a hop that is not warm compiles in the background); less costs a cold compile
        card = (
            torch.cuda.get_device_name(self.device)
            if self.device.type == "cuda"
            else f"threads {torch.get_num_threads()}"
        )
        setting = (
            f"{train.precision} {train.memory_budget} {self.task.dynamic_shapes} {self.device.type} {card} "
            f"data {self.cfg.data.model_dump_json()} model {self.cfg.model.model_dump_json()}"
        )
        self.key = compile_key(raw, modes, setting)
        return bool(dist.broadcast_object(compiled_before(self.key)))

    def apply(self, name: str, module: nn.Module, mode: str) -> tuple[nn.Module, str]:
        """`module` (DDP-wrapped when distributed) compiled now, or left eager for the helper; and what to say."""
        budget = self.cfg.train.memory_budget
        said = f"{name}: torch.compile mode {mode}" + (
            "" if budget is None else f", activation memory budget {budget:g}"
        )
        if self.background:
            self.eager_until_switch[name] = mode
            return module, said + ", compiled in the background (eager until then)"
        return self.compiled(module, mode), said

    def compiled(self, module: nn.Module, mode: str) -> nn.Module:
        """`module` under torch.compile as this run compiles it (the activation-memory budget, dynamic sizes for
        ragged workloads): the same call in the training process and in the background helper, so the helper's
        cached code is what the training process looks up."""
        return compile_network(module, mode, self.cfg.train.memory_budget, self.task.dynamic_shapes or None)

    def begin(self, modules: dict[str, nn.Module]) -> None:
        """After the networks are wrapped: the helper made ready (started at the first update), and the counts
        this hop's summary is taken against."""
        if self.eager_until_switch and self.run_dir is not None:
            self.ahead = CompileAhead(self.eager_until_switch, self.run_dir / "compile-ahead.log")
        self.compiling = self.ahead is not None or any(is_compiled(m) for m in modules.values())
        if self.compiling:
            watch_compiles()
            self._before = compile_stats()

    # ---- the hop --------------------------------------------------------------------------------------------

    def hop_began(self, step: int) -> None:
        self._hop_first = step
        self._graphs = compiled_graphs() if self.compiling else 0

    def start_helper(self, micro: list[MicroBatch], raw: dict[str, nn.Module], budget: TimeBudget) -> None:
        """The hop's first update: hand the helper what it needs to compile as this process will (weights, the
        task's states to rehearse, this update's batch), then train on eagerly. Not with so little time left that
        the helper could not finish by the deadline (less half the margin: its grace after a stop)."""
        ahead = self.ahead
        assert ahead is not None
        left = budget.remaining()
        if left is not None and left - max(self.cfg.budget.margin_seconds / 2, 2.0) < AHEAD_MIN_SECONDS:
            ahead.skip(f"{left:.0f} s left in this hop")
            return
        ahead.start(
            {
                "config": self.cfg.model_dump(),  # a tree: the config's type is built at run time
                "device": str(self.device),
                "threads": torch.get_num_threads(),  # Inductor's CPU code is keyed on it: the helper's must match
                "weights": {name: m.state_dict() for name, m in raw.items()},
                "states": self.task.compile_rehearsals(),
                "micro": micro,
            }
        )

    def compiled_in_update(self) -> bool:
        """Whether torch.compile compiled in the update just made (its time is compile time: a first update of
        30 s would make the budget stop a hop after it). Call only when `compiling`."""
        graphs = compiled_graphs()
        if graphs == self._graphs:
            return False
        self._graphs = graphs
        self._updates += 1
        return True

    def at_check(
        self, step: int, modules: dict[str, nn.Module], budget: TimeBudget, say: Callable[[str], None]
    ) -> None:
        """At a check step: when the helper has finished, the networks go under torch.compile (in place in
        `modules`), and their next call compiles from its cached code. If it failed, this process compiles them
        itself, as without it, unless the hop has less than 10 minutes left: then they stay eager (nothing stops
        a compile at the deadline). One process only (never under DDP)."""
        ahead = self.ahead
        if ahead is None or not ahead.poll():
            return
        ahead.eager_updates = step - self._hop_first
        left = budget.remaining()
        if ahead.outcome == "done" and left is not None:
            # the switch's first call loads the helper's code, seconds to tens of seconds that no stop can cut
            need = max(AHEAD_MIN_SECONDS, 0.25 * ahead.seconds)
            if left - self.cfg.budget.margin_seconds < need:
                say(
                    f"torch.compile: compiled in the background; the networks stay eager for the {left:.0f} s "
                    f"left in this hop (loading the compiled code may take ~{need:.0f} s), the next hop loads it"
                )
                return  # `close` marks the helper's code for the next hop
        if ahead.outcome != "done":
            where = f"torch.compile: the background compile {ahead.outcome} (see {ahead.log_path}); "
            if short_hop(left):  # a cold compile here could outlast the deadline: this hop stays eager
                say(where + f"the networks stay eager for the {left or 0.0:.0f} s left in this hop")
                return
            say(where + "compiling in this process")
        for name, mode in self.eager_until_switch.items():
            modules[name] = self.compiled(modules[name], mode)
        self.eager_until_switch = {}
        ahead.switched = True
        self._graphs = compiled_graphs()

    # ---- the hop's end --------------------------------------------------------------------------------------

    def summary(self, step: int, seconds: float) -> dict[str, Any]:
        """summary.json's `compile` entry ({} when nothing compiles), the hop's compile line printed; a hop that
        compiled without hitting a limit marks the kept cache: the next hop loads it, in its own process."""
        if not self.compiling:
            return {}
        made, line = compile_summary(self._before, self._updates, seconds)
        if made["graphs"] and not made["recompile_limit_hits"]:
            remember_compiled(self.key)
        if (ahead := self.ahead) is not None:
            if not ahead.switched:  # the hop ran eagerly throughout
                ahead.hop_ended(step - self._hop_first)
            made["background"] = ahead.record()
            line = line.replace("torch.compile: ", "torch.compile: " + ahead.said(), 1)
        print(line, flush=True)
        return {"compile": made}

    def close(self, budget: TimeBudget, stopped_for_time: bool) -> None:
        """End the helper with the hop (last in the trainer's close, after the trackers). After a stop for the
        time budget the checkpoint is committed and the time left before the deadline, less half the margin,
        would pass idle: the helper may finish in it. A helper that compiled everything without a switch in
        this hop (it ended after the last check step, or in the grace) marks its code for the next hop."""
        if self.ahead is None:
            return
        left = budget.remaining() if stopped_for_time else None
        margin = self.cfg.budget.margin_seconds
        self.ahead.close(grace=0.0 if left is None else left - max(margin / 2, 2.0))
        if not self.ahead.switched and self.ahead.compiled_all():
            remember_compiled(self.key)
