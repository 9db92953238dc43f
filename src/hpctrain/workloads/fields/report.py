"""What `hpctrain report` adds for fields runs: R², RMSE and predicted sigma per parameter by meaning, and the
predicted vs true scatter per parameter with R² and the residual spread (from evaluate.json's "predictions",
written by fields/evaluate.py). No torch: runs on a login node."""

from __future__ import annotations

import numpy as np

from hpctrain.track.report import Image, RunData, ScalarGroup, Table, WorkloadReport
from hpctrain.track.report.panels import figure, fmt

SYMBOL = {"omega_m": "Ω_m", "sigma_8": "σ_8"}


def groups(data: RunData) -> list[ScalarGroup]:
    keys = data.scalar_keys()

    def like(prefix: str) -> tuple[str, ...]:
        return tuple(k for k in keys if k.startswith(prefix))

    loss = (data.config.get("model") or {}).get("loss", "loss")
    return [
        ScalarGroup(
            f"loss ({loss}, scaled targets)", ("loss_mean", "loss", "val_loss"), "loss [scaled units]"
        ),
        ScalarGroup("mean squared error (scaled targets)", ("mse_scaled",), "MSE [scaled units²]"),
        ScalarGroup("validation R² per parameter", like("val_r2_"), "R² [1]"),
        ScalarGroup("validation RMSE per parameter", like("val_rmse_"), "RMSE [parameter units]"),
        ScalarGroup("predicted σ per parameter (validation)", like("val_sigma_"), "σ [parameter units]"),
    ]


def scatter_panels(data: RunData) -> list[Image]:
    predictions = data.evaluation.get("predictions") or {}
    if not predictions:
        return []
    names = list(predictions)
    fig, axes = figure(480 * len(names) + 40, 620, 2, len(names), height_ratios=[3, 1])
    metrics = data.evaluation.get("metrics", {})
    for col, name in enumerate(names):
        spec = predictions[name]
        true, pred = np.asarray(spec["true"], float), np.asarray(spec["predicted"], float)
        sigma = np.asarray(spec["sigma"], float) if spec.get("sigma") else None
        ax, res = axes[0, col], axes[1, col]
        symbol = SYMBOL.get(name, name)
        ax.errorbar(
            true, pred, yerr=sigma, fmt="o", markersize=2, alpha=0.5, elinewidth=0.4, color="tab:blue"
        )
        lo, hi = float(min(true.min(), pred.min())), float(max(true.max(), pred.max()))
        ax.plot([lo, hi], [lo, hi], "k-", linewidth=0.8, label="predicted = true")
        residual = pred - true
        text = f"R² {fmt(metrics.get(f'r2_{name}'))}\nresidual σ {fmt(float(residual.std()))}"
        text += f"\nbias {fmt(float(residual.mean()))}\n{len(true)} test maps"
        ax.text(0.03, 0.97, text, transform=ax.transAxes, va="top", fontsize=8,
                bbox={"facecolor": "white", "edgecolor": "0.8"})  # fmt: skip
        ax.set(title=f"{symbol}: predicted vs true", xlabel=f"true {symbol}", ylabel=f"predicted {symbol}")
        ax.set_aspect("equal", adjustable="datalim")
        res.plot(true, residual, "o", markersize=2, alpha=0.5, color="tab:blue")
        res.axhline(0.0, color="k", linewidth=0.8)
        for k in (-1, 1):
            res.axhline(k * residual.std(), color="tab:red", linestyle="--", linewidth=0.8)
        res.set(xlabel=f"true {symbol}", ylabel="predicted - true")
    fig.suptitle("Held-out test maps (error bars: the predicted σ; dashed: ±1 residual σ)")
    return [Image("predicted_vs_true", "Predicted vs true per parameter, residuals below.", fig)]


def parameter_table(data: RunData) -> list[Table]:
    metrics = data.evaluation.get("metrics", {})
    names = list(data.evaluation.get("predictions") or {})
    if not names:
        return []
    columns = ("r2", "rmse", "bias", "residual_std", "pull_std")
    rows = [[SYMBOL.get(n, n)] + [fmt(metrics.get(f"{c}_{n}")) for c in columns] for n in names]
    info = data.evaluation.get("info", {})
    return [
        Table(
            "Test maps per parameter",
            ["parameter", "R²", "RMSE", "bias", "residual σ", "pull σ (residual / predicted σ)"],
            rows,
            note=f"{info.get('maps')} {info.get('split')} maps, checkpoint at update {info.get('step')}",
        )
    ]


REPORT = WorkloadReport(
    groups=groups, panels=(scatter_panels,), tables=(parameter_table,), evaluation_table=False
)
