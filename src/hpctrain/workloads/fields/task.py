"""The fields task: regress (Omega_m, sigma_8) from maps with a Gaussian likelihood or MSE/MAE/RMSE.

Targets are scaled to [-1, 1] over the prior box; evaluation reports, in physical units, R^2 and RMSE per
parameter from sums that add up over batches and ranks.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from hpctrain.data.loader import IndexedStream, as_batch
from hpctrain.errors import UserError
from hpctrain.runtime.env import ClusterEnv
from hpctrain.train.memory import recompute_wanted
from hpctrain.train.task import SupervisedTask, UpdateContext
from hpctrain.workloads.fields.dataset import Batch, GeneratedFields, ShardFields, eval_batches
from hpctrain.workloads.fields.generate import PARAMETERS
from hpctrain.workloads.fields.model import FieldCNN
from hpctrain.workloads.fields.spec import FieldsRun
from hpctrain.workloads.fields.survey import First, SurveyMaps, survey_split

log = logging.getLogger(__name__)
LOGVAR_RANGE = (-14.0, 6.0)  # keeps exp(-logvar) finite at the start of training


class FieldTask(SupervisedTask[FieldsRun]):
    def __init__(self, cfg: FieldsRun, env: ClusterEnv) -> None:
        super().__init__(cfg, env)
        self.targets = list(cfg.model.targets)
        self.columns = [PARAMETERS.index(t) for t in self.targets]
        self.nll = cfg.model.loss == "gaussian_nll"
        self._datasets: dict[str, Dataset[Batch] | None] = {}
        self._val_cache: list[Batch] | None = None
        prior = self._prior()
        self.lo = torch.tensor([prior[c][0] for c in self.columns])
        self.width = torch.tensor([prior[c][1] - prior[c][0] for c in self.columns])

    # ---- data ----------------------------------------------------------------------------------------------

    def _prior(self) -> list[tuple[float, float]]:
        d = self.cfg.data
        if d.path is None:
            return [d.omega_m, d.sigma_8]  # tuples already (pydantic)
        if d.kind == "des":
            # opened now: missing or misshapen files are one line before anything is built
            self.dataset("train")
            return [d.omega_m, d.sigma_8]  # the box of the simulations the survey's maps are compared with
        train = self.dataset("train")
        shards = train.inner if isinstance(train, First) else train
        assert isinstance(shards, ShardFields)
        for key in ("kind", "size", "box_size"):
            if shards.meta[key] != getattr(d, key):
                log.warning(
                    "data.%s=%s is ignored: the shards in %s hold %s",
                    key,
                    getattr(d, key),
                    d.path,
                    shards.meta[key],
                )
        return shards.prior

    def dataset(self, split: str) -> Dataset[Batch] | None:
        """The split's data set (None when it has no maps)."""
        if split not in self._datasets:
            d = self.cfg.data
            n = {"train": d.n_train, "val": d.n_val, "test": d.n_test}[split]
            if d.path is not None:
                self._datasets[split] = self._first(split, self._from_path(split), n)
            else:
                self._datasets[split] = (
                    GeneratedFields(d.kind, split, n, d.data_seed, d.size, d.box_size, [d.omega_m, d.sigma_8])
                    if n
                    else None
                )
        return self._datasets[split]

    def _from_path(self, split: str) -> ShardFields | SurveyMaps | None:
        d = self.cfg.data
        assert d.path is not None
        if d.kind == "des":
            survey = survey_split(Path(d.path), split)
            if survey is not None and survey.size != d.size and split == "train":
                log.warning(
                    "data.size=%d is ignored: the survey maps in %s are %d x %d",
                    d.size,
                    d.path,
                    survey.size,
                    survey.size,
                )
            return survey
        folder = Path(d.path) / split
        if split == "train" and not (folder / "meta.json").is_file():
            missing = " (no such folder)" if not Path(d.path).is_dir() else ""
            raise UserError(
                f"data.path={d.path!r} has no train/meta.json{missing}; "
                "write it with `hpctrain data generate --kind fields --out ...` (or data.kind=des for your "
                "survey's maps)"
            )
        return ShardFields(folder) if (folder / "meta.json").is_file() else None

    def _first(self, split: str, found: ShardFields | SurveyMaps | None, n: int) -> Dataset[Batch] | None:
        """data.n_<split> set with data.path (TRAIN_SAMPLES, VAL_SAMPLES): the first n maps of the split."""
        key = f"n_{split}"
        if found is None or key not in self.cfg.data.model_fields_set:
            return found
        if n == 0:
            return None
        if n > len(found):
            log.warning(
                "data.%s=%d: %s holds %d %s maps; all of them are used",
                key,
                n,
                self.cfg.data.path,
                len(found),
                split,
            )
            return found
        return First(found, n)

    def build_data(self, split: str, seed: int) -> Any:
        d = self.cfg.data
        dataset = self.dataset(split)
        if split == "train":
            assert dataset is not None
            files = dataset.file_list() if isinstance(dataset, (ShardFields, SurveyMaps, First)) else None
            return IndexedStream.from_config(dataset, d, seed, self.env, collate_fn=as_batch, files=files)
        if dataset is None:
            return None
        if split == "val" and d.cache_val:
            if self._val_cache is None:
                self._val_cache = eval_batches(dataset, d.batch_size, self.env.rank, self.env.world_size)
            return self._val_cache
        return eval_batches(dataset, d.batch_size, self.env.rank, self.env.world_size)

    def batch_samples(self, batch: Any) -> int:
        return int(batch[0].shape[0])

    # ---- model and loss ------------------------------------------------------------------------------------

    def network_settings(self) -> dict[str, dict[str, Any]]:
        m = self.cfg.model
        on_gpu = self.cfg.train.device != "cpu" and torch.cuda.is_available()
        settings = {
            "widths": list(m.widths),
            "blocks": m.blocks,
            "groups": m.groups,
            "head_hidden": m.head_hidden,
            "outputs": len(self.targets) * (2 if self.nll else 1),
            "gradient_checkpointing": recompute_wanted(
                self.cfg.train.gradient_checkpointing,
                self.cfg.train.memory_budget,
                self.compile_mode("model"),
            ),
            "channels_last": m.channels_last and on_gpu,
            "stem_stride": m.stem_stride,
        }
        return {"model": settings}

    def build_modules(self) -> dict[str, nn.Module]:
        model = FieldCNN(**self.network_settings()["model"])
        if model.channels_last:
            model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        return {"model": model}

    def activation_blocks(self, name: str, module: nn.Module) -> list[nn.Module] | None:
        return []  # FieldCNN checkpoints each residual block itself (gradient_checkpointing above)

    def scale(self, params: torch.Tensor) -> torch.Tensor:
        """Physical parameters (B, 2) -> the targets (B, T) in [-1, 1] over the prior box."""
        lo, width = self.lo.to(params.device), self.width.to(params.device)
        return 2 * (params[:, self.columns] - lo) / width - 1

    def unscale(self, scaled: torch.Tensor) -> torch.Tensor:
        lo, width = self.lo.to(scaled.device), self.width.to(scaled.device)
        return lo + (scaled + 1) / 2 * width

    def _predict(
        self, model: nn.Module, batch: Batch
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        maps, params = batch
        out = model(maps).float()  # (B, T) or (B, 2T)
        t = len(self.targets)
        logvar = out[:, t:].clamp(*LOGVAR_RANGE) if self.nll else None
        return out[:, :t], logvar, self.scale(params)

    def _loss(self, mean: torch.Tensor, logvar: torch.Tensor | None, target: torch.Tensor) -> torch.Tensor:
        err = mean - target  # (B, T)
        kind = self.cfg.model.loss
        if kind == "gaussian_nll":
            assert logvar is not None
            # Negative log-likelihood without the constant 0.5 log(2 pi), per parameter, averaged.
            return (0.5 * (logvar + err**2 * torch.exp(-logvar))).mean()
        if kind == "mae":
            return err.abs().mean()
        mse = (err**2).mean()
        return torch.sqrt(mse + 1e-12) if kind == "rmse" else mse

    def loss(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        mean, logvar, target = self._predict(model, batch)
        loss = self._loss(mean, logvar, target)
        return loss, {"mse_scaled": ((mean - target) ** 2).mean().detach()}

    # ---- evaluation ----------------------------------------------------------------------------------------

    def eval_step(self, batch: Any, ctx: UpdateContext) -> dict[str, torch.Tensor]:
        with ctx.autocast():
            mean, logvar, target = self._predict(ctx.raw_modules["model"], batch)
        n = mean.shape[0]
        loss = self._loss(mean, logvar, target)
        truth = self.unscale(target).double()  # (B, T) physical units
        pred = self.unscale(mean).double()
        # Sums centred on the prior box's middle, so that R^2 = 1 - SSE / SST loses no precision.
        centred = truth - (self.lo.to(truth) + self.width.to(truth) / 2)
        sums = {"loss_sum": loss.detach().double() * n, "count": torch.tensor(float(n), dtype=torch.float64)}
        for i, name in enumerate(self.targets):
            sums[f"sse_{name}"] = ((pred[:, i] - truth[:, i]) ** 2).sum()
            sums[f"sy_{name}"] = centred[:, i].sum()
            sums[f"syy_{name}"] = (centred[:, i] ** 2).sum()
            if logvar is not None:
                # Predicted standard deviation in physical units (the half-width of the box maps to 1).
                sums[f"ssd_{name}"] = (
                    torch.exp(0.5 * logvar[:, i].double()) * self.width[i].item() / 2
                ).sum()
        return sums

    def finish_eval(self, sums: dict[str, float]) -> dict[str, float]:
        n = max(sums.get("count", 0.0), 1.0)
        metrics = {"val_loss": sums.get("loss_sum", 0.0) / n}
        r2 = []
        for name in self.targets:
            sse = sums.get(f"sse_{name}", 0.0)
            sst = sums.get(f"syy_{name}", 0.0) - sums.get(f"sy_{name}", 0.0) ** 2 / n
            metrics[f"val_rmse_{name}"] = math.sqrt(sse / n)
            metrics[f"val_r2_{name}"] = 1.0 - sse / sst if sst > 0 else float("nan")
            r2.append(metrics[f"val_r2_{name}"])
            if f"ssd_{name}" in sums:
                metrics[f"val_sigma_{name}"] = sums[f"ssd_{name}"] / n
        metrics["val_r2_mean"] = sum(r2) / len(r2)
        return metrics
