"""Panels every run gets: the logged scalars grouped by meaning (LR on its own axis), throughput, time shares,
and generated-vs-true plots of the distributions in evaluate.json."""

from __future__ import annotations

import re
import textwrap
from typing import Any

import numpy as np

from hpctrain.track.report.data import RunData
from hpctrain.track.report.labels import GPU_KEY, line_label, readable
from hpctrain.track.report.panels import (
    X_UPDATE,
    Image,
    ScalarGroup,
    figure,
    fmt,
    hop_axis,
    label_hops,
    legend_outside,
    log_if_wide,
    mark_hops,
)

SHARES = ("data", "step", "eval", "checkpoint")
RATES = {"samples_per_s": "samples/s", "events_per_s": "events/s", "muons_per_s": "muons/s"}
# Logged scalars drawn elsewhere (throughput, time shares, LR) or not over updates (evaluate's eval_* records).
NOT_CURVES = {"lr", "updates_per_s", "gpu_mem_peak_gb", "stage_wait_s", *RATES}


def is_curve(key: str) -> bool:
    return key not in NOT_CURVES and not key.endswith("_share") and not key.startswith("eval_")


def group_scalars(data: RunData, named: list[ScalarGroup]) -> list[ScalarGroup]:
    """Every logged scalar in one group: the workload's named groups first, then the loss, gradient norms, and
    one group per remaining key with its val_ twin."""
    keys = [k for k in data.scalar_keys() if is_curve(k)]
    groups: list[ScalarGroup] = []
    claimed: set[str] = set()

    def add(title: str, members: list[str], ylabel: str) -> None:
        present = [k for k in members if k in keys and k not in claimed]
        if present:
            groups.append(ScalarGroup(title, tuple(present), ylabel))
            claimed.update(present)

    for group in named:
        add(group.title, list(group.keys), group.ylabel)
    add("loss", ["loss_mean", "loss", "val_loss"], "loss [task units]")
    add("gradient norm (before clipping)", [k for k in keys if k.startswith("grad_norm")], "L2 norm")
    for key in keys:
        base = key.removeprefix("val_")
        title, ylabel = readable(base)
        add(title, _same_measure(base, keys) or [base, f"val_{base}"], ylabel)
    return groups


def _same_measure(key: str, keys: list[str]) -> list[str]:
    """For a GPU key, every GPU's key of the same measure: one axis for all GPUs (4 GPUs were 16 panels)."""
    gpu = GPU_KEY.fullmatch(key)
    if gpu is None:
        return []
    return [k for k in keys if (other := GPU_KEY.fullmatch(k)) and other["measure"] == gpu["measure"]]


def constant_value(data: RunData, group: ScalarGroup) -> float | None:
    """The one value every key of `group` had over the whole run (None if anything changed)."""
    values = np.concatenate([data.series(key)[1] for key in group.keys])
    return float(values[0]) if values.size and np.all(values == values[0]) else None


def plot_scalars(data: RunData, named: list[ScalarGroup]) -> Image:
    """The logged scalars in a grid of panels, two a row; a group that never changed (DataLoader workers at 0
    the whole run) gets no panel but a mention in one line under the title."""
    groups, constant = [], []
    for group in group_scalars(data, named):
        value = constant_value(data, group)
        if value is None:
            groups.append(group)
        else:
            unit = re.search(r"\[(.*)\]", group.ylabel)
            shown = f"{fmt(value)} {unit[1]}" if unit and unit[1] not in ("count", "1") else fmt(value)
            constant.append(f"{group.title} {shown}")
    cells = len(groups) + 1  # + the learning rate
    rows = (cells + 1) // 2
    title = f"{data.run_dir.name}: logged scalars by meaning (lines: where each job hop began)"
    caption = "Logged scalars grouped by meaning; the learning rate on its own axis."
    if constant:
        note = "the same over the whole run (no panel): " + "; ".join(constant)
        title += "\n" + textwrap.fill(note, 110)
        caption += f" Not drawn, {note}."
    # room for every line of the title (a long one pushed the x label off the figure)
    fig, axes = figure(1100, 60 + 250 * rows + 18 * title.count("\n"), rows, 2, sharex=True)
    flat = list(axes.flat)
    for ax, group in zip(flat, groups):
        for key in group.keys:
            steps, values = data.series(key)
            val = key.startswith("val_")
            ax.plot(steps, values, "o-" if val else "-", markersize=3, linewidth=1.0, label=line_label(key))
        log_if_wide(ax, [line.get_ydata() for line in ax.get_lines()])
        mark_hops(ax, data)
        ax.set(title=group.title, ylabel=group.ylabel)
        legend_outside(ax)
    lr_ax = flat[len(groups)]
    steps, values = data.series("lr")
    lr_ax.plot(steps, values, "-", color="tab:green", label="lr")
    mark_hops(lr_ax, data)
    lr_ax.set(title="learning rate", ylabel="learning rate [per update]")
    for ax in flat[cells:]:
        ax.set_visible(False)
    for column in (0, 1):  # the lowest panel of each column carries the x axis (its neighbour may be empty)
        for ax in flat[column:cells:2][-1:]:
            ax.xaxis.set_tick_params(labelbottom=True)
            ax.set_xlabel(X_UPDATE)
    fig.suptitle(title)
    left_out = label_hops(flat[0], data)  # last: it lays the figure out
    if left_out:
        caption += f" {left_out} hop labels left out where they would overprint (every hop: the hops table)."
    return Image("scalars", caption, fig)


