"""Devices, wrappers (DDP, torch.compile), optimizers and the update count: what the trainer builds once."""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from hpctrain.config.schema import ConfigBase
from hpctrain.errors import UserError
from hpctrain.runtime import dist
from hpctrain.runtime.env import ClusterEnv
from hpctrain.runtime.threads import CoreProbe, choose_threads
from hpctrain.runtime.torch_build import cpu_only_message
from hpctrain.train.context import Context, bf16_on_cpu_note
from hpctrain.train.memory import (
    AUTO_COMPILE_MIN_SECONDS,
    check_compile_names,
    checkpoint_blocks,
    compile_in_background,
    compile_key,
    compile_network,
    compiled_before,
    keep_compiled_code,
    recompute_wanted,
)
from hpctrain.train.nonfinite import NonFiniteGuard
from hpctrain.train.optim import build_optimizer, effective_lr
from hpctrain.train.spikes import SpikeGuard
from hpctrain.train.task import BatchStream, Task

log = logging.getLogger(__name__)


def pick_device(choice: str, env: ClusterEnv) -> torch.device:
    if choice == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise UserError(
                "train.device='mps' but this torch has no usable MPS (Apple GPU) backend; use auto"
            )
        if env.world_size > 1:
            raise UserError(f"train.device='mps' runs one process, not {env.world_size}; use cuda or cpu")
        return torch.device("mps")
    if choice == "cuda" and torch.version.cuda is None:
        raise UserError(cpu_only_message(torch.__version__))
    if choice == "cuda" and not torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        shown = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
        raise UserError(
            f"train.device=cuda but no CUDA device is visible{shown}: run on a GPU node (sbatch --gres=gpu:N) or "
            "set train.device=cpu"
        )
    if choice == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    index = env.local_rank % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def per_gpu_batch(global_batch: int, world_size: int, accumulation: int) -> int:
    """data.global_batch_size split over the ranks and the accumulated micro-steps; it must divide."""
    share = world_size * accumulation
    if global_batch % share:
        lower, upper = global_batch // share * share, (global_batch // share + 1) * share
        raise UserError(
            f"data.global_batch_size={global_batch} does not split over {world_size} processes x {accumulation} "
            f"accumulation steps: use a multiple of {share} (e.g. {lower or share} or {upper})"
        )
    return global_batch // share


def short_hop(seconds_left: float | None) -> bool:
    """Whether a hop is too short for `auto` to compile (None: no deadline)."""
    return seconds_left is not None and seconds_left < AUTO_COMPILE_MIN_SECONDS


