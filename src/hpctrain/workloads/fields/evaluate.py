"""Predicted vs true cosmological parameters on the held-out test maps, for `hpctrain report`.

`evaluate_run(RUN)` predicts every test map with the run's latest checkpoint and returns evaluate.json's content:

    {"metrics": {"r2_<param>", "rmse_<param>", "bias_<param>", "residual_std_<param>", ...},
     "predictions": {"<param>": {"true": [...], "predicted": [...], "sigma": [...] (gaussian_nll only)}},
     "info": {"checkpoint", "step", "maps", "split"}}

`hpctrain evaluate RUN` (fields/verbs.py) calls it and `write_outputs` writes it into the run folder.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hpctrain.config.loading import validate
from hpctrain.errors import UserError
from hpctrain.fsutil import atomic_write_text
from hpctrain.runtime.env import ClusterEnv
from hpctrain.train.checkpoint import Located, locate, strip_prefixes
from hpctrain.workloads.registry import config_model, task_factory


def _load(path: str | Path, found: Located | None) -> tuple[Any, Any, Any, int, Path, Path | None]:
    """(cfg, task, model in eval mode, step, checkpoint file, run folder) of a run folder's latest checkpoint
    or of a checkpoint file (`found`: that checkpoint, when the caller has read it already)."""
    found = found if found is not None else locate(path)
    state, file, run_dir = found.state, found.file, found.run_dir
    cfg = validate(config_model(), state["config"])
    if cfg.model.type != "field_cnn":
        raise UserError(f"{file}: model.type={cfg.model.type!r} is not a fields model")
    cfg.train.device = "cpu"
    task = task_factory(cfg.model.type)(cfg, ClusterEnv())
    model = task.build_modules()["model"]
    model.load_state_dict(strip_prefixes(state["modules"]["model"]))
    model.eval()
    return cfg, task, model, int(state.get("counters", {}).get("step", 0)), file, run_dir


def evaluate_run(
    path: str | Path, max_maps: int = 0, split: str = "test", found: Located | None = None
) -> dict[str, Any]:
    cfg, task, model, step, file, _ = _load(path, found)
    dataset = task.dataset(split)
    if dataset is None or len(dataset) == 0:
        raise UserError(f"{path}: the fields data has no {split!r} maps (data.n_{split}=0?)")
    n = min(len(dataset), max_maps) if max_maps > 0 else len(dataset)
    means, sigmas, truths = [], [], []
    with torch.no_grad():
        for start in range(0, n, cfg.data.batch_size):
            batch = dataset.__getitems__(list(range(start, min(start + cfg.data.batch_size, n))))
            mean, logvar, target = task._predict(model, batch)  # (B, T) scaled to [-1, 1]
            means.append(task.unscale(mean).numpy())
            truths.append(task.unscale(target).numpy())
            if logvar is not None:
                sigmas.append((torch.exp(0.5 * logvar) * task.width / 2).numpy())
    pred, true = np.concatenate(means).astype(float), np.concatenate(truths).astype(float)
    sigma = np.concatenate(sigmas).astype(float) if sigmas else None
    metrics: dict[str, float] = {}
    predictions: dict[str, dict[str, list[float]]] = {}
    for i, name in enumerate(task.targets):
        residual = pred[:, i] - true[:, i]
        sst = float(np.sum((true[:, i] - true[:, i].mean()) ** 2))
        metrics[f"r2_{name}"] = 1.0 - float(np.sum(residual**2)) / sst if sst > 0 else math.nan
        metrics[f"rmse_{name}"] = float(np.sqrt(np.mean(residual**2)))
        metrics[f"bias_{name}"] = float(residual.mean())
        metrics[f"residual_std_{name}"] = float(residual.std())
        predictions[name] = {"true": true[:, i].tolist(), "predicted": pred[:, i].tolist()}
        if sigma is not None:
            predictions[name]["sigma"] = sigma[:, i].tolist()
            metrics[f"pull_std_{name}"] = float(np.std(residual / sigma[:, i]))
    info = {"checkpoint": str(file), "step": step, "maps": n, "split": split}
    return {"metrics": metrics, "predictions": predictions, "info": info}


def write_outputs(run_dir: Path, result: dict[str, Any]) -> Path:
    path = Path(run_dir) / "evaluate.json"
    clean = {
        **result,
        "metrics": {k: (v if math.isfinite(v) else None) for k, v in result["metrics"].items()},
    }
    atomic_write_text(path, json.dumps(clean, indent=1) + "\n")
    return path