def plot_throughput(data: RunData) -> Image:
    fig, axes = figure(1100, 330, 1, 3)
    upd, rates, per_hop = axes[0]
    steps, values = data.series("updates_per_s")
    upd.plot(steps, values, "-", label="updates/s")
    mark_hops(upd, data)
    upd.set(title="updates per second", xlabel=X_UPDATE, ylabel="updates/s [1/s]")
    drawn = []
    for key, label in RATES.items():
        steps, values = data.series(key)
        if steps.size and not (key == "samples_per_s" and data.series("events_per_s")[0].size):
            rates.plot(steps, values, "-", label=label)  # samples are events in the muon task: drawn once
            drawn.append(values)
    log_if_wide(rates, drawn, ratio=10)
    mark_hops(rates, data)
    rates.set(title="data throughput", xlabel=X_UPDATE, ylabel="items per second [1/s]")
    legend_outside(rates)
    means = data.per_hop_mean("updates_per_s")
    per_hop.bar(np.arange(1, len(means) + 1), np.nan_to_num(means), color="tab:blue")
    per_hop.set(title="mean updates/s per job hop", ylabel="updates/s [1/s]")
    hop_axis(per_hop, len(means))
    left_out = label_hops(upd, data)  # last: it lays the figure out
    caption = "Throughput over updates (own axes per unit) and per job hop."
    if left_out:
        caption += f" {left_out} hop labels left out where they would overprint (every hop: the hops table)."
    return Image("throughput", caption, fig)


def plot_time_shares(data: RunData) -> Image:
    fig, axes = figure(1100, 330, 1, 2)
    shares, walls = axes[0]
    names = np.arange(1, max(len(data.hops), 1) + 1)  # hops as `train` and `status` count them
    bottom = np.zeros(len(names))
    for kind in SHARES:
        per_hop = np.nan_to_num(data.per_hop_mean(f"{kind}_share")) * 100
        shares.bar(names, per_hop, bottom=bottom, label=f"{kind}")
        bottom += per_hop
    goodput = [hop.get("goodput") for hop in data.hops]
    if any(g is not None for g in goodput):
        shares.plot(
            names[: len(goodput)],
            [100 * g if g is not None else np.nan for g in goodput],
            "kD",
            label="goodput\n(train time / wall)",
        )
    shares.set(title="where the time went, per hop", ylabel="share of time [%]")
    hop_axis(shares, len(names))
    shares.set_ylim(0, 105)
    legend_outside(shares)
    wall = [max((h.get("end") or h.get("last_seen") or h["start"]) - h["start"], 0.0) for h in data.hops]
    train = [float(h.get("train_seconds") or 0.0) for h in data.hops]
    hop_names = names[: len(wall)]
    walls.bar(hop_names, train, color="tab:green", label="in training updates")
    walls.bar(
        hop_names, np.subtract(wall, train), bottom=train, color="0.7", label="other (start, eval, save)"
    )
    walls.set(title="wall time per hop", ylabel="seconds [s]")
    hop_axis(walls, len(names))
    legend_outside(walls)
    return Image("time_shares", "Time shares and goodput per job hop; wall time split per hop.", fig)


RATIO_TOP = 2.0  # the ratio panels' upper limit; a bin above it is drawn as a triangle at the top


