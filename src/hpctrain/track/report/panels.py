"""The report's building blocks: figures without pyplot, hop markers, and what a workload hands in.

A workload adds its own plots and tables with one `WorkloadReport` (its `report.py`, handed over by its
verbs.py as `Verbs.report`): scalar groups that name its logged keys by meaning, panels that draw figures from the run
(often from its evaluate.json), and tables. The generic part (this package) never imports a workload.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from hpctrain.track.chain import changes_text, hop_number
from hpctrain.track.report.data import RunData

DPI = 100
X_UPDATE = "update [optimizer steps]"


@dataclass
class Image:
    """One PNG of the report: `<name>.png`, a caption under it, and its matplotlib figure."""

    name: str
    caption: str
    figure: Any


@dataclass(frozen=True)
class ScalarGroup:
    """Logged scalars that mean one thing, drawn on one axis: train and val_ variants of a key together."""

    title: str
    keys: tuple[str, ...]
    ylabel: str = "value"


@dataclass(frozen=True)
class Table:
    title: str
    header: list[str]
    rows: list[list[Any]]
    note: str = ""
    # A header row above `header` for a pivot table: (name, columns spanned), e.g. [("", 2), ("energy", 2)].
    header_groups: list[tuple[str, int]] = field(default_factory=list)


Panel = Callable[[RunData], list[Image]]
TableMaker = Callable[[RunData], list[Table]]


@dataclass(frozen=True)
class WorkloadReport:
    """What one workload adds to the report (see the module docstring)."""

    groups: Callable[[RunData], list[ScalarGroup]] = lambda data: []
    panels: Sequence[Panel] = field(default_factory=tuple)
    tables: Sequence[TableMaker] = field(default_factory=tuple)
    # evaluate.json's "metrics" as a generic table (off when the workload's own tables show them better)
    evaluation_table: bool = True


NO_WORKLOAD = WorkloadReport()


def figure(
    width: float,
    height: float,
    rows: int = 1,
    cols: int = 1,
    layout: Literal["constrained"] | None = "constrained",
    **kwargs: Any,
) -> tuple[Any, Any]:
    """A Figure with its own Agg canvas (no pyplot global state, no display needed on a login node), sized in
    pixels at DPI, and its axes as a 2-D array (rows, cols). `layout=None` for wide grids: constrained layout
    costs a second per figure there; place them with fig.subplots_adjust instead."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width / DPI, height / DPI), dpi=DPI, layout=layout)
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False, **kwargs)
    return fig, axes


LABEL_SPACING = 0.2  # hop labels closer than this share of the x range go a row lower (they would overprint)
LABEL_ROWS = 4


def mark_hops(ax: Any, data: RunData, labels: bool = True) -> None:
    """A line where each hop began: red (solid) where the hop accepted identity changes with
    checkpoint.accept_changes (another configuration), purple where only keys that may change did, grey else;
    with `labels`, the hop (numbered from 1, as `train` and `status` count), its job and how many keys changed
    are written beside the line, a row lower than the previous label where they would overprint."""
    low, high = ax.dataLim.intervalx if ax.dataLim.width > 0 else (0.0, 1.0)
    near = LABEL_SPACING * max(high - low, 1e-9)
    row, last_x = 0, -math.inf
    for i, hop in enumerate(data.hops[1:], start=1):
        x = hop.get("first_update", 0)
        accepted = list(hop.get("accepted_changes") or {})
        if not accepted and changes_text(hop, data.hops[i - 1]).startswith("config hash"):
            accepted = ["config"]
        changed = accepted + list(hop.get("allowed_changes") or {})
        color = "tab:red" if accepted else ("tab:purple" if changed else "0.5")
        ax.axvline(x, color=color, linestyle="-" if accepted else "--", linewidth=0.8)
        if not labels:
            continue
        row, last_x = ((row + 1) % LABEL_ROWS if x - last_x < near else 0), x
        # Short: the changed keys are listed in the hops table.
        label = f"hop {hop_number(hop, i)}" + (f", job {hop['job_id']}" if hop.get("job_id") else "")
        if changed:
            label += f" ({len(changed)} key{'s' if len(changed) > 1 else ''} changed)"
        ax.annotate(
            label,
            (x, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(2, -2 - 9 * row),
            textcoords="offset points",
            va="top",
            ha="left",
            fontsize=7,
            color=color if changed else "0.4",
            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.7, "pad": 1},
        )


def log_if_wide(ax: Any, values: list[np.ndarray], ratio: float = 50.0) -> None:
    """A log y axis when every value is positive and they span more than `ratio`."""
    both = np.concatenate([np.asarray(v, dtype=float) for v in values]) if values else np.zeros(0)
    if both.size and np.all(both > 0) and both.max() / both.min() > ratio:
        ax.set_yscale("log")


def legend_outside(ax: Any) -> None:
    """The legend right of the axes, so it never hides a curve."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False)


def fmt(value: Any) -> str:
    """A table cell: 4 significant digits for floats, '-' for missing."""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}" if np.isfinite(value) else "-"
    return "-" if value is None else str(value)
