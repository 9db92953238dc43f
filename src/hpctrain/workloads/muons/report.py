"""What `hpctrain report` adds for muon runs: the judged quality per feature and bin (quality_report.py), the
classifier test's AUC per energy bin beside its null band (classifier_report.py), each model type's scalars by
meaning (its loss titled by what it is: a flow has no critic), generated vs true per primary-energy bin and per
zenith band for every judged feature (from evaluate.json's "binned", written by `hpctrain evaluate`) with ratio
panels and W1/KS over each, and the per-bin figures as pivot tables. No torch: runs on a login node."""

from __future__ import annotations

from typing import Any

import numpy as np

from hpctrain.track.report import Image, RunData, ScalarGroup, Table, WorkloadReport
from hpctrain.track.report.generic import RATIO_TOP, clip_note, ratio_panel
from hpctrain.track.report.panels import figure, fmt, legend_outside
from hpctrain.workloads.muons.evaluation.cap_note import cap_table
from hpctrain.workloads.muons.evaluation.classifier_report import classifier_panels, classifier_table
from hpctrain.workloads.muons.evaluation.quality_report import quality_panels, quality_table
from hpctrain.workloads.muons.evaluation.two_sample import ENERGY_BINS_LOG10_GEV, bin_label

FEATURES = {  # name -> (axis label, unit)
    "multiplicity": ("muons per event", "count"),
    "energy": ("muon energy", "GeV"),
    "lateral_distance": ("lateral distance", "m"),
    "energy_sum": ("energy sum", "GeV"),  # per event
    "leading_energy": ("leading muon energy", "GeV"),  # the highest muon energy, per event
    "leading_fraction": ("leading muon share", "fraction"),  # of the energy sum, per event with 2+ muons
    "leading_radius": ("leading muon distance", "m"),  # from the axis, per event with 2+ muons
    "centre_radius": ("centre radius", "m"),  # of the bundle's centre from the axis, per event
    "spread": ("spread", "m"),  # rms distance of the muons from the bundle's centre, per event
}
PER_MUON = ("energy", "lateral_distance")  # one value per muon; the others one per event
BY = {"energy": ("log10(E_primary / GeV)", "primary-energy bin"), "zenith": ("zenith [deg]", "zenith band")}


# The judge at each evaluation of a generator (evaluation/val_judge.py): its AUC overall and per energy bin beside
# the band a perfect generator stays under, then its feature-cloud distances
JUDGE = [
    ScalarGroup(
        "classifier AUC at each evaluation (0.5: indistinguishable)",
        (
            "val_auc",
            *(f"val_auc_{bin_label(i)}" for i in range(len(ENERGY_BINS_LOG10_GEV) - 1)),
            "val_auc_null_upper",
        ),
        "AUC, true vs generated",
    ),
    ScalarGroup("FPD and KPD at each evaluation", ("val_fpd", "val_kpd"), "distance [standardised features]"),
]


def groups(data: RunData) -> list[ScalarGroup]:
    """The model's own scalars by what they are: each model type's loss titled by what it measures; a
    generator's judge at each evaluation first."""
    nll = ScalarGroup(
        "multiplicity NLL", ("multiplicity_nll", "val_multiplicity_nll"), "NLL per event [nats]"
    )
    if data.model_type == "muon_multiplicity":
        return [ScalarGroup("multiplicity NLL", ("loss_mean", "loss", "val_loss"), "NLL per event [nats]")]
    if data.model_type == "muon_flow":  # trained by likelihood: no critic
        return [
            *JUDGE,
            ScalarGroup(
                "loss: negative log-likelihood (multiplicity + muons)",
                ("loss_mean", "loss", "val_loss"),
                "NLL [nats]",
            ),
            ScalarGroup("muon NLL (the flow)", ("muon_nll", "val_muon_nll"), "NLL per muon [nats]"),
            nll,
        ]
    return [
        *JUDGE,
        ScalarGroup("generator loss", ("generator_loss",), "-E[D(fake)] [critic units]"),
        ScalarGroup(
            "critic loss (E[D(fake)] - E[D(real)] + GP)", ("loss_mean", "loss"), "critic loss [critic units]"
        ),
        ScalarGroup("Wasserstein estimate", ("wasserstein", "val_wasserstein"), "E[D(real)] - E[D(fake)]"),
        ScalarGroup("gradient penalty", ("gradient_penalty",), "penalty [critic units]"),
        nll,
    ]