def ratio_panel(
    ax: Any,
    ratio_ax: Any,
    edges: np.ndarray,
    true: np.ndarray,
    generated: np.ndarray,
    per_width: bool = False,
) -> int:
    """Counts of true (line, grey band: +-1 sigma) and generated (points) with Poisson errors, and generated /
    true below, on 0..2: a bin above 2 is a triangle at the top (label: how many), a bin with generated
    values where the truth has none (outside its support: no ratio) a cross at the top. The x range ends at
    the outermost bins holding anything. `per_width` divides by the bin width (for bins of unequal width on a
    linear scale). Returns how many bins were drawn at the top (either mark)."""
    centres = 0.5 * (edges[1:] + edges[:-1])
    scale = 1.0 / np.diff(edges) if per_width else np.ones(len(true))
    t, t_err, g, g_err = true * scale, np.sqrt(true) * scale, generated * scale, np.sqrt(generated) * scale
    floor = 0.5 * float(np.min(t[t > 0])) if np.any(t > 0) else 0.5
    ax.fill_between(
        edges, np.append(np.maximum(t - t_err, floor), floor), np.append(t + t_err, floor), step="post",
        color="0.8", linewidth=0,
    )  # fmt: skip
    ax.stairs(t, edges, color="k", linewidth=1.2, label="true")
    ax.errorbar(centres, g, yerr=g_err, fmt="o", markersize=2.5, color="tab:red", elinewidth=0.8,
                label="generated")  # fmt: skip
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = generated / true
        err = ratio * np.sqrt(1 / generated + 1 / true)
    ok = (true > 0) & (generated > 0)
    above = ok & (ratio > RATIO_TOP)
    inside = ok & ~above
    ratio_ax.errorbar(centres[inside], ratio[inside], yerr=err[inside], fmt="o", markersize=2.5,
                      color="tab:red", elinewidth=0.8)  # fmt: skip
    clipped = int(above.sum())
    if clipped:
        ratio_ax.plot(
            centres[above], np.full(clipped, 0.96 * RATIO_TOP), "^", markersize=4, color="tab:red",
            label=f"gen / true above {RATIO_TOP:g}: {clipped} bin{'s' if clipped > 1 else ''}",
        )  # fmt: skip
    outside = (true == 0) & (generated > 0)  # generated where the truth has nothing: shown above, and here
    if outside.any():
        count = int(outside.sum())
        ratio_ax.plot(
            centres[outside], np.full(count, 0.96 * RATIO_TOP), "x", markersize=5, mew=1.5, color="darkred",
            label=f"generated, none true: {count} bin{'s' if count > 1 else ''}",
        )  # fmt: skip
        clipped += count
    ratio_ax.axhline(1.0, color="k", linewidth=0.8)
    ratio_ax.set_ylim(0.0, RATIO_TOP)
    ratio_ax.set_ylabel("gen / true")
    if np.any(t > 0):
        ax.set_yscale("log")
        ax.set_ylim(bottom=floor)
    fit_x(ax, edges, true + generated)
    return clipped


def fit_x(ax: Any, edges: np.ndarray, counts: np.ndarray) -> None:
    """The x range from the first to the last bin holding anything (the histogram's fixed edges often run a
    decade or two past the data)."""
    held = np.flatnonzero(counts > 0)
    if held.size:
        left = edges[held[0]]
        if ax.get_xscale() == "log" and left <= 0:  # a first bin from 0: from its upper edge
            left = edges[held[0] + 1]
        ax.set_xlim(left, edges[held[-1] + 1])


def clip_note(clipped: int) -> str:
    """A title's mention of ratio bins drawn at the top (empty if none); the caption says which marks."""
    return f"{clipped} bin{'s' if clipped > 1 else ''} at the ratio's top" if clipped else ""


def plot_distributions(data: RunData) -> list[Image]:
    """One image per evaluate.json distribution: counts with error bars above, the ratio below."""
    images = []
    metrics = data.evaluation.get("metrics", {})
    for name, spec in sorted(data.evaluation.get("distributions", {}).items()):
        edges = np.asarray(spec["bins"], dtype=float)
        generated = np.asarray(spec["generated"], dtype=float)
        true = np.asarray(spec["true"], dtype=float)
        if not len(edges) == len(generated) + 1 == len(true) + 1:
            raise ValueError(f"evaluate.json: distribution {name!r} needs len(bins) == len(generated) + 1")
        fig, axes = figure(800, 480, 2, 1, sharex=True, height_ratios=[3, 1])
        ax, ratio_ax = axes[:, 0]
        if spec.get("log_x"):
            ax.set_xscale("log")
        ratio_panel(ax, ratio_ax, edges, true, generated)
        label, unit = spec.get("label", name.replace("_", " ")), spec.get("unit", "1")
        w1, ks = spec.get("w1", metrics.get(f"w1_{name}")), spec.get("ks", metrics.get(f"ks_{name}"))
        title = f"{label}: generated vs true, all events"
        if w1 is not None and ks is not None:  # in the title: a box in the axes covered the tail's points
            title += f"\npooled W1 {w1:.3g}   KS {ks:.3g}"
        ax.set(title=title, ylabel=spec.get("y_label", "count per bin"))
        ratio_ax.set_xlabel(f"{label} [{unit}]")
        legend_outside(ax)
        legend_outside(ratio_ax)  # the triangles' count, if any bin is above the ratio panel
        images.append(Image(f"dist_{name}", f"{label}: generated vs true over all events.", fig))
    return images
