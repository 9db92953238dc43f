"""What `hpctrain report` adds for muon runs: the judged quality per feature and bin (quality_report.py), the
classifier test's AUC per energy bin beside its null band (classifier_report.py), each model type's scalars by
meaning (its loss titled by what it is: a flow has no critic), generated vs true per primary-energy bin and per
zenith band for every judged feature (from evaluate.json's "binned", written by `hpctrain evaluate`) with ratio
panels and W1/KS over each, and the per-bin figures as pivot tables. No torch: runs on a login node."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from hpctrain.track.report import Image, RunData, ScalarGroup, Table, WorkloadReport
from hpctrain.track.report.generic import RATIO_TOP, clip_note, ratio_panel
from hpctrain.track.report.panels import Panel, figure, fmt, legend_outside
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


COUNT_TICKS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000)


def _count_ticks(ax: Any) -> None:
    """Whole muon counts as ticks of a symlog axis, as many as fit apart at its width: matplotlib's own put
    -5x10^-1 beside 0 (the first bin begins at -0.5)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    low, high = ax.get_xlim()
    kept: list[float] = []
    for tick in (t for t in COUNT_TICKS if low <= t <= high):
        room = 7.0 * len(str(tick)) + 10.0  # pixels a label needs, with a gap
        x = ax.transData.transform((tick, 0))[0]
        if not kept or x - ax.transData.transform((kept[-1], 0))[0] >= room:
            kept.append(tick)
    ax.xaxis.set_major_locator(FixedLocator(kept))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.xaxis.set_minor_locator(NullLocator())


def _feature_image(by: str, name: str, panels: list[dict[str, Any]]) -> Image:
    label, unit = FEATURES.get(name, (name.replace("_", " "), "1"))
    cols = len(panels)
    width = 220 * cols + 130  # five bins: 1230 px, shown at 90 % or more in a 1200-pixel window
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
        if name == "multiplicity":
            _count_ticks(ratio_ax)
        clipped_any += clipped
        # W1/KS and the clipped ratios in the title: a box in the axes covered the low counts' points
        figures = f"W1 {fmt(spec.get('w1'))}  KS {fmt(spec.get('ks'))}"
        note = clip_note(clipped)
        ax.set_title(  # short lines: a column is ~170 px wide, its title must not reach the next one's
            f"{_range_text(by, *panel['range'])}\n{panel['events_true']} true events\n{figures}"
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
        caption += (
            f" At the top of the ratio panels, triangles: bins whose generated / true is above {RATIO_TOP:g}; "
            "crosses: bins with generated values where the truth has none."
        )
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


POOLED = {  # figures.compare's features: what its pooled W1 is measured on
    "multiplicity": "log10(N+1) of the muons per event",
    "energy": "log10(E/GeV) of every muon",
    "lateral_distance": "log10(r/m) of every muon's distance from the axis",
}
EXPLAINED = {
    "conditional_w1": "mean of the pooled W1 of multiplicity, energy and lateral distance over the primary-energy "
    "bins with 20+ true values",
    "min_feature_ratio": "the smallest baseline/ours W1 over the judged features (> 1: ours beats looking up "
    "the nearest simulated primary's bundle)",
    "features_within_floor": "judged features whose every bin is within the floor's tolerance (as good as a "
    "second truth sample)",
    "features_goal_met": "judged features that meet the goal in every bin and over all bins together",
    "auc": "the classifier test's AUC over all events (0.5: it cannot tell generated from true bundles)",
    "auc_null_upper": "the upper edge of the AUC's null band (truth vs truth): above it, the classifier "
    "tells them apart",
    "fpd": "Fréchet distance of the standardised per-event features with the primary, generated vs true",
    "kpd": "kernel (polynomial MMD) distance of the same, generated vs true",
    "fpd_null": "the Fréchet distance between two truth samples: what no difference looks like",
    "kpd_null": "the kernel distance between two truth samples (about 0 or below: no difference)",
}


def explain(key: str) -> str:
    """What an evaluate.json figure of a muon model is (the report's evaluation table)."""
    for prefix, what in (("w1_", "Wasserstein-1 distance"), ("ks_", "Kolmogorov-Smirnov statistic")):
        name = key.removeprefix(prefix)
        if key.startswith(prefix) and name in POOLED:
            units = " (in those log10 units)" if prefix == "w1_" else ""
            return f"pooled {what}{units}, generated vs true, all events together: {POOLED[name]}"
    return EXPLAINED.get(key, "")


def _under(section: str, panel: Panel) -> Panel:
    """`panel`'s images under `section` on the page."""
    return lambda data: [replace(image, section=section) for image in panel(data)]


# After the distributions over all events (the generic part draws them first): the same per bin, then what the
# judges say of them (evaluate.json's "quality" and "two_sample").
REPORT = WorkloadReport(
    groups=groups,
    panels=(
        _under("Generated vs true per primary-energy bin and zenith band", binned_panels),
        _under(
            "Judged quality per feature and bin (ours against the floor and the baseline)", quality_panels
        ),
        _under("The classifier two-sample test", classifier_panels),
    ),
    tables=(quality_table, classifier_table, cap_table, pivot_tables),
    explain=explain,
)
