"""`hpctrain report --compare`: several runs on one page. Each logged metric of every run overlaid, by update and
by wall time; a table of the runs' final and best figures; a table of the config keys that differ between them.

Wall time is the time spent in the run's job hops since its first start (the waits between hops, in a queue or
for a resubmission, left out): from each record's `time` and `hop`, and for records written before those
existed, placed along their hop by update between the hop's start and end in chain.json.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from hpctrain.fsutil import atomic_path
from hpctrain.track.metrics_file import record_hop
from hpctrain.track.report.data import RunData
from hpctrain.track.report.drawing import Drawing, draw_all
from hpctrain.track.report.generic import is_curve
from hpctrain.track.report.labels import readable
from hpctrain.track.report.page import TEMPLATES
from hpctrain.track.report.panels import (
    X_UPDATE,
    Image,
    Table,
    figure,
    fmt,
    legend_outside,
    log_if_wide,
)
from hpctrain.track.runs import section

# What the hardware did is no figure of merit of a run: left to each run's own report.
_HARDWARE = re.compile(r"^(gpu\d+_.*|rss_gb|workers|workers_cpu_pct|nonfinite_skips)$")
# Per key in a config, not a difference between runs: the name is each column's title already.
_SAME_BY_DESIGN = {"run.name"}


def labels(runs: list[RunData]) -> list[str]:
    """Short distinct names: the folder names, or the paths below the runs' common folder where those repeat."""
    names = [data.run_dir.name for data in runs]
    if len(set(names)) == len(names):
        return names
    paths = [data.run_dir.resolve() for data in runs]
    common = Path(*_common_parts(paths))
    return [p.relative_to(common).as_posix() if p != common else p.name for p in paths]


def _common_parts(paths: list[Path]) -> list[str]:
    parts: list[str] = []
    for column in zip(*(p.parts for p in paths)):
        if len(set(column)) > 1:
            break
        parts.append(column[0])
    return parts or ["/"]


def wall_hours(data: RunData) -> dict[int, float]:
    """Record index -> hours in the run's hops up to that record (records that neither carry a time nor fall in
    a hop of chain.json are left out)."""
    hops = data.hops
    walls = [max((h.get("end") or h.get("last_seen") or h["start"]) - h["start"], 0.0) for h in hops]
    offsets = np.concatenate([[0.0], np.cumsum(walls)]) if hops else np.zeros(1)
    first_time = next((r["time"] for r in data.metrics if isinstance(r.get("time"), (int, float))), None)
    out: dict[int, float] = {}
    for i, record in enumerate(data.metrics):
        step, when = record.get("step"), record.get("time")
        hop = record_hop(record)
        hop = data.hop_of(int(step)) if hop is None and hops and isinstance(step, int) else hop
        if hop is not None and hop < len(hops):
            start = hops[hop]["start"]
            if not isinstance(when, (int, float)):  # an older record: placed by its update within its hop
                first, last = hops[hop].get("first_update") or 0, hops[hop].get("last_update") or 0
                share = (step - first) / (last - first) if isinstance(step, int) and last > first else 1.0
                when = start + min(max(share, 0.0), 1.0) * walls[hop]
            out[i] = (offsets[hop] + max(when - start, 0.0)) / 3600
        elif isinstance(when, (int, float)) and first_time is not None:
            out[i] = (when - first_time) / 3600  # a hop chain.json does not know: from the first record
    return out