def _range_text(by: str, lo: float, hi: float) -> str:
    return f"log10 E/GeV {lo:g}-{hi:g}" if by == "energy" else f"zenith {lo:g}-{hi:g} deg"


def _feature_image(by: str, name: str, panels: list[dict[str, Any]]) -> Image:
    label, unit = FEATURES.get(name, (name.replace("_", " "), "1"))
    cols = len(panels)
    width = 230 * cols + 130
    # each column its own x range (sharex="col"): the low-energy bins' data end decades before the high ones'
    fig, axes = figure(width, 480, 2, cols, layout=None, sharex="col", height_ratios=[3, 1])
    fig.subplots_adjust(
        left=70 / width, right=1 - 110 / width, bottom=0.11, top=0.78, wspace=0.32, hspace=0.06
    )
    clipped_any = 0
    for col, panel in enumerate(panels):
        ax, ratio_ax = axes[0, col], axes[1, col]
        spec = panel["features"][name]
        edges = np.asarray(spec["edges"], dtype=float)
        true, generated = np.asarray(spec["true"], float), np.asarray(spec["generated"], float)
        if name == "multiplicity":
            ax.set_xscale("symlog", linthresh=20, linscale=1.5)  # integers to 20 linear, log-spaced above
        else:
            ax.set_xscale("log")
        clipped = ratio_panel(ax, ratio_ax, edges, true, generated, per_width=name == "multiplicity")
        clipped_any += clipped
        # W1/KS and the clipped ratios in the title: a box in the axes covered the low counts' points
        figures = f"W1 {fmt(spec.get('w1'))}  KS {fmt(spec.get('ks'))}"
        note = clip_note(clipped)
        ax.set_title(
            f"{_range_text(by, *panel['range'])}, {panel['events_true']} true events\n{figures}"
            + (f"\n{note}" if note else ""),
            fontsize=8,
        )
        ratio_ax.set_xlabel(f"{label} [{unit}]")
        if col == 0:
            ax.set_ylabel(
                "muons per bin" if name in PER_MUON else "events per unit N" if name == "multiplicity" else
                "events per bin"
            )  # fmt: skip
        else:
            ratio_ax.set_ylabel("")
    legend_outside(axes[0, -1])
    fig.suptitle(f"{label}: generated vs true per {BY[by][1]} (error bars: Poisson; W1 in log10 units)")
    caption = f"{label}: generated (points) vs true (line, grey band) per {BY[by][1]}."
    if clipped_any:
        caption += f" Triangles: bins whose generated / true is above {RATIO_TOP:g} (drawn at the top)."
    return Image(f"{by}_bins_{name}", caption, fig)


def binned_panels(data: RunData) -> list[Image]:
    binned = data.evaluation.get("binned", {})
    images = []
    for by in BY:
        panels = binned.get(by) or []
        names = [n for n in FEATURES if panels and n in panels[0]["features"]]
        images += [_feature_image(by, name, panels) for name in names]
    return images


def pivot_tables(data: RunData) -> list[Table]:
    """W1 and KS per bin (rows) and feature (columns), for primary-energy bins and zenith bands."""
    tables = []
    binned = data.evaluation.get("binned", {})
    for by, (axis, what) in BY.items():
        panels = binned.get(by) or []
        if not panels:
            continue
        names = [n for n in FEATURES if n in panels[0]["features"]]
        rows = [
            [f"{p['range'][0]:g} - {p['range'][1]:g}", p["events_true"], p["events_generated"]]
            + [fmt(p["features"][n].get(k)) for n in names for k in ("w1", "ks")]
            for p in panels
        ]
        tables.append(
            Table(
                f"Generated vs true per {what}",
                [axis, "true events", "generated events"] + ["W1", "KS"] * len(names),
                rows,
                note="W1 in log10(N+1), log10(E/GeV), log10(r/m); KS: the largest CDF difference.",
                header_groups=[("", 3)] + [(FEATURES[n][0], 2) for n in names],
            )
        )
    return tables


# What the judgements say first (evaluate.json's "quality" and "two_sample"), then the histograms behind them.
REPORT = WorkloadReport(
    groups=groups,
    panels=(quality_panels, classifier_panels, binned_panels),
    tables=(quality_table, classifier_table, cap_table, pivot_tables),
)
