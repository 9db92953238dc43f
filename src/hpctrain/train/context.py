"""The UpdateContext the trainer lends a task: precision, DDP gradient sync, optimizer steps with clipping."""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from hpctrain.train.spikes import SpikeGuard


class Context:
    def __init__(
        self,
        device: torch.device,
        modules: dict[str, nn.Module],
        raw_modules: dict[str, nn.Module],
        optimizers: dict[str, torch.optim.Optimizer],
        precision: str,
        clip_norm: float,
        skip_nonfinite: bool = False,
        spikes: SpikeGuard | None = None,
    ) -> None:
        self.device = device
        self.modules = modules
        self.raw_modules = raw_modules
        self.optimizers = optimizers
        self.clip_norm = clip_norm
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        # fp16 needs loss scaling (CUDA only; the trainer refuses fp16 on CPU); bf16 does not.
        self.scaler = torch.amp.GradScaler("cuda") if precision == "fp16" else None
        self.grad_norms: dict[str, torch.Tensor] = {}
        # train.on_nonfinite=skip_batch: a step with non-finite gradients is skipped. The gradients are the same
        # on every rank after DDP's all-reduce (a NaN on one rank spreads to all), so every rank skips the same
        # steps without a collective of its own; the check costs one host sync per step. Under fp16 the
        # GradScaler already skips overflowing steps (and calibrates with them): it is left to do that.
        self.skip_nonfinite = skip_nonfinite and self.scaler is None
        self.skipped_steps = 0
        # Backward passes since the last optimizer step: where in its update a rank is (the hang watchdog compares
        # ranks by it: one waiting in DDP's gradient all-reduce has begun its backward, a stalled one has not).
        self.backwards = 0
        # train.on_spike=skip_batch: each step's loss is judged before the step (spikes.py), else None
        self.spikes = spikes if spikes is not None and spikes.mode == "skip_batch" else None
        self._params = {
            name: [p for group in opt.param_groups for p in group["params"]]
            for name, opt in optimizers.items()
        }
        # Found once, not per micro-batch: the DDP wrapper of each network (under torch.compile's), if any.
        self._ddp = {
            name: ddp
            for name, module in modules.items()
            if isinstance(ddp := getattr(module, "_orig_mod", module), DistributedDataParallel)
        }
        self._nothing = contextlib.nullcontext()  # reusable: one for every update that needs no context

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        if self.dtype is None:
            return self._nothing
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def no_sync(self, name: str, last: bool) -> contextlib.AbstractContextManager[None]:
        """Skip the DDP all-reduce on all but the last micro-batch of an update."""
        ddp = self._ddp.get(name)
        if last or ddp is None:
            return self._nothing
        return ddp.no_sync()

    def backward(self, loss: torch.Tensor) -> None:
        self.backwards += 1
        if self.spikes is not None:
            self.spikes.add(loss)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()  # type: ignore[no-untyped-call]  # (torch's backward is untyped)
        else:
            loss.backward()  # type: ignore[no-untyped-call]

    def zero_grad(self, name: str) -> None:
        self.optimizers[name].zero_grad(set_to_none=True)

    def optimizer_step(self, name: str) -> None:
        self.backwards = 0
        optimizer = self.optimizers[name]
        if self.spikes is not None and self.spikes.skip(name):  # before the GradScaler unscales anything
            optimizer.zero_grad(set_to_none=True)
            return
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)
        if self.clip_norm > 0:
            self.grad_norms[name] = torch.nn.utils.clip_grad_norm_(self._params[name], self.clip_norm)
        if self.skip_nonfinite and not self._finite_grads(name):
            self.skipped_steps += 1
            optimizer.zero_grad(set_to_none=True)
            return
        if self.scaler is not None:
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def _finite_grads(self, name: str) -> bool:
        norm = self.grad_norms.get(name) if self.clip_norm > 0 else None
        if norm is None:
            grads = [p.grad for p in self._params[name] if p.grad is not None]
            if not grads:
                return True
            norm = torch.nn.utils.get_total_norm(grads)
        return bool(torch.isfinite(norm))
