"""`hpctrain report`: PNG plots and one HTML page for a run folder (no torch; matplotlib's Agg canvas).

Reads metrics.jsonl, chain.json and summary.json, and evaluate.json when `hpctrain evaluate` wrote one:

    {"distributions": {
        "<name>": {"label": "muon energy", "unit": "GeV",           # x axis: "muon energy [GeV]"
                   "bins": [e0, e1, ...],                            # n+1 edges
                   "generated": [c0, ...], "true": [c0, ...],        # n counts each
                   "y_label": "muons per bin", "log_x": false, "log_y": true},   # optional
        ...},
     "metrics": {"<name>": <number>, ...}}                            # optional, shown in a table

The muon task writes "multiplicity" (muons per event), "energy" (GeV) and "lateral_distance" (m). Instead of
bins+counts a distribution may hold raw "generated_values" and "true_values"; they are binned here (log-spaced
bins with log_x).
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hpctrain.track.chain import changes_text, read_json
from hpctrain.track.metrics_file import read_metrics

WIDTH, HEIGHT, DPI = 8.0, 4.5, 100  # every PNG is 800 x 450 pixels
SHARES = ("data", "step", "eval", "checkpoint")
X_UPDATE = "update [optimizer steps]"


@dataclass
class RunData:
    run_dir: Path
    metrics: list[dict[str, Any]]
    hops: list[dict[str, Any]]
    summary: dict[str, Any]
    evaluation: dict[str, Any]

    @classmethod
    def load(cls, run_dir: Path) -> RunData:
        run_dir = Path(run_dir)
        path = run_dir / "metrics.jsonl"
        if not path.is_file():
            raise ValueError(f"{run_dir}: no metrics.jsonl (is this a run folder? <run.out_dir>/<run.name>)")
        return cls(
            run_dir,
            read_metrics(path),
            read_json(run_dir / "chain.json", []),
            read_json(run_dir / "summary.json", {}),
            read_json(run_dir / "evaluate.json", {}),
        )

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) of the records that carry `key` with a finite value."""
        pairs = [(r["step"], r[key]) for r in self.metrics if isinstance(r.get(key), (int, float))]
        pairs = [(s, v) for s, v in pairs if math.isfinite(v)]
        if not pairs:
            return np.zeros(0), np.zeros(0)
        steps, values = zip(*pairs)
        return np.asarray(steps, dtype=float), np.asarray(values, dtype=float)

    def hop_of(self, step: int) -> int:
        """Index of the hop that did update `step` (hop i did first_update_i < step <= last_update_i)."""
        found = 0
        for i, hop in enumerate(self.hops):
            if hop.get("first_update", 0) < step:
                found = i
        return found


def _figure(ncols: int = 1) -> tuple[Any, Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # A Figure with its own Agg canvas: no pyplot global state, no display needed on a login node.
    fig = Figure(figsize=(WIDTH, HEIGHT), dpi=DPI)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, ncols)
    return fig, axes


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)  # no bbox_inches="tight": the size stays exactly WIDTH x HEIGHT inches
    return path


def _mark_hops(ax: Any, data: RunData) -> None:
    """A dashed grey line where each hop began, naming the keys that changed there: red for identity keys
    accepted with checkpoint.accept_changes (another configuration), purple for keys that may change."""
    for i, hop in enumerate(data.hops[1:], start=1):
        x = hop.get("first_update", 0)
        accepted = list(hop.get("accepted_changes") or {})
        if not accepted and changes_text(hop, data.hops[i - 1]).startswith("config hash"):
            accepted = ["config"]
        changed = accepted + list(hop.get("allowed_changes") or {})
        color = "tab:red" if accepted else ("tab:purple" if changed else "0.5")
        ax.axvline(x, color=color, linestyle="-" if accepted else "--", linewidth=0.8)
        label = f"hop {i}" + (f" (job {hop['job_id']})" if hop.get("job_id") else "")
        if changed:
            label += ": " + ", ".join(changed[:3]) + (" ..." if len(changed) > 3 else "") + " changed"
        ax.annotate(
            label,
            (x, 1.0),
            xycoords=("data", "axes fraction"),
            rotation=90,
            va="top",
            ha="right",
            fontsize=7,
            color=color if changed else "0.4",
        )


