"""The regression task: synthetic data with a known smooth target, an MLP, MSE/MAE/RMSE."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from hpctrain.data.loader import IndexedStream, as_batch, eval_batches
from hpctrain.train.task import SupervisedTask
from hpctrain.workloads.regression.spec import RegressionRun


def make_dataset(n: int, in_features: int, noise: float, seed: int, split: int = 0) -> TensorSamples:
    """x ~ N(0, 1); y = sin(x.w1) + 0.5 (x.w2)^2 + noise. The target (w1, w2) is fixed by `seed`; the
    samples by (seed, split), so validation samples never repeat training ones."""
    w = torch.randn(2, in_features, generator=torch.Generator().manual_seed(seed)) / in_features**0.5
    generator = torch.Generator().manual_seed(seed * 1000 + 1 + split)
    x = torch.randn(n, in_features, generator=generator)
    y = torch.sin(x @ w[0]) + 0.5 * (x @ w[1]) ** 2 + noise * torch.randn(n, generator=generator)
    return TensorSamples(x, y.unsqueeze(1))  # x: (n, d), y: (n, 1)


class TensorSamples(TensorDataset):
    """In-memory samples fetched a whole batch at a time (one gather, no per-sample collate)."""

    def take(self, index: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The samples `index` (B,): one gather per tensor (data/loader.py TakesIndex)."""
        return tuple([t[index] for t in self.tensors])

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, ...]:
        return self.take(torch.as_tensor(indices))


class MLP(nn.Module):
    def __init__(self, in_features: int, hidden: list[int], activation: str, dropout: float) -> None:
        super().__init__()
        act = {"gelu": nn.GELU, "relu": nn.ReLU, "tanh": nn.Tanh}[activation]
        layers: list[nn.Module] = []
        width = in_features
        for h in hidden:
            layers += [nn.Linear(width, h), act()]
            if dropout:
                layers.append(nn.Dropout(dropout))
            width = h
        layers.append(nn.Linear(width, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)  # (B, 1)


class RegressionTask(SupervisedTask[RegressionRun]):
    def network_settings(self) -> dict[str, dict[str, Any]]:
        m, d = self.cfg.model, self.cfg.data
        return {
            "model": {
                "in_features": d.in_features,
                "hidden": list(m.hidden),
                "activation": m.activation,
                "dropout": m.dropout,
            }
        }

    def build_modules(self) -> dict[str, nn.Module]:
        return {"model": MLP(**self.network_settings()["model"])}

    def _dataset(self, split: str) -> TensorSamples:
        d = self.cfg.data
        n = d.n_train if split == "train" else d.n_val
        return make_dataset(n, d.in_features, d.noise, d.data_seed, split=0 if split == "train" else 1)

    def build_data(self, split: str, seed: int) -> Any:
        d = self.cfg.data
        if split == "train":
            return IndexedStream.from_config(self._dataset("train"), d, seed, self.env, collate_fn=as_batch)
        if d.n_val == 0:
            return None
        return eval_batches(self._dataset("val"), d.batch_size, self.env.rank, self.env.world_size)

    def batch_samples(self, batch: Any) -> int:
        return int(batch[0].shape[0])

    def loss(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        x, y = batch
        pred = model(x)  # (B, 1)
        if pred.dtype != y.dtype:
            pred = pred.float()  # autocast output
        kind = self.cfg.model.loss
        if kind == "mae":
            return F.l1_loss(pred, y), {}
        mse = F.mse_loss(pred, y)
        return (mse if kind == "mse" else torch.sqrt(mse + 1e-12)), {}

    def eval_step(self, batch: Any, ctx: Any) -> dict[str, torch.Tensor]:
        x, y = batch
        with ctx.autocast():
            err = ctx.raw_modules["model"](x).float() - y  # (B, 1)
        return {
            "mse_sum": (err**2).sum(),
            "mae_sum": err.abs().sum(),
            "count": torch.tensor(float(x.shape[0])),
        }

    def finish_eval(self, sums: dict[str, float]) -> dict[str, float]:
        metrics = super().finish_eval(sums)  # val_mse, val_mae
        metrics["val_rmse"] = metrics["val_mse"] ** 0.5
        metrics["val_loss"] = metrics[f"val_{self.cfg.model.loss}"]
        return metrics
