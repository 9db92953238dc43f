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
    section: str = ""  # the page's heading over it (set by write_report when empty)
    problems: list[str] = field(default_factory=list)  # text_problems once saved: on the page, for tests


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
    # What the columns mean, one line each ("column: meaning"), listed under the table.
    legend: list[str] = field(default_factory=list)


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
    # what each of those figures is, for the table's third column ("" where the workload does not say)
    explain: Callable[[str], str] = lambda key: ""


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


LABEL_PX = {"x": 42.0, "y": 16.0}  # room a tick label needs along its axis (x: its width, y: its height)


def _log_ticks(ax: Any, axis: Any) -> None:
    """A log axis's minor ticks at 2 and 5 of each decade (not at every integer), labelled only where they fit
    beside each other at the axis's length: 1-2-5 or 1-3 in plain numbers (0.05 0.1 0.2) on a short range,
    else none ("2x10^-1" beside "10^-1" overprinted on a narrow panel)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter

    if isinstance(axis.get_major_locator(), FixedLocator):  # ticks chosen by the figure (a colour bar's)
        axis.set_minor_locator(FixedLocator([]))
        return
    low, high = sorted(axis.get_view_interval())
    along = "x" if axis is ax.xaxis else "y"
    length = ax.bbox.width if along == "x" else ax.bbox.height
    decades = math.log10(high / low) if low > 0 and high > low else 0.0
    per_decade = length / decades if decades else 0.0
    subs = next(
        (s for s, gap in (((2.0, 5.0), 0.301), ((3.0,), 0.477)) if per_decade * gap >= LABEL_PX[along]), ()
    )
    plain = low >= 1e-3 and high <= 1e4 and bool(subs)
    if not plain:
        axis.set_minor_locator(LogLocator(subs=(2.0, 5.0)))
        axis.set_minor_formatter(NullFormatter())
        return
    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
    minors = [m * 10.0**k for k in range(first, last + 1) for m in subs if low <= m * 10.0**k <= high]
    axis.set_minor_locator(FixedLocator(minors))
    text = FuncFormatter(lambda value, _: f"{value:g}")
    axis.set_minor_formatter(text)
    axis.set_major_formatter(text)


def save_png(fig: Any, path: Any, metadata: dict[str, str]) -> None:
    """Write `fig` as a PNG at DPI. Log axes get minor ticks at 2 and 5 of each decade, not at every
    integer: matplotlib builds an object per tick, and 8 per decade on every log axis were a third of a muon
    report's drawing time (28 s -> 21 s for its 42 figures on one core); the gridless plots lose nothing."""
    from matplotlib import rc_context
    from matplotlib.layout_engine import ConstrainedLayoutEngine

    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            if axis.get_scale() == "log":
                _log_ticks(ax, axis)
    engine = fig.get_layout_engine()
    if isinstance(engine, ConstrainedLayoutEngine) and fig.dpi == DPI:
        # Laid out here, once, and the engine taken off: savefig lays a figure that has one out in a drawing pass
        # of its own (every artist drawn unrendered, every text measured) before the drawing that renders it.
        # The files are byte for byte the same; a muon report's drawing costs ~5 % less (49-52 -> 46-48 CPU-s).
        engine.execute(fig)
        with rc_context({"figure.autolayout": False, "figure.constrained_layout.use": False}):
            fig.set_layout_engine(None)  # None, not "none": a placeholder engine still costs the extra pass
    fig.savefig(path, dpi=DPI, format="png", metadata=metadata)


LABEL_ROWS = 3  # hop labels that would overprint go a row higher; past the last row they are left out
ROW_POINTS = 11  # a label row: fontsize 7 and a little space


def _hop_changes(data: RunData, i: int) -> tuple[str, bool, list[str]]:
    """(colour, accepted identity changes?, the changed keys) of hop i: red where the hop accepted identity
    changes with checkpoint.accept_changes (another configuration), purple where only keys that may change did,
    grey else."""
    hop = data.hops[i]
    accepted = list(hop.get("accepted_changes") or {})
    if not accepted and changes_text(hop, data.hops[i - 1]).startswith("config hash"):
        accepted = ["config"]
    changed = accepted + list(hop.get("allowed_changes") or {})
    return ("tab:red" if accepted else ("tab:purple" if changed else "0.5")), bool(accepted), changed


def mark_hops(ax: Any, data: RunData) -> None:
    """A line where each hop began (colours: _hop_changes; solid where the configuration changed)."""
    for i, hop in enumerate(data.hops[1:], start=1):
        color, accepted, _ = _hop_changes(data, i)
        ax.axvline(
            hop.get("first_update", 0), color=color, linestyle="-" if accepted else "--", linewidth=0.8
        )


