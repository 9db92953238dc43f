"""Devices, wrappers (DDP, torch.compile), optimizers and the update count: what the trainer builds once."""

from __future__ import annotations

import logging
import math
import os
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from hpctrain.config.schema import ConfigBase
from hpctrain.errors import UserError
from hpctrain.runtime import dist
from hpctrain.runtime.budget import TimeBudget
from hpctrain.runtime.env import ClusterEnv
from hpctrain.runtime.threads import CoreProbe, choose_threads
from hpctrain.runtime.torch_build import cpu_only_message
from hpctrain.train.compile.compiler import Compiler
from hpctrain.train.context import Context, bf16_on_cpu_note
from hpctrain.train.memory import checkpoint_blocks, recompute_wanted
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

    def networks(self) -> dict[str, nn.Module]:
        """The task's networks, on the device."""
        raw = self.task.build_modules()
        for module in raw.values():
            module.to(self.device)
        return raw

    def has_val(self) -> bool:
        """Whether the data has a validation set (without one, train.eval_every is said to be ignored)."""
        has_val = self.task.build_data("val", self.cfg.run.seed) is not None
        if self.cfg.train.eval_every and not has_val and self.env.is_main:
            log.warning(
                "train.eval_every=%d is ignored: this data has no validation set", self.cfg.train.eval_every
            )
        return has_val

    def wrap(
        self, raw: dict[str, nn.Module], compiler: Compiler, budget: TimeBudget | None = None
    ) -> dict[str, nn.Module]:
        """Activation checkpointing, DDP and torch.compile around each network, said in one line at start.
        `compiler` decides which networks compile and where (train/compile/compiler.py), given the hop's time
        left in `budget` (None: unknown)."""
        train = self.cfg.train
        # every rank takes rank 0's view of the hop's time (under SLURM only rank 0 asks for the end time)
        left = dist.broadcast_object(budget.remaining()) if budget is not None else None
        plan = compiler.plan(raw, left if isinstance(left, float) else None)
        wrapped: dict[str, nn.Module] = {}
        said: list[str] = []
        for name, module in raw.items():
            out: nn.Module = module
            mode = plan.modes[name]
            said += plan.notes[name]
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
                said += plan.cache
                out, line = compiler.apply(name, out, mode)
                said.append(line)
            wrapped[name] = out
        said.append(plan.ignored)
        if any(said) and self.env.is_main:
            print("networks: " + "; ".join(dict.fromkeys(s for s in said if s)), flush=True)
        return wrapped

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