def plot_loss(data: RunData, out: Path) -> Path:
    fig, ax = _figure()
    for key, style in (("loss_mean", "-"), ("loss", ":")):
        steps, values = data.series(key)
        if steps.size:
            ax.plot(
                steps,
                values,
                style,
                label="train loss (mean over log window)"
                if key == "loss_mean"
                else "train loss (last batch)",
            )
    steps, values = data.series("val_loss")
    if steps.size:
        ax.plot(steps, values, "o-", label="validation loss")
    _log_if_positive(ax, [line.get_ydata() for line in ax.get_lines()])
    _mark_hops(ax, data)
    ax.set(title="Loss", xlabel=X_UPDATE, ylabel="loss [task units]")
    if ax.get_lines():
        ax.legend(fontsize=8)
    return _save(fig, out / "loss.png")


def plot_lr(data: RunData, out: Path) -> Path:
    fig, ax = _figure()
    steps, values = data.series("lr")
    ax.plot(steps, values, "-")
    _mark_hops(ax, data)
    ax.set(title="Learning rate", xlabel=X_UPDATE, ylabel="learning rate [per update]")
    return _save(fig, out / "lr.png")


def plot_throughput(data: RunData, out: Path) -> Path:
    fig, (left, right) = _figure(2)
    rates = [k for k in ("samples_per_s", "events_per_s", "muons_per_s") if data.series(k)[0].size]
    for key in rates:
        steps, values = data.series(key)
        left.plot(steps, values, "-", label=key.replace("_per_s", "/s"))
    _mark_hops(left, data)
    left.set(title="Throughput", xlabel=X_UPDATE, ylabel="rate [1/s]")
    if rates:
        left.legend(fontsize=8)
    hops = range(max(len(data.hops), 1))
    steps, values = data.series("updates_per_s")
    means = [_mean([v for s, v in zip(steps, values) if data.hop_of(int(s)) == h]) for h in hops]
    right.bar([str(h) for h in hops], means, color="tab:blue")
    right.set(title="Mean updates/s per hop", xlabel="job hop [index]", ylabel="updates/s [1/s]")
    return _save(fig, out / "throughput.png")


def plot_time_shares(data: RunData, out: Path) -> Path:
    fig, ax = _figure()
    hops = list(range(max(len(data.hops), 1)))
    bottom = np.zeros(len(hops))
    for kind in SHARES:
        steps, values = data.series(f"{kind}_share")
        per_hop = np.array(
            [_mean([v for s, v in zip(steps, values) if data.hop_of(int(s)) == h]) for h in hops]
        )
        per_hop = np.nan_to_num(per_hop) * 100
        ax.bar([str(h) for h in hops], per_hop, bottom=bottom, label=kind)
        bottom += per_hop
    goodput = [hop.get("goodput") for hop in data.hops]
    if any(g is not None for g in goodput):
        ax.plot(
            [str(h) for h in hops],
            [100 * g if g is not None else np.nan for g in goodput],
            "kD",
            label="goodput (steps / allocated wall time)",
        )
    ax.set(
        title="Time shares per job hop", xlabel="job hop [index]", ylabel="share of time [%]", ylim=(0, 105)
    )
    ax.legend(fontsize=8, loc="lower right")
    return _save(fig, out / "time_shares.png")


def plot_distribution(name: str, spec: dict[str, Any], out: Path) -> Path:
    edges, generated, true = _binned(name, spec)
    fig, ax = _figure()
    ax.stairs(true, edges, label="true (synthetic truth)", linewidth=1.5)
    ax.stairs(generated, edges, label="generated", linewidth=1.5, linestyle="--")
    label = spec.get("label", name.replace("_", " "))
    unit = spec.get("unit", "1")
    ax.set(
        title=f"{label}: generated vs true",
        xlabel=f"{label} [{unit}]",
        ylabel=spec.get("y_label", "count per bin"),
    )
    if spec.get("log_x"):
        ax.set_xscale("log")
    if spec.get("log_y") and (np.any(true > 0) or np.any(generated > 0)):
        ax.set_yscale("log")
    ax.legend(fontsize=8)
    return _save(fig, out / f"dist_{name}.png")