def label_hops(ax: Any, data: RunData) -> int:
    """Above the axes, at each hop's line: the hop (numbered from 1, as `train` and `status` count), its job and
    how many keys changed; a row higher where it would overprint the one before, left out where no row is free
    (the hops table lists every hop); the title moves up over the rows used. Above, not inside: inside they
    covered the curves' first points. Call it last for a figure: it lays the figure out first, to know the
    axes' width in pixels. Returns how many labels were left out."""
    fig = ax.figure
    fig.draw_without_rendering()  # constrained layout and the legends outside: the axes' final width
    renderer = fig.canvas.get_renderer()
    low, high = ax.get_xlim()
    per_px = (high - low) / max(ax.get_window_extent(renderer).width, 1.0)
    free_from = [-math.inf] * LABEL_ROWS  # per row: the x where it is free again
    left_out, rows = 0, 0
    for i, hop in enumerate(data.hops[1:], start=1):
        x = hop.get("first_update", 0)
        color, _, changed = _hop_changes(data, i)
        # Short: the changed keys are listed in the hops table.
        label = f"hop {hop_number(hop, i)}" + (f", job {hop['job_id']}" if hop.get("job_id") else "")
        if changed:
            label += f" ({len(changed)} key{'s' if len(changed) > 1 else ''} changed)"
        text = ax.annotate(
            label,
            (x, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(2, 2),
            textcoords="offset points",
            va="bottom",
            fontsize=7,
            color=color if changed else "0.4",
        )
        width = (text.get_window_extent(renderer).width + 6) * per_px
        right = x + width > high  # near the right end: the label to the line's left, inside the axes
        start, end = (x - width, x) if right else (x, x + width)
        row = next((r for r in range(LABEL_ROWS) if start >= free_from[r]), None)
        if row is None:
            text.remove()
            left_out += 1
            continue
        free_from[row] = end
        rows = max(rows, row + 1)
        text.set_horizontalalignment("right" if right else "left")
        text.xyann = (-2 if right else 2, 2 + ROW_POINTS * row)
    if rows:
        ax.set_title(ax.get_title(), pad=6 + ROW_POINTS * rows)
    return left_out


def hop_axis(ax: Any, hops: int) -> None:
    """An x axis of `hops` job hops numbered from 1, at most 12 of them labelled (30 hops' labels ran
    together)."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(nbins=12, integer=True, min_n_ticks=1))
    ax.set_xlim(0.4, hops + 0.6)
    ax.set_xlabel("job hop [from 1]")


def log_if_wide(ax: Any, values: list[np.ndarray], ratio: float = 20.0) -> None:
    """A log y axis when every value is positive and they span more than `ratio` (a loss falling from 30 to
    0.5 is a flat line after its first points on a linear axis)."""
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


def _drawn_tick_labels(axis: Any) -> list[Any]:
    """The tick labels matplotlib draws: those of ticks inside the view (it keeps others, undrawn)."""
    low, high = sorted(axis.get_view_interval())
    span = (high - low) * 1e-6
    ticks = axis.get_major_ticks() + axis.get_minor_ticks()
    labels = [t.label1 for t in ticks if low - span <= t.get_loc() <= high + span]
    labels += [t.label2 for t in ticks if low - span <= t.get_loc() <= high + span]
    return [t for t in labels if t.get_visible() and t.get_text().strip()]


def text_problems(fig: Any, drawn: bool = False) -> list[str]:
    """What a reader could not read in `fig` once drawn: text cut by the figure's edge (a title, a label, a
    tick label, a legend entry), titles and axis labels that overprint each other (a long title over its
    neighbour's), and tick labels of one axis that overprint each other. Empty: all of it
    readable. `drawn`: the figure was just drawn (saved): its layout is read as it is, not drawn again."""
    from matplotlib.text import Text

    if not drawn:
        fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    width, height = fig.bbox.width, fig.bbox.height
    tick_labels: list[Any] = []
    every_tick_label: set[int] = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                every_tick_label.update((id(tick.label1), id(tick.label2)))
            if ax.get_visible():
                tick_labels += _drawn_tick_labels(axis)
    texts = [t for t in fig.findobj(Text) if id(t) not in every_tick_label]
    problems = []
    for text in [*texts, *tick_labels]:
        hidden = text.axes is not None and not text.axes.get_visible()
        if hidden or not text.get_visible() or not text.get_text().strip():
            continue
        box = text.get_window_extent(renderer)
        if box.width and (box.x0 < -1 or box.y0 < -1 or box.x1 > width + 1 or box.y1 > height + 1):
            problems.append(f"cut by the edge: {text.get_text()[:40]!r}")
    named = [fig._suptitle] if fig._suptitle is not None else []
    for ax in fig.axes:
        if ax.get_visible():
            named += [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label]
    boxes = [(t.get_window_extent(renderer), t) for t in named if t.get_visible() and t.get_text().strip()]
    for i, (b1, t1) in enumerate(boxes):
        for b2, t2 in boxes[i + 1 :]:
            if b1.width and b2.width and b1.overlaps(b2):
                problems.append(f"texts overprint: {t1.get_text()[:30]!r} and {t2.get_text()[:30]!r}")
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis) if ax.get_visible() else ():
            along = 0 if axis is ax.xaxis else 1  # neighbours along the axis
            labels = sorted(
                ((t.get_window_extent(renderer), t) for t in _drawn_tick_labels(axis)),
                key=lambda pair: pair[0].get_points()[0][along],
            )
            for (b1, t1), (b2, t2) in zip(labels, labels[1:]):
                if b1.width and b2.width and b1.overlaps(b2):
                    problems.append(f"tick labels overprint: {t1.get_text()!r} and {t2.get_text()!r}")
                    break
    return problems