def _series(data: RunData, hours: dict[int, float], key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(updates, hours (NaN where unknown), values) of the records holding a finite `key`."""
    rows = [
        (r["step"], hours.get(i, math.nan), float(r[key]))
        for i, r in enumerate(data.metrics)
        if isinstance(r.get(key), (int, float)) and not isinstance(r[key], bool) and math.isfinite(r[key])
    ]
    if not rows:
        return np.zeros(0), np.zeros(0), np.zeros(0)
    steps, when, values = (np.asarray(col, dtype=float) for col in zip(*rows))
    return steps, when, values


def metric_groups(runs: list[RunData]) -> list[tuple[str, list[str]]]:
    """(title, keys) per metric: a key and its val_ twin together, the loss first, the LR last."""
    keys: dict[str, None] = {}
    for data in runs:
        keys.update((k, None) for k in data.scalar_keys() if is_curve(k) and not _HARDWARE.match(k))
    if "loss_mean" in keys:
        keys.pop("loss", None)  # the mean over each log window says the same, less noisily
    groups: dict[str, list[str]] = {"loss": []}
    for key in keys:
        base = key.removeprefix("val_")
        title = "loss" if base in ("loss", "loss_mean") else readable(base)[0]
        groups.setdefault(title, []).append(key)
    groups["learning rate"] = ["lr"] if any(data.series("lr")[0].size for data in runs) else []
    return [
        (title, sorted(members, key=lambda k: k.startswith("val_")))
        for title, members in groups.items()
        if members
    ]


def _colors(count: int) -> list[Any]:
    """A colour per run: the ten distinct default ones, else evenly spread over a colour map (never repeated)."""
    if count <= 10:
        return [f"C{i}" for i in range(count)]
    from matplotlib import colormaps

    return [colormaps["turbo"](0.05 + 0.9 * i / (count - 1)) for i in range(count)]


def _time_unit(hours: float) -> tuple[str, float]:
    if hours >= 2:
        return "h", 1.0
    return ("min", 60.0) if hours * 60 >= 2 else ("s", 3600.0)


def plot_metric(runs: list[RunData], names: list[str], hours: list[dict[int, float]], title: str,
                keys: list[str]) -> Image:  # fmt: skip
    """One metric of every run: by update (left) and by wall time in the run's hops (right)."""
    fig, axes = figure(1100, 340, 1, 2)
    by_update, by_time = axes[0]
    longest, drawn, timeless = 0.0, [], []
    for data, name, when, color in zip(runs, names, hours, _colors(len(runs))):
        label: str | None = name  # once per run, on its first line
        for key in keys:
            steps, at, values = _series(data, when, key)
            if not values.size:
                continue
            style = {"marker": "o", "markersize": 3, "linestyle": "--"} if key.startswith("val_") else {}
            by_update.plot(steps, values, color=color, linewidth=1.0, label=label, **style)
            drawn.append(values)
            known = ~np.isnan(at)
            if known.any():
                longest = max(longest, float(at[known].max()))
                by_time.plot(at[known], values[known], color=color, linewidth=1.0, label=label, **style)
            else:
                timeless.append(name)
            label = None
    unit, scale = _time_unit(longest)
    for line in by_time.get_lines():
        line.set_xdata(np.asarray(line.get_xdata(), dtype=float) * scale)
    by_time.relim()
    by_time.autoscale_view()
    for ax in (by_update, by_time):
        log_if_wide(ax, drawn)
    shown = " (solid) and ".join(keys) + (" (dashed)" if len(keys) > 1 else "")
    by_update.set(title=f"{title} by update", xlabel=X_UPDATE, ylabel=shown)
    by_time.set(
        title=f"{title} by wall time", xlabel=f"wall time in the run's job hops [{unit}]", ylabel=shown
    )
    legend_outside(by_time)
    caption = f"{shown} of each run, by update and by wall time in its job hops."
    if timeless:
        caption += f" No wall time known for: {', '.join(sorted(set(timeless)))}."
    return Image(f"compare_{re.sub(r'[^A-Za-z0-9_]+', '_', title)}", caption, fig)


def _best(values: np.ndarray, mode: str) -> float | None:
    return (float(values.min()) if mode == "min" else float(values.max())) if values.size else None


# A generator's figures of merit (status_table's): the periodic judge's classifier AUC, lower is better, and the
# features meeting the goal in the run's last `hpctrain evaluate` (of how many).
AUC_KEY, GOAL_KEY, GOAL_OF_KEY = "val_auc", "eval_features_goal_met", "eval_features_total"


def _physics(data: RunData) -> tuple[float | None, str | None]:
    """(the run's lowest AUC_KEY, "met/of" of its last evaluation) or None where it has none."""
    aucs, met, of = data.series(AUC_KEY)[1], data.series(GOAL_KEY)[1], data.series(GOAL_OF_KEY)[1]
    goal = f"{int(met[-1])}/{int(of[-1]) if of.size else '?'}" if met.size else None
    return (float(aucs.min()) if aucs.size else None), goal


def by_physics(runs: list[RunData]) -> list[int]:
    """The runs' order by their lowest AUC (runs without one after, in the order given)."""
    aucs = [_physics(data)[0] for data in runs]
    return sorted(range(len(runs)), key=lambda i: (aucs[i] is None, aucs[i] or 0.0, i))


def figures_table(runs: list[RunData], names: list[str], groups: list[tuple[str, list[str]]]) -> Table:
    """One row per run: status, updates, hops, goodput, wall time, its best_metric's final and best value, and the
    final value of every other metric; runs of a generator also their best AUC and goal count, ordered by the
    AUC (the best first)."""
    metrics = [k for _, keys in groups for k in keys if k != "lr"]
    physics = [_physics(data) for data in runs]
    shown = any(auc is not None or goal is not None for auc, goal in physics)
    header = ["run", "status", "updates", "hops", "goodput", "wall time", "best metric", "final", "best"]
    header += ["best AUC", "goal"] if shown else []
    header += [f"final {k}" for k in metrics]
    rows = []
    for i in by_physics(runs) if shown else range(len(runs)):
        data, name = runs[i], names[i]
        s = data.summary
        total = s.get("total_updates", section(data.config, "train").get("total_updates"))
        done = max([int(h.get("last_update") or 0) for h in data.hops] + [r["step"] for r in data.metrics])
        ckpt = section(data.config, "checkpoint")
        chosen = ckpt.get("best_metric")
        metric = chosen if isinstance(chosen, str) and chosen else "val_loss"
        mode = "max" if ckpt.get("best_mode") == "max" else "min"
        values = data.series(metric)[1]
        best = s.get("best") if isinstance(s.get("best"), (int, float)) else _best(values, mode)
        finals = [data.series(k)[1] for k in metrics]
        rows.append(
            [name, s.get("status", "no summary.json (running or killed)"), f"{done} of {total or '?'}",
             len(data.hops), s.get("run_goodput"), _wall(data), f"{metric} ({mode})",
             float(values[-1]) if values.size else None, best,
             *(physics[i] if shown else ()), *[float(v[-1]) if v.size else None for v in finals]]
        )  # fmt: skip
    note = (
        "best: of checkpoint.best_metric (summary.json's, else the best logged); final: the last logged value"
    )
    legend = [
        f"best AUC: the lowest classifier AUC of the generator's bundles against a fixed validation subset "
        f"({AUC_KEY}, at each evaluation; 0.5: indistinguishable); rows ordered by it, the best first",
        "goal: features meeting the goal (per-feature table) in the run's last `hpctrain evaluate`",
    ]
    table = [[fmt(c) for c in row] for row in rows]
    return Table("Runs: final and best figures", header, table, note, legend=legend if shown else [])


def _wall(data: RunData) -> str | None:
    """The wall time of the run's hops, h:mm:ss."""
    walls = [(h.get("end") or h.get("last_seen") or h["start"]) - h["start"] for h in data.hops]
    if not walls:
        return None
    seconds = round(sum(walls))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def flatten(config: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Dotted keys of a nested config and their values (lists are values)."""
    if isinstance(config, dict) and config:
        for key, value in config.items():
            yield from flatten(value, f"{prefix}{key}.")
    elif prefix:
        yield prefix[:-1], config


_ABSENT = object()


def config_table(runs: list[RunData], names: list[str]) -> Table:
    """The config keys whose values differ between the runs (one row each; `(absent)` where a run's config.yaml
    lacks the key), from each run's config.yaml."""
    flat = [dict(flatten(data.config)) for data in runs]
    keys = sorted({k for f in flat for k in f} - _SAME_BY_DESIGN)
    rows = []
    for key in keys:
        values = [f.get(key, _ABSENT) for f in flat]
        if any(v != values[0] for v in values[1:]):
            rows.append([key, *["(absent)" if v is _ABSENT else _show(v) for v in values]])
    note = "" if rows else "every key of config.yaml is the same in all runs (run.name aside)"
    return Table("Configuration keys that differ", ["key", *names], rows, note)


def _show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "null" if value is None else str(value)


def write_comparison(run_dirs: list[Path], out: Path) -> Path:
    """Write the comparison's PNGs and index.html into `out`; returns the HTML path."""
    runs = [RunData.load(path) for path in run_dirs]
    names = labels(runs)
    hours = [wall_hours(data) for data in runs]
    groups = metric_groups(runs)
    images = [plot_metric(runs, names, hours, title, keys) for title, keys in groups]
    out.mkdir(parents=True, exist_ok=True)
    draw_all(
        [
            Drawing(i.figure, out / f"{i.name}.png", {"Title": i.name, "Description": i.caption})
            for i in images
        ]
    )
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, undefined=jinja2.StrictUndefined
    )
    page = out / "index.html"
    html = env.get_template("compare.html.j2").render(
        title=f"hpctrain comparison: {len(runs)} runs",
        runs=[(name, str(data.run_dir)) for name, data in zip(names, runs)],
        generated=time.strftime("%Y-%m-%d %H:%M:%S"),
        figures=figures_table(runs, names, groups),
        config=config_table(runs, names),
        images=images,
    )
    with atomic_path(page, fsync=False) as tmp:
        Path(tmp).write_text(html)
    return page
