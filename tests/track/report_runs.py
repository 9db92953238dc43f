"""Run folders as the trainer and the evaluations leave them (small, written directly): muons and fields."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from hpctrain.workloads.muons.evaluation import evaluate as muon_eval
from hpctrain.workloads.muons.evaluation import quality
from hpctrain.workloads.muons.events import layouts


def _hops(changed_at: int, total: int) -> list[dict]:
    common = {"nodes": "c1", "world_size": 1, "config_hash": "abc", "train_seconds": 80.0, "goodput": 0.8}
    return [
        {**common, "hop": 0, "job_id": "101", "start": 1000.0, "end": 1100.0, "deadline": 1100.0,
         "first_update": 0, "last_update": changed_at, "exit_reason": "time_budget"},
        {**common, "hop": 1, "job_id": "102", "start": 1200.0, "end": 1300.0, "deadline": 1300.0,
         "first_update": changed_at, "last_update": total, "exit_reason": "finished",
         "allowed_changes": {"data.prefetch_batches": [0, 2]}},
    ]  # fmt: skip


def _metrics(run: Path, keys: dict, val_keys: dict, total: int) -> None:
    lines = []
    for step in range(10, total + 1, 10):
        record = {"step": step, "lr": 1e-3 * (1 - step / (2 * total)), "updates_per_s": 40.0 + step % 7}
        record.update({k: f(step) for k, f in keys.items()})
        record.update({"data_share": 0.1, "step_share": 0.7, "eval_share": 0.05, "checkpoint_share": 0.02})
        lines.append(record)
        if step % 40 == 0:
            lines.append({"step": step, **{k: f(step) for k, f in val_keys.items()}})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def _write(run: Path, model: dict, total: int, evaluation: dict, best: str) -> None:
    (run / "config.yaml").write_text(
        json.dumps({"model": model, "train": {"total_updates": total}, "checkpoint": {"best_metric": best}})
    )
    (run / "chain.json").write_text(json.dumps(_hops(total // 2, total)))
    summary = {"status": "finished", "reason": "finished", "step": total, "total_updates": total, "hops": 2,
               "run_goodput": 0.8, "run_wall_seconds": 200.0, "best": 0.5}  # fmt: skip
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "evaluate.json").write_text(json.dumps(muon_eval.clean(evaluation)))


EVENTS = 2000  # enough for most bins of every feature to be judged (100 true values)
OLD_FEATURES = ("multiplicity", "energy", "lateral_distance")  # what evaluate.json held before "quality"


def muon_run(run: Path, total: int = 120, legacy: bool = False) -> Path:
    """A muon run whose "model" is a truth sample for the same primaries with every muon energy doubled: the
    energy fails the goal in every judged bin, the other features are at the floor (up to chance). `legacy`:
    evaluate.json as written before the judged table (no "quality"; histograms of the old three features
    only, without W1/KS in them)."""
    run.mkdir(parents=True)
    keys = {
        "loss": lambda s: -1 / s,
        "loss_mean": lambda s: -1.1 / s,
        "generator_loss": lambda s: 0.5 + 1 / s,
        "wasserstein": lambda s: 3 / math.sqrt(s),
        "gradient_penalty": lambda s: 0.1 + 1 / s,
        "multiplicity_nll": lambda s: 2 + 10 / s,
        "grad_norm_critic": lambda s: 5.0 + 1 / s,
        "grad_norm_generator": lambda s: 3.0 + 1 / s,
        "events_per_s": lambda s: 1000.0,
        "samples_per_s": lambda s: 1000.0,
        "muons_per_s": lambda s: 80000.0,
    }
    val = {"val_wasserstein": lambda s: 2.5 / math.sqrt(s), "val_multiplicity_nll": lambda s: 2 + 9 / s}
    _metrics(run, keys, val, total)
    true, draws, reference, clamped = muon_eval.reference_samples(EVENTS, 1, 2000, None)
    other, floor = draws[0], draws[1:]  # a truth sample for the same primaries stands in for a model
    generated = layouts.Events(other.primaries, other.muons * np.float32([2, 1, 1]), other.counts, other.ids)
    evaluation = muon_eval.compare(generated, true)
    evaluation["distributions"] = muon_eval.distributions(generated, true)
    evaluation["binned"] = muon_eval.binned(generated, true)
    if legacy:
        evaluation["distributions"] = {
            name: {k: v for k, v in spec.items() if k not in ("w1", "ks")}
            for name, spec in evaluation["distributions"].items()
            if name in OLD_FEATURES
        }
        for panel in [*evaluation["binned"]["energy"], *evaluation["binned"]["zenith"]]:
            panel["features"] = {name: panel["features"][name] for name in OLD_FEATURES}
    else:
        evaluation["quality"] = quality.quality(generated, true, floor, reference)
    evaluation["info"] = {"step": total, "events": EVENTS, "units": "W1 in log10 units", "muon_cap": 2000,
                          "truth_events_clamped_at_cap": clamped, "source": "synthetic truth v1"}  # fmt: skip
    _write(run, {"type": "muon_wgan"}, total, evaluation, "val_multiplicity_nll")
    return run


def fields_run(run: Path, total: int = 120) -> Path:
    run.mkdir(parents=True)
    keys = {"loss": lambda s: -1 + 1 / s, "loss_mean": lambda s: -1 + 1.1 / s, "mse_scaled": lambda s: 1 / s}
    val = {"val_loss": lambda s: -1 + 1.2 / s, "val_r2_omega_m": lambda s: 1 - 10 / s,
           "val_r2_sigma_8": lambda s: 1 - 20 / s, "val_rmse_omega_m": lambda s: 0.1 / math.sqrt(s),
           "val_rmse_sigma_8": lambda s: 0.2 / math.sqrt(s), "val_r2_mean": lambda s: 1 - 15 / s}  # fmt: skip
    _metrics(run, keys, val, total)
    rng = np.random.default_rng(0)
    evaluation: dict = {
        "metrics": {},
        "predictions": {},
        "info": {"maps": 200, "split": "test", "step": total},
    }
    for name, (lo, hi, noise) in {"omega_m": (0.1, 0.5, 0.03), "sigma_8": (0.6, 1.0, 0.06)}.items():
        true = rng.uniform(lo, hi, 200)
        pred = true + rng.normal(0, noise, 200)
        residual = pred - true
        evaluation["predictions"][name] = {
            "true": true.tolist(), "predicted": pred.tolist(), "sigma": [noise] * 200
        }  # fmt: skip
        evaluation["metrics"][f"r2_{name}"] = 1 - np.sum(residual**2) / np.sum((true - true.mean()) ** 2)
        evaluation["metrics"][f"residual_std_{name}"] = float(residual.std())
    _write(run, {"type": "field_cnn", "loss": "gaussian_nll"}, total, evaluation, "val_r2_omega_m")
    return run
