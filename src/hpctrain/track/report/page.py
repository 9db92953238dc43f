"""The report's HTML page: tables built here, laid out by templates/report.html.j2 (jinja2, autoescaped)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from hpctrain.track.chain import changes_text
from hpctrain.track.report.data import RunData
from hpctrain.track.report.panels import Image, Table, fmt
from hpctrain.track.runs import section

TEMPLATES = Path(__file__).parent / "templates"


def summary_table(data: RunData) -> Table:
    """Run, hops, goodput and the final value of every validation figure (and the train loss)."""
    s = data.summary
    done = s.get("step", max([int(h.get("last_update") or 0) for h in data.hops] or [0]))
    total = s.get("total_updates", section(data.config, "train").get("total_updates"))
    rows: list[list[Any]] = [
        ["run", data.run_dir.name],
        ["model", data.model_type],
        ["status", f"{s.get('status', 'no summary.json (running or killed)')}"
                   + (f" ({s['reason']})" if s.get("reason") not in (None, "", s.get("status")) else "")],
        ["updates", f"{done} of {total if total is not None else '?'}"],
        ["job hops", len(data.hops)],
        ["run goodput (training-step time / allocated time)", s.get("run_goodput")],
        ["wall time [s]", s.get("run_wall_seconds")],
    ]  # fmt: skip
    best_metric = section(data.config, "checkpoint").get("best_metric")
    if s.get("best") is not None and best_metric:
        rows.append([f"best {best_metric} (checkpoints/best)", s["best"]])
    for key in ["loss_mean", *[k for k in data.scalar_keys() if k.startswith("val_")]]:
        steps, values = data.series(key)
        if values.size:
            rows.append([f"final {key} (update {int(steps[-1])})", float(values[-1])])
    return Table("Summary", ["", "value"], [[k, fmt(v)] for k, v in rows])


def hops_table(data: RunData) -> Table:
    rows = [
        [
            i,
            h.get("job_id"),
            h.get("nodes"),
            h.get("world_size"),
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(h["start"])) if h.get("start") else None,
            f"{h.get('first_update')} -> {h.get('last_update')}",
            h.get("exit_reason"),
            (h.get("end") or h.get("last_seen") or h["start"]) - h["start"],
            h.get("goodput"),
            changes_text(h, data.hops[i - 1] if i else None),
        ]
        for i, h in enumerate(data.hops)
    ]
    header = ["hop", "job", "nodes", "ranks", "start", "updates", "exit", "wall [s]", "goodput", "changes"]
    return Table("Job hops", header, [[fmt(c) for c in row] for row in rows])


def evaluation_table(data: RunData) -> Table | None:
    """evaluate.json's headline figures (per-bin ones are left to the workload's pivot table)."""
    metrics = {k: v for k, v in data.evaluation.get("metrics", {}).items() if "_E" not in k}
    if not metrics:
        return None
    info = data.evaluation.get("info", {})
    note = ", ".join(f"{k} {v}" for k, v in info.items() if k in ("step", "events", "units", "checkpoint"))
    return Table("Evaluation", ["figure", "value"], [[k, fmt(v)] for k, v in metrics.items()], note)


def render_page(data: RunData, images: list[Image], tables: list[Table], evaluation: bool = True) -> str:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, undefined=jinja2.StrictUndefined
    )
    table = evaluation_table(data) if evaluation else None
    return env.get_template("report.html.j2").render(
        title=f"hpctrain report: {data.run_dir.name}",
        run_dir=str(data.run_dir),
        generated=time.strftime("%Y-%m-%d %H:%M:%S"),
        summary=summary_table(data),
        hops=hops_table(data),
        tables=([table] if table else []) + tables,
        images=images,
    )