def _binned(name: str, spec: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if "bins" in spec:
        edges = np.asarray(spec["bins"], dtype=float)
        generated = np.asarray(spec["generated"], dtype=float)
        true = np.asarray(spec["true"], dtype=float)
    elif "generated_values" in spec and "true_values" in spec:
        gen_values = np.asarray(spec["generated_values"], dtype=float)
        true_values = np.asarray(spec["true_values"], dtype=float)
        both = np.concatenate([gen_values, true_values])
        both = both[np.isfinite(both)]
        if both.size == 0:
            raise ValueError(f"evaluate.json: distribution {name!r} has no finite values")
        low, high = float(both.min()), float(both.max())
        if spec.get("log_x") and low > 0:
            edges = np.geomspace(low, high if high > low else low * 10, 51)
        else:
            edges = np.linspace(low, high if high > low else low + 1, 51)
        generated = np.histogram(gen_values, edges)[0].astype(float)
        true = np.histogram(true_values, edges)[0].astype(float)
    else:
        raise ValueError(f"evaluate.json: distribution {name!r} needs bins+generated+true or *_values")
    if not (len(edges) == len(generated) + 1 == len(true) + 1):
        raise ValueError(
            f"evaluate.json: distribution {name!r} needs len(bins) == len(generated) + 1 == len(true) + 1"
        )
    return edges, generated, true


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else float("nan")


def _log_if_positive(ax: Any, ys: list[Any]) -> None:
    values = np.concatenate([np.asarray(y, dtype=float) for y in ys]) if ys else np.zeros(0)
    if values.size and np.all(values > 0) and values.max() / values.min() > 20:
        ax.set_yscale("log")


def write_report(run_dir: Path, out: Path | None = None) -> Path:
    """Write the PNGs and index.html into `out` (default <run_dir>/report); returns the HTML path."""
    data = RunData.load(run_dir)
    out = Path(out) if out is not None else data.run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    images = [
        plot_loss(data, out),
        plot_lr(data, out),
        plot_throughput(data, out),
        plot_time_shares(data, out),
    ]
    for name, spec in sorted(data.evaluation.get("distributions", {}).items()):
        images.append(plot_distribution(name, spec, out))
    page = out / "index.html"
    page.write_text(_html(data, images))
    return page


def _table(rows: list[list[Any]], header: list[str]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_fmt(c))}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def _html(data: RunData, images: list[Path]) -> str:
    s = data.summary
    keys = (
        "status",
        "reason",
        "step",
        "total_updates",
        "samples",
        "hops",
        "goodput",
        "run_goodput",
        "run_wall_seconds",
        "run_train_seconds",
        "best",
    )
    summary = _table([[k, s.get(k)] for k in keys if k in s], ["summary", "value"])
    hops = _table(
        [
            [
                i,
                h.get("job_id"),
                h.get("nodes"),
                h.get("first_update"),
                h.get("last_update"),
                h.get("exit_reason"),
                (h.get("end") or h["start"]) - h["start"],
                h.get("goodput"),
                changes_text(h, data.hops[i - 1] if i else None),
            ]
            for i, h in enumerate(data.hops)
        ],
        ["hop", "job", "nodes", "first update", "last update", "exit", "wall [s]", "goodput", "changes"],
    )
    metrics = data.evaluation.get("metrics", {})
    evaluation = _table([[k, v] for k, v in metrics.items()], ["evaluation", "value"]) if metrics else ""
    figures = "\n".join(
        f'<figure><img src="{html.escape(p.name)}" width="800" height="450" '
        f'alt="{html.escape(p.stem)}"></figure>'
        for p in images
    )
    title = html.escape(f"hpctrain report: {data.run_dir.name}")
    style = (
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}"
    )
    return (
        f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{title}</title><style>{style}</style>"
        f"</head><body><h1>{title}</h1>\n{summary}\n<h2>Job hops</h2>\n{hops}\n{evaluation}\n"
        f"<h2>Plots</h2>\n{figures}\n</body></html>\n"
    )