class Setup:
    def __init__(
        self,
        cfg: ConfigBase,
        task: Task[ConfigBase],
        env: ClusterEnv,
        probe: CoreProbe | None = None,
        earlier_hop: dict[str, Any] | None = None,
    ) -> None:
        """`probe`: started when the process began (entry.py), for the thread count of a single CPU process
        (runtime/threads.py; None: one is started here); `earlier_hop`: the run's last chain.json record."""
        self.cfg = cfg
        self.task = task
        self.env = env
        train = cfg.train
        self.device = pick_device(train.device, env)
        self.ahead: dict[str, str] = {}  # networks to compile in the background (wrap), name -> mode
        self.compile_key = ""  # what the compiled code depends on (memory.compile_key), when any is compiled
        if train.precision == "fp16" and self.device.type != "cuda":
            raise UserError("train.precision='fp16' needs CUDA (GradScaler); use bf16 or fp32 on CPU")
        # the allocation's free cores, not torch's default of every core on the machine (runtime/threads.py)
        alone = self.device.type == "cpu" and env.world_size == 1 and train.threads == 0
        if alone and probe is None:
            probe = CoreProbe()
        chosen = choose_threads(train.threads, env, probe if alone else None, earlier_hop)
        self.threads, self.threads_source, self.threads_record = chosen.count, chosen.why, chosen.record
        torch.set_num_threads(self.threads)
        # measured, not assumed: bf16 autocast on a CPU without bf16 units is several times slower than fp32
        slow = self.device.type == "cpu" and train.precision == "bf16" and env.is_main
        self.precision_note = bf16_on_cpu_note(self.threads) if slow else ""
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = train.allow_tf32
            torch.backends.cudnn.allow_tf32 = train.allow_tf32
        dist.init(env, cfg.distributed.backend, self.device, cfg.distributed.timeout_seconds)
        if cfg.data.global_batch_size is not None:
            cfg.data.batch_size = per_gpu_batch(
                cfg.data.global_batch_size, env.world_size, train.grad_accum_steps
            )

    @property
    def global_batch(self) -> int:
        """Samples per update over all ranks: per-GPU batch x world size x accumulation."""
        return self.cfg.data.batch_size * self.env.world_size * self.cfg.train.grad_accum_steps

    def wrap(self, raw: dict[str, nn.Module], seconds_left: float | None = None) -> dict[str, nn.Module]:
        """Activation checkpointing, DDP and torch.compile around each network, said in one line at start.
        `seconds_left`: the hop's time (the same on every rank). Under 10 minutes, networks not in the kept cache
        are not compiled in the training process, where nothing could stop the compile at the deadline: `auto`
        leaves them eager, an explicit mode compiles them in the background (one process), not at all (DDP), or
        here only when train.compile_background=false says so. Networks to compile in the background are left
        eager here and kept in `self.ahead` (name -> mode) for `compile_now` at the switch."""
        train = self.cfg.train
        check_compile_names(train.compile, list(raw), self.cfg.model.type)
        background = compile_in_background(
            train.compile_background, self.device.type == "cuda", self.env.world_size
        )
        self.ahead = {}
        wrapped: dict[str, nn.Module] = {}
        said: list[str] = []
        modes = {name: self.task.compile_mode(name) for name in raw}
        modes = {name: mode for name, mode in modes.items() if mode != "off"}
        warm, cache_notes = False, []
        if modes:
            cache_notes.append(keep_compiled_code(Path(self.cfg.run.out_dir)))  # said with the first network
            # what the code also depends on beyond the networks' repr: their hyperparameters, the data settings
            # (the batch's shapes, static for most workloads), the card (Triton's binaries). More than needed
            # only costs a helper (a hop that is not warm compiles in the background); less costs a cold compile
            # on a CPU Inductor's code is keyed on the thread count too (train.threads auto varies with the load)
            card = (
                torch.cuda.get_device_name(self.device)
                if self.device.type == "cuda"
                else f"threads {torch.get_num_threads()}"
            )
            setting = (
                f"{train.precision} {train.memory_budget} {self.task.dynamic_shapes} {self.device.type} {card} "
                f"data {self.cfg.data.model_dump_json()} model {self.cfg.model.model_dump_json()}"
            )
            self.compile_key = compile_key(raw, modes, setting)
            # compiled before into the kept cache: loading it takes seconds, here, without a helper
            # rank 0's view on every rank (a node-local cache may differ): they must compile alike
            warm = bool(dist.broadcast_object(compiled_before(self.compile_key)))
            if warm and background:
                cache_notes.append("compiled in this process: the kept cache holds these networks' code")
                background = False
        # a cold compile blocks the training process for a minute or more, and nothing can stop it at the
        # deadline: in a short hop it goes to the background helper, which is ended with the hop
        cold_short = bool(modes) and not warm and short_hop(seconds_left)
        if cold_short and not background and train.compile_background is None and self.env.world_size == 1:
            background = True
            cache_notes.append(
                f"compiled in the background: {seconds_left or 0.0:.0f} s left in this hop and nothing of these "
                "networks in the kept cache (a cold compile here could outlast the deadline)"
            )
        for name, module in raw.items():
            out: nn.Module = module
            mode = self.task.compile_mode(name)
            auto = self.task.compile_setting(name) == "auto"
            if mode != "off" and auto and not background and not warm and short_hop(seconds_left):
                said.append(
                    f"{name}: not compiled (train.compile=auto and {seconds_left or 0.0:.0f} s left in this hop: "
                    f"compiling pays from about {AUTO_COMPILE_MIN_SECONDS / 60:.0f} minutes on)"
                )
                mode = "off"
            elif mode != "off" and not background and cold_short:
                if self.env.world_size > 1:  # every rank would block on its own cold compile
                    said.append(
                        f"{name}: not compiled in this hop (train.compile={mode}, {seconds_left or 0.0:.0f} s left "
                        f"and not in the kept cache: a cold compile in every rank could outlast the deadline; a "
                        f"hop with {AUTO_COMPILE_MIN_SECONDS / 60:.0f} minutes or more compiles it)"
                    )
                    mode = "off"
                else:  # train.compile_background=false said so
                    said.append(
                        f"{name}: compiled in this process although only {seconds_left or 0.0:.0f} s are left in "
                        "this hop (train.compile_background=false): a cold compile can outlast the deadline"
                    )
            if recompute_wanted(train.gradient_checkpointing, train.memory_budget, mode):
                blocks = self.task.activation_blocks(name, module)
                if blocks is None:
                    raise UserError(
                        f"train.gradient_checkpointing (or train.memory_budget without compiling): the "
                        f"{self.cfg.model.type} workload cannot recompute the activations of its network "
                        f"{name!r}; set it to false"
                    )
                said.append(f"{name}: recomputes {checkpoint_blocks(blocks) or 'its own'} blocks")
            trainable = any(p.requires_grad for p in module.parameters())
            if dist.active() and trainable:
                ids = [self.device.index] if self.device.type == "cuda" else None
                out = DistributedDataParallel(module, device_ids=ids)
            if mode != "off":
                said += cache_notes
                budget = (
                    ""
                    if train.memory_budget is None
                    else f", activation memory budget {train.memory_budget:g}"
                )
                if background:
                    self.ahead[name] = mode
                    said.append(
                        f"{name}: torch.compile mode {mode}{budget}, compiled in the background (eager until then)"
                    )
                else:
                    out = self.compiled(out, mode)
                    said.append(f"{name}: torch.compile mode {mode}{budget}")
            wrapped[name] = out
        if train.compile_background and not modes:  # asked for and ignored: said, never silently dropped
            said.append(
                "train.compile_background=true: nothing is compiled (train.compile is off here), no helper"
            )
        if said and self.env.is_main:
            print("networks: " + "; ".join(dict.fromkeys(s for s in said if s)), flush=True)
        return wrapped

    def compiled(self, module: nn.Module, mode: str) -> nn.Module:
        """`module` under torch.compile as this run compiles it (the activation-memory budget, dynamic sizes for
        ragged workloads): the same call in the training process and in the background helper, so the helper's
        cached code is what the training process looks up."""
        return compile_network(module, mode, self.cfg.train.memory_budget, self.task.dynamic_shapes or None)

    def compile_now(self, modules: dict[str, nn.Module]) -> None:
        """Switch the networks left eager for the background compile to torch.compile, in place (the update
        context holds the same dict): their next call compiles, from the kept code when the helper made it."""
        for name, mode in self.ahead.items():
            modules[name] = self.compiled(modules[name], mode)
        self.ahead = {}

    def optimizers(
        self, raw: dict[str, nn.Module]
    ) -> tuple[dict[str, torch.optim.Optimizer], dict[str, float]]:
        optimizers, base_lrs = {}, {}
        for name, members in self.task.optimizer_groups(list(raw)).items():
            optim_cfg = self.cfg.optim.model_copy(update=self.task.optimizer_overrides(name))
            lr = effective_lr(optim_cfg, self.global_batch)
            params = [p for member in members for p in raw[member].parameters()]
            optimizers[name] = build_optimizer(params, optim_cfg, lr)
            base_lrs[name] = lr
        return optimizers, base_lrs

    def context(
        self,
        modules: dict[str, nn.Module],
        raw: dict[str, nn.Module],
        optimizers: dict[str, torch.optim.Optimizer],
        guard: NonFiniteGuard,
        spikes: SpikeGuard | None = None,
    ) -> Context:
        """What the task's train_step works through (precision, DDP syncs, clipping, the optimizers)."""
        train = self.cfg.train
        ctx = Context(
            self.device,
            modules,
            raw,
            optimizers,
            train.precision,
            self.cfg.optim.grad_clip_norm,
            skip_nonfinite=guard.skip,
            spikes=spikes,
        )
        if guard.skip and not ctx.skip_nonfinite:
            # fp16: skipping before the GradScaler's update would keep its scale too high forever.
            log.warning(
                "train.on_nonfinite=skip_batch: under fp16 the GradScaler skips overflowing steps itself"
            )
            guard.skip = False
        return ctx

    @staticmethod
    def save_guess(raw: dict[str, nn.Module]) -> float:
        """Seconds a save may take until one is measured, from the state's size (weights + optimizer moments at
        a modest 200 MB/s): a fixed guess is either too long for small runs or too short for large models."""
        state_bytes = sum(p.numel() * p.element_size() for m in raw.values() for p in m.parameters())
        return 0.5 + 3 * state_bytes / 200e6

    def updates_per_epoch(self, stream: BatchStream) -> int | None:
        """Updates in one pass over the data (None for a data set of unknown size)."""
        per_epoch = stream.samples_per_epoch
        return max(1, math.ceil(per_epoch / self.global_batch)) if per_epoch else None

    def total_updates(self, stream: BatchStream) -> int:
        """train.total_updates, or train.epochs converted with the data set's size."""
        epochs = self.cfg.train.epochs
        if epochs is None:
            return int(self.cfg.train.total_updates)
        per_epoch = stream.samples_per_epoch
        if not per_epoch:
            raise UserError("train.epochs needs a data set of known size; set train.total_updates instead")
        updates = max(1, math.ceil(epochs * per_epoch / self.global_batch))
        if self.env.is_main:
            print(
                f"train.epochs={epochs:g} x {per_epoch} samples / {self.global_batch} per update "
                f"= {updates} updates",
                flush=True,
            )
        return updates
