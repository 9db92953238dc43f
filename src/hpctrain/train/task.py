"""The task interface: everything model-specific, so the trainer knows no model.

A workload provides a `Task`: it builds its networks and data, and computes one optimizer update from the
micro-batches the trainer hands it, through an `UpdateContext` that owns precision, DDP and the optimizers.
`SupervisedTask` covers the common case (one network, one loss); GANs implement `train_step` themselves.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

import torch
from torch import nn

from hpctrain.config.schema import ConfigBase
from hpctrain.runtime.env import ClusterEnv
from hpctrain.train.compile.policy import compile_mode_of, on_cuda, resolve_compile
from hpctrain.train.memory import blocks_of


@runtime_checkable
class BatchStream(Protocol):
    """An endless, resumable stream of this rank's batches (epochs follow one another).

    `state_dict()` describes the position after the last batch HANDED OUT (not prefetched), so that a resumed
    stream continues with the very next sample, also with another number of workers or ranks.
    """

    def __iter__(self) -> Iterator[Any]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    @property
    def samples_per_epoch(self) -> int | None: ...

    def close(self) -> None: ...


@dataclass
class MicroBatch:
    """A piece of one update's data; `weight` is its share of the update's samples (weights sum to 1)."""

    data: Any
    weight: float
    samples: int


@dataclass
class StepOutput:
    """What one update reports: `loss` (a tensor, not synchronised), other metrics, and sample counts."""

    loss: torch.Tensor
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)
    samples: int = 0
    extra_counts: dict[str, int] = field(default_factory=dict)


class UpdateContext(Protocol):
    """What the trainer lends a task for one update."""

    device: torch.device
    modules: dict[str, nn.Module]  # wrapped (DDP/compiled) networks: call these in train_step
    raw_modules: dict[str, nn.Module]  # the plain networks (for no-grad uses and state)

    def autocast(self) -> contextlib.AbstractContextManager[None]: ...

    def no_sync(self, name: str, last: bool) -> contextlib.AbstractContextManager[None]: ...

    def backward(self, loss: torch.Tensor) -> None: ...

    def optimizer_step(self, name: str) -> None: ...

    def zero_grad(self, name: str) -> None: ...


# The configuration as a workload sees it: ConfigBase with the workload's own `model` and `data` sections (a
# typing-only subclass in its spec.py, e.g. RegressionRun).
C = TypeVar("C", bound=ConfigBase, covariant=True)


class Task(ABC, Generic[C]):
    """Base of every workload's task. Subclasses receive the validated config and the ClusterEnv."""

    def __init__(self, cfg: C, env: ClusterEnv) -> None:
        self.cfg = cfg
        self.env = env

    @abstractmethod
    def build_modules(self) -> dict[str, nn.Module]:
        """The networks, by name (initialised from the seeded torch RNG)."""

    def network_settings(self) -> dict[str, dict[str, Any]]:
        """Each network's constructor keyword arguments (JSON values), by name: `type(network)(**settings)`
        rebuilds it outside hpctrain (what `hpctrain export` records). A workload builds its networks from
        these in `build_modules`, so the two cannot disagree; {} = not said (an export names the classes only)."""
        return {}

    # Batch sizes change from batch to batch (ragged sets): networks are compiled with dynamic sizes.
    dynamic_shapes: bool = False

    def compile_setting(self, name: str) -> str:
        """The configured torch.compile mode of network `name`, possibly "auto" (default: train.compile, one mode
        for every network or a mode per network)."""
        return compile_mode_of(self.cfg.train.compile, name)

    def compile_mode(self, name: str) -> str:
        """torch.compile mode of network `name`, "off" = not compiled: the setting with auto resolved for the
        device the run uses."""
        return resolve_compile(self.compile_setting(name), on_cuda(self.cfg.train.device))

    def activation_blocks(self, name: str, module: nn.Module) -> list[nn.Module] | None:
        """The blocks of network `name` that recompute their activations in backward under
        train.gradient_checkpointing (default: its outermost nn.Sequential blocks); [] when the network does it
        itself; None when this workload cannot (the run is refused, naming it)."""
        return blocks_of(module)

    def optimizer_groups(self, names: list[str]) -> dict[str, list[str]]:
        """Optimizer name -> the networks it updates. One optimizer over everything by default."""
        return {"main": list(names)}

    def optimizer_overrides(self, name: str) -> dict[str, Any]:
        """Per-optimizer changes to the `optim` section (e.g. a critic's own lr)."""
        return {}

    @abstractmethod
    def build_data(self, split: str, seed: int) -> BatchStream | Iterable[Any] | None:
        """The batches of `split`: for 'train' a BatchStream (endless, resumable); for 'val' (or a workload's own
        split) a finite iterable of batches (this rank's share), or None when there is no such set."""

    def train_stream(self, seed: int) -> BatchStream:
        """build_data('train'), which must be a BatchStream."""
        stream = self.build_data("train", seed)
        if not isinstance(stream, BatchStream):
            raise TypeError(
                f"{type(self).__name__}.build_data('train') returned {type(stream).__name__}, not a BatchStream"
            )
        return stream

    def split(self, batch: Any) -> list[MicroBatch]:
        """Cut a batch into micro-batches (e.g. under a memory cap). One piece by default."""
        n = self.batch_samples(batch)
        return [MicroBatch(batch, 1.0, n)]

    def halve_batch(self, batch: Any) -> tuple[Any, Any] | None:
        """Two halves of a batch (on the device), for train.on_oom=split; None when it cannot be cut. Default:
        tensors (and tuples, lists, dicts of them) cut along their first dimension."""
        return halve_tree(batch)

    @abstractmethod
    def batch_samples(self, batch: Any) -> int:
        """Number of samples (events, maps, rows) in a batch."""

    def to_device(self, batch: Any, device: torch.device) -> Any:
        return _move(batch, device)

    @abstractmethod
    def train_step(self, micro_batches: list[MicroBatch], ctx: UpdateContext) -> StepOutput:
        """One optimizer update from these micro-batches (accumulate, then step through ctx)."""

    @abstractmethod
    def eval_step(self, batch: Any, ctx: UpdateContext) -> dict[str, torch.Tensor]:
        """SUMS over the batch (e.g. {'loss_sum':..., 'count':...}); the trainer adds them over batches and
        ranks and calls `finish_eval`."""

    def finish_eval(self, sums: dict[str, float]) -> dict[str, float]:
        """Turn summed evaluation figures into metrics (default: every *_sum divided by count)."""
        count = max(sums.get("count", 1.0), 1.0)
        return {f"val_{k[:-4]}": v / count for k, v in sums.items() if k.endswith("_sum")}

    def model_figures(self, modules: dict[str, nn.Module], step: int) -> dict[str, float]:
        """Figures of the networks themselves at each evaluation, beyond the validation sums (e.g. a generator's
        samples judged against held-out data): run on the main rank only, with the networks in eval mode and
        the random streams restored afterwards; the trainer hands them to every rank and logs them with the
        evaluation's metrics (so checkpoint.best_metric may name one). No collectives here; none by default."""
        return {}

    def after_training(self, modules: dict[str, nn.Module], step: int) -> None:
        """Called once on the main rank when the run has finished (after the final save): e.g. a workload's
        own quality report in the run folder. No collectives here; nothing by default."""

    def histograms(self, batch: Any) -> dict[str, torch.Tensor]:
        """Values worth a histogram (e.g. primaries, multiplicities); empty by default."""
        return {}

    def compile_rehearsals(self) -> list[dict[str, Any]]:
        """Task states (as `state_dict` gives them) under which the background compile (train/compile/ahead.py)
        runs one update each, so that it meets every graph the training will. Default: the state now; a task
        whose updates change with its state (a warm-up phase) adds one state per later phase."""
        return [self.state_dict()]

    def state_dict(self) -> dict[str, Any]:
        """Task state beyond networks and optimizers (e.g. normalisation statistics, EMA)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


# What the workload registry hands the engine: (the validated config of its model type, this process's
# ClusterEnv) -> its Task. `Any`: each workload's factory takes its own config class.
TaskFactory = Callable[[Any, ClusterEnv], "Task[Any]"]


def halve_tree(data: Any) -> tuple[Any, Any] | None:
    """Two halves of a batch along its first dimension (tensors, and tuples, lists and dicts of them with one
    leading size; other values are kept in both halves), or None when it cannot be cut (fewer than 2 samples, a
    type this does not know, tensors of different leading sizes)."""
    sizes: set[int] = set()

    def size_of(x: Any) -> bool:
        if isinstance(x, torch.Tensor):
            if x.dim() == 0:
                return False
            sizes.add(x.shape[0])
            return True
        if isinstance(x, (tuple, list)):
            return all(size_of(v) for v in x)
        if isinstance(x, dict):
            return all(size_of(v) for v in x.values())
        return isinstance(x, (int, float, str, bool)) or x is None

    if not size_of(data) or len(sizes) != 1 or (n := sizes.pop()) < 2:
        return None
    cut = (n + 1) // 2

    def take(x: Any, part: slice) -> Any:
        if isinstance(x, torch.Tensor):
            return x[part]
        if isinstance(x, (tuple, list)):
            return type(x)(take(v, part) for v in x)
        if isinstance(x, dict):
            return {k: take(v, part) for k, v in x.items()}
        return x

    return take(data, slice(0, cut)), take(data, slice(cut, None))


def _move(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch if batch.device == device else batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: _move(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_move(v, device) for v in batch)
    return batch


class SupervisedTask(Task[C]):
    """One network `model`, one optimizer, a loss per micro-batch; accumulation done here."""

    @abstractmethod
    def loss(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Mean loss over the batch and extra (mean) metrics."""

    def train_step(self, micro_batches: list[MicroBatch], ctx: UpdateContext) -> StepOutput:
        model = ctx.modules["model"]
        if len(micro_batches) == 1:  # the common case: no accumulation, no extra tensor arithmetic per update
            micro = micro_batches[0]
            with ctx.autocast():
                loss, metrics = self.loss(model, micro.data)
            ctx.backward(loss)
            ctx.optimizer_step("main")
            return StepOutput(loss.detach(), metrics, micro.samples)
        losses, extras = [], []
        for i, micro in enumerate(micro_batches):
            with ctx.no_sync("model", last=i == len(micro_batches) - 1):
                with ctx.autocast():
                    loss, metrics = self.loss(model, micro.data)
                ctx.backward(loss if micro.weight == 1.0 else loss * micro.weight)
            losses.append(loss.detach())
            extras.append(metrics)
        ctx.optimizer_step("main")
        weights = [m.weight for m in micro_batches]
        total = sum(w * x.float() for w, x in zip(weights, losses))
        merged = {k: sum(w * e[k].float() for w, e in zip(weights, extras)) for k in extras[0]}
        return StepOutput(total, merged, sum(m.samples for m in micro_batches))  # type: ignore[arg-type]

    def eval_step(self, batch: Any, ctx: UpdateContext) -> dict[str, torch.Tensor]:
        with ctx.autocast():
            loss, metrics = self.loss(ctx.raw_modules["model"], batch)
        n = float(self.batch_samples(batch))
        sums = {"loss_sum": loss.detach().float() * n, "count": torch.tensor(n)}
        sums.update({f"{k}_sum": v.detach().float() * n for k, v in metrics.items()})
        return sums


def take_update(
    task: Task[Any], batches: Iterator[Any], accumulation: int, device: torch.device
) -> list[MicroBatch] | None:
    """The next update's micro-batches on `device` (`accumulation` batches, each split by the task), weighted by
    their samples; None when they hold no sample (an empty update: skipped on every rank)."""
    split, to_device = task.split, task.to_device
    micro = split(next(batches))
    for _ in range(accumulation - 1):
        micro = micro + split(next(batches))
    if len(micro) == 1:  # the common case, one piece: no passes over a list
        m = micro[0]
        return [MicroBatch(to_device(m.data, device), 1.0, m.samples)] if m.samples else None
    total = sum(m.samples for m in micro)
    if total == 0:
        return None
    return [MicroBatch(to_device(m.data, device), m.samples / total, m.samples) for m in micro if m.samples]
