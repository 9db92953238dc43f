"""The judged quality in `hpctrain report`: what evaluate.json's "quality" (quality.judge) says, per feature and
per bin of the primary (energy x zenith, energy x mass, energy x depth), never averaged over features or bins.

- `quality_bins_<feature>.png`: W1 of ours, the floor, the floor's tolerance (from its truth-vs-truth
  replicates), the goal (max(tolerance, 0.5 x baseline)) and the baseline in each of the bins, failing bins
  shaded red, bins not judged (too few true values) hatched; beside it the same bins as a map of ours / floor:
  a row per primary-energy bin, a column per zenith, mass-number and depth band.
- `quality_overview.png`: the ours / floor maps of every feature side by side, failing cells outlined.
- the table: per feature the means over judged bins (for reading) and the verdict (judged bin by bin).
No torch: runs on a login node.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from hpctrain.track.report import Image, RunData, Table
from hpctrain.track.report.panels import figure, fmt
from hpctrain.workloads.muons.evaluation import verdict
from hpctrain.workloads.muons.evaluation.quality import (
    BASELINE_FACTOR,
    MIN_VALUES,
    goal_word,
)
from hpctrain.workloads.muons.evaluation.quality_judge import LEGEND

LABELS = {  # feature -> what the axis says (the values are quality.features': log10 units)
    "multiplicity": "muons per event, log10(N+1)",
    "energy": "muon energy, log10(E/GeV)",
    "energy_tail": "muon energy in the top 1 %, log10(E/GeV)",
    "lateral_distance": "lateral distance, log10(r/m)",
    "energy_sum": "energy sum per event, log10(sum E/GeV)",
    "leading_energy": "leading muon energy, log10(E/GeV)",
    "leading_fraction": "leading muon's share, log10(E/sum E)",
    "leading_radius": "leading muon's lateral distance, log10(r/m)",
    "centre_radius": "radius of the bundle centre, log10(m)",
    "spread": "bundle spread (rms from centre), log10(m)",
}
# quality.bin_labels(): "E3-5/z0-30" (zenith, deg), "E3-5/A1-6" (mass number), "E3-5/d0-1600" (depth, m); older
# files have the zenith bands only
BIN = re.compile(r"E(?P<e>[^/]+)/(?P<c>[a-zA-Z]+.+)")
RATIO_RANGE = (0.5, 8.0)  # ours / floor on the maps' colour scale (1: as good as a truth sample)


def _num(value: Any) -> float:
    return float("nan") if value is None else float(value)


def _grid(rows: list[dict[str, Any]]) -> tuple[list[str], list[str], list[tuple[int, int]]]:
    """Energy ranges and the bands of the other views (in the order of the rows) and each row's (energy,
    band) cell."""
    energies: list[str] = []
    zeniths: list[str] = []  # the columns: zenith, mass-number and depth bands, e.g. "z0-30", "A1-6"
    cells = []
    for row in rows:
        found = BIN.fullmatch(row["bin"])
        if found is None:
            raise ValueError(f"quality bin {row['bin']!r} is not E<lo>-<hi>/<z|A|d><lo>-<hi>")
        e, z = found["e"], found["c"]
        energies += [e] if e not in energies else []
        zeniths += [z] if z not in zeniths else []
        cells.append((energies.index(e), zeniths.index(z)))
    return energies, zeniths, cells


def _series(rows: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    out = {k: np.array([_num(r[f"{k}_w1"]) for r in rows]) for k in ("ours", "floor", "baseline")}
    # older files: 2 x floor was the tolerance
    out["tolerance"] = np.array([_num(r.get("tolerance", 2 * _num(r["floor_w1"]))) for r in rows])
    out["goal"] = np.maximum(out["tolerance"], BASELINE_FACTOR * out["baseline"])
    out["judged"] = np.array([bool(r["judged"]) for r in rows])
    out["failed"] = np.array([bool(r["judged"]) and not r.get("ok", True) for r in rows])
    return out


def _verdict(name: str, feature: dict[str, Any], smoke: bool = False) -> str:
    met = f"goal {goal_word(feature, smoke)}"
    return f"{name}: {feature['bins_ok']}/{feature['bins_judged']} bins ok, {met}"


def _per_bin_axes(ax: Any, rows: list[dict[str, Any]]) -> None:
    """W1 per bin: ours, floor, its tolerance, goal, baseline; failing bins red, unjudged ones hatched."""
    energies, zeniths, cells = _grid(rows)
    s = _series(rows)
    x = np.arange(len(rows))
    for i in x:
        if s["failed"][i]:
            ax.axvspan(i - 0.5, i + 0.5, color="tab:red", alpha=0.18, linewidth=0)
        elif not s["judged"][i]:
            ax.axvspan(i - 0.5, i + 0.5, facecolor="none", edgecolor="0.75", hatch="///", linewidth=0)
    ax.plot(x, s["baseline"], "s-", color="tab:blue", markersize=4, linewidth=1, label="baseline")
    ax.step(
        x, s["goal"], where="mid", color="tab:green", linewidth=1.2, label="goal: max(tolerance, 0.5 base)"
    )
    ax.plot(x, s["tolerance"], "--", color="0.35", linewidth=1, label="floor's tolerance")
    ax.plot(x, s["floor"], "o-", color="0.55", markersize=3, linewidth=1, label="floor (truth vs truth)")
    ax.plot(x, s["ours"], "D", color="tab:red", markersize=5, label="ours")
    ax.plot(x[s["failed"]], s["ours"][s["failed"]], "x", color="darkred", markersize=11, mew=2,
            label="bin fails the goal")  # fmt: skip
    finite = np.concatenate([s[k][np.isfinite(s[k]) & (s[k] > 0)] for k in ("ours", "floor", "baseline")])
    if finite.size:
        ax.set_yscale("log")
        ax.set_ylim(finite.min() / 1.5, finite.max() * 1.5)
    ax.set_xticks(x, [zeniths[z] for _, z in cells], fontsize=6, rotation=90)
    for e, text in enumerate(energies):
        members = [i for i, (ei, _) in enumerate(cells) if ei == e]
        if members[0] > 0:
            ax.axvline(members[0] - 0.5, color="0.3", linewidth=0.8)
        ax.text(np.mean(members), 1.01, f"log10 E {text}", transform=ax.get_xaxis_transform(), ha="center",
                va="bottom", fontsize=8)  # fmt: skip
    ax.set_xlim(-0.5, len(rows) - 0.5)
    ax.set_xlabel("bin: zenith [deg] (z), mass number (A), depth [m] (d) bands within each energy bin")
    ax.set_ylabel("W1 [log10 units]")


def _ratio_map(ax: Any, rows: list[dict[str, Any]], fig: Any, colorbar: bool = True) -> None:
    """ours / floor on the energy x zenith grid; failing cells outlined red, unjudged ones grey."""
    from matplotlib.colors import LogNorm
    from matplotlib.patches import Rectangle

    energies, zeniths, cells = _grid(rows)
    s = _series(rows)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = s["ours"] / s["floor"]
    grid = np.full((len(energies), len(zeniths)), np.nan)
    for (e, z), r, judged in zip(cells, ratio, s["judged"]):
        grid[e, z] = r if judged else np.nan
    shown = np.ma.masked_invalid(np.clip(grid, *RATIO_RANGE))
    cmap = _cmap()
    image = ax.imshow(shown, cmap=cmap, norm=LogNorm(*RATIO_RANGE), origin="lower", aspect="auto")
    for (e, z), r, judged, failed in zip(cells, ratio, s["judged"], s["failed"]):
        text = f"{r:.2g}" if np.isfinite(r) else "-"
        ax.text(z, e, text if judged else f"({text})", ha="center", va="center", fontsize=7,
                color="0.4" if not judged else "k", fontweight="bold" if failed else "normal")  # fmt: skip
        if failed:
            ax.add_patch(
                Rectangle((z - 0.45, e - 0.45), 0.9, 0.9, fill=False, edgecolor="darkred", linewidth=2)
            )
    ax.set_xticks(range(len(zeniths)), zeniths, fontsize=7, rotation=90)  # flat, 10 bands overprinted
    ax.set_yticks(range(len(energies)), energies, fontsize=7)
    ax.set_xlabel("zenith [deg] (z), mass number (A), depth [m] (d)", fontsize=8)
    ax.set_ylabel("log10(E_primary / GeV)", fontsize=8)
    if colorbar:
        _ticks(fig.colorbar(image, ax=ax, fraction=0.08, pad=0.03), "ours / floor (W1)", 7)


def _ticks(bar: Any, label: str, size: int) -> None:
    """Plain ticks (0.5, 1, 2, 4, 8) on a colour bar of ours / floor."""
    ticks = [t for t in (0.5, 1.0, 2.0, 4.0, 8.0) if RATIO_RANGE[0] <= t <= RATIO_RANGE[1]]
    bar.set_ticks(ticks, labels=[f"{t:g}" for t in ticks], fontsize=size)
    bar.ax.minorticks_off()
    bar.set_label(label, fontsize=size)


def _cmap() -> Any:
    from matplotlib import colormaps

    return colormaps["RdYlGn_r"].with_extremes(bad="0.9")  # bad: bins not judged


def quality_panels(data: RunData) -> list[Image]:
    """One per-bin figure per judged feature and the overview of ours / floor maps (none without "quality")."""
    features = (data.evaluation.get("quality") or {}).get("features") or {}
    smoke = verdict.is_smoke(data.evaluation)
    images = []
    for name, feature in features.items():
        rows = feature["bins"]
        fig, axes = figure(1100, 420, 1, 2, width_ratios=[3, 1])
        _per_bin_axes(axes[0, 0], rows)
        # under the axes: inside, it covered the highest W1 points
        axes[0, 0].legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncols=6, frameon=False,
                          handlelength=1.6)  # fmt: skip
        _ratio_map(axes[0, 1], rows, fig)
        axes[0, 1].set_title("ours / floor per bin", fontsize=9)
        fig.suptitle(f"{_verdict(name, feature, smoke)}  [{LABELS.get(name, name)}]", fontsize=10)
        images.append(
            Image(
                f"quality_bins_{name}",
                f"{name}: W1 per bin of primary energy x zenith, mass and depth; ours (red) against the floor "
                f"(two truth samples), its tolerance (from its replicates), the goal and the baseline (the "
                f"nearest primary's bundle); red bins fail the goal, hatched bins have too few true values "
                f"(at least {MIN_VALUES}; shown, not judged). Right: ours / floor per bin.",
                fig,
            )
        )
    if features:
        images.insert(0, _overview(features, smoke))
    return images


def _overview(features: dict[str, Any], smoke: bool) -> Image:
    cols = min(len(features), 3)
    rows = (len(features) + cols - 1) // cols
    fig, axes = figure(360 * cols + 60, 60 + 290 * rows, rows, cols)
    for ax, (name, feature) in zip(axes.flat, features.items()):
        _ratio_map(ax, feature["bins"], fig, colorbar=False)
        ax.set_title(
            _verdict(name, feature, smoke), fontsize=9, color="k" if feature["goal_met"] else "darkred"
        )
    for ax in list(axes.flat)[len(features) :]:
        ax.set_visible(False)
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import LogNorm

    bar = fig.colorbar(ScalarMappable(LogNorm(*RATIO_RANGE), _cmap()), ax=axes, fraction=0.03, pad=0.02)
    _ticks(bar, "ours / floor (W1)", 9)
    fig.suptitle("W1 of ours / floor per bin and feature (outlined red: fails the goal; grey: not judged)")
    return Image(
        "quality_overview",
        "Every feature's ours / floor W1 per bin of primary energy x zenith, mass and depth (1: as good as a "
        "second truth sample); outlined cells fail the goal, grey cells have too few true values to be judged.",
        fig,
    )


def quality_table(data: RunData) -> list[Table]:
    """evaluate.json's judged table: per feature, means over judged bins for reading, the verdict per bin; a
    table of too few events is titled a smoke check (verdict.py) and never says met."""
    judged = data.evaluation.get("quality") or {}
    features = judged.get("features") or {}
    if not features:
        return []
    smoke = verdict.is_smoke(data.evaluation)
    rows = [
        [name, *(fmt(_num(f[k])) for k in ("ours_w1", "baseline_w1", "floor_w1", "ours_ks", "baseline_ks",
                                            "floor_ks")),
         fmt(f.get("ratio")), f"{f['bins_ok']}/{f['bins_judged']}", goal_word(f, smoke)]
        for name, f in features.items()
    ]  # fmt: skip
    met = "smoke ok" if smoke else "goal met"
    note = (
        f"{met} for {judged.get('features_goal_met')} of {len(features)} features; within the floor: "
        f"{judged.get('features_within_floor')}; min_feature_ratio {fmt(judged.get('min_feature_ratio'))}."
    )
    if smoke:
        note = verdict.smoke_line(data.evaluation, f"`hpctrain evaluate {data.run_dir}`") + " " + note
    # the console's column names (quality_judge.table), which LEGEND explains
    header = ["feature", "ours W1", "base W1", "floor W1", "ours KS", "base KS", "floor KS", "base/ours",
              "bins ok", "goal"]  # fmt: skip
    word = "smoke check" if smoke else ("goal met" if judged.get("goal_met") else "goal NOT met")
    legend = LEGEND + ([verdict.SMOKE_LEGEND] if smoke else [])
    # bin means, named apart from the pooled W1 of the evaluation table (all events together)
    groups = [("", 1), ("mean over the judged bins", 6), ("", 3)]
    return [Table(f"Judged quality per feature ({word})", header, rows, note, groups, legend=legend)]
