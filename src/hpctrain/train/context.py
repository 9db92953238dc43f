"""The UpdateContext the trainer lends a task: precision, DDP gradient sync, optimizer steps with clipping."""

from __future__ import annotations

import contextlib
import time

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


SLOW_BF16 = 1.5  # bf16 this many times slower than fp32 on the CPU is said at start


def bf16_on_cpu_note(threads: int) -> str:
    """One line when bf16 autocast is slow on this CPU (measured: a linear layer of 128 x 256 x 256, forward and
    backward, the best of 3 in bf16 and in fp32: 0.1-0.3 s where bf16 is emulated), else "". CPUs without bf16
    units (AVX512-BF16, AMX) emulate it: the quick muon MLP trained 7x slower than in fp32. Only said, never
    changed: the precision is part of the run (another value is another run)."""
    layer, x = nn.Linear(256, 256), torch.randn(128, 256)

    def best(dtype: torch.dtype | None) -> float:
        times = []
        for _ in range(3):
            start = time.perf_counter()
            with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                layer(x).square().mean().backward()
            times.append(time.perf_counter() - start)
        return min(times)

    best(torch.bfloat16)  # the first call of each path loads its kernels
    best(None)
    ratio = best(torch.bfloat16) / max(best(None), 1e-9)
    if ratio < SLOW_BF16:
        return ""
    return (
        f"note: train.precision=bf16 is slow on this CPU (a bf16 layer took {ratio:.1f}x the fp32 time with "
        f"{threads} thread{'s' if threads > 1 else ''}: no bf16 units); train.precision=fp32 trains faster here"
    )
