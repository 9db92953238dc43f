"""The classifier two-sample test in `hpctrain report`: evaluate.json's "two_sample" (two_sample.py), the AUC
overall and per primary-energy bin beside its null band, as a figure (`classifier_auc.png`) and a table. No
torch: runs on a login node.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hpctrain.track.report import Image, RunData, Table
from hpctrain.track.report.panels import figure, fmt
from hpctrain.workloads.muons.evaluation import verdict
from hpctrain.workloads.muons.evaluation.two_sample import LEGEND, NULL_SIGMAS, verdict_word


def _num(value: Any) -> float:
    return float("nan") if value is None else float(value)


def _null_name(judged: dict[str, Any]) -> str:
    return "truth vs truth" if judged.get("null_source") == "truth" else "labels swapped within pairs"


def classifier_panels(data: RunData) -> list[Image]:
    """The AUC per bin (points) over its null band (grey: from 0.5 to the band's upper edge, the replicates'
    mean marked); bins whose AUC is above the band in red. None without "two_sample"."""
    judged = data.evaluation.get("two_sample")
    if not judged:
        return []
    rows = judged["table"]
    x = np.arange(len(rows))
    auc = np.array([_num(r["auc"]) for r in rows])
    upper = np.array([_num(r["null_upper"]) for r in rows])
    mean = np.array([_num(r["null_mean"]) for r in rows])
    differs = np.array([r["within_null"] is False for r in rows])
    fig, axes = figure(760, 380)
    ax = axes[0, 0]
    ax.bar(x, upper - 0.5, bottom=0.5, width=0.6, color="0.85", label=f"null band ({_null_name(judged)})")
    ax.plot(x, mean, "_", color="0.35", markersize=18, mew=2, label="null replicates' mean")
    ax.axhline(0.5, color="0.5", linewidth=0.8, linestyle="--")
    ax.plot(x[~differs], auc[~differs], "o", color="tab:green", markersize=7, label="AUC within the band")
    ax.plot(x[differs], auc[differs], "X", color="darkred", markersize=9, label="AUC above the band")
    for i, r in enumerate(rows):
        ax.annotate(f"{r['events']} pairs", (i, 0.5), xytext=(0, -14), textcoords="offset points",
                    ha="center", fontsize=7, color="0.4")  # fmt: skip
    finite = np.concatenate([auc[np.isfinite(auc)], upper[np.isfinite(upper)], [0.5]])
    ax.set_ylim(min(0.45, float(finite.min()) - 0.02), max(0.6, float(finite.max()) + 0.03))
    labels = ["all" if r["bin"] == "all" else r["bin"][1:] for r in rows]
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_xlabel("primary-energy bin [log10 E/GeV]")
    ax.set_ylabel("classifier AUC (true vs generated)")
    ax.set_title("AUC per primary-energy bin beside its null band", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", framealpha=0.9)
    verdict = "within the null band" if judged.get("accepted") else "NOT within the null band"
    fig.suptitle(f"classifier two-sample test: AUC {fmt(_num(judged['auc']))}, {verdict}", fontsize=10)
    return [
        Image(
            "classifier_auc",
            f"Cross-validated AUC ({judged.get('folds')} folds) of a gradient-boosted classifier telling a true "
            f"bundle from the generated one for the same primary, from per-event features, overall and per "
            f"primary-energy bin; grey: the null band (0.5 up to the largest of {judged['null_replicates']} "
            f"replicate(s), {_null_name(judged)}, and at least 0.5 + {NULL_SIGMAS:g} sigma). 0.5: the "
            "classifier cannot tell them apart.",
            fig,
        )
    ]


def classifier_table(data: RunData) -> list[Table]:
    """The AUC per bin beside its null band, and FPD/KPD beside their null values."""
    judged = data.evaluation.get("two_sample")
    if not judged:
        return []
    smoke = verdict.is_smoke(data.evaluation)
    rows = [
        [r["bin"], r["events"], fmt(_num(r["auc"])), fmt(_num(r["null_mean"])), fmt(_num(r["null_upper"])),
         verdict_word(r["within_null"], smoke)]
        for r in judged["table"]
    ]  # fmt: skip
    note = (
        f"Null: {judged['null_replicates']} replicate(s), {_null_name(judged)}; the band's upper edge is the "
        f"largest replicate AUC and at least 0.5 + {NULL_SIGMAS:g} Mann-Whitney sigma. FPD "
        f"{fmt(_num(judged['fpd']))} (null {fmt(_num(judged['fpd_null']))}), KPD {fmt(_num(judged['kpd']))} "
        f"(null {fmt(_num(judged['kpd_null']))}) on the standardised features with the primary."
    )
    header = ["bin", "pairs", "AUC", "null mean", "null upper", "verdict"]
    legend = LEGEND + ([verdict.SMOKE_LEGEND] if smoke else [])
    title = "Classifier two-sample test per primary-energy bin" + (" (smoke check)" if smoke else "")
    return [Table(title, header, rows, note, legend=legend)]
