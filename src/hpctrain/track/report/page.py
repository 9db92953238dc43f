"""The report's HTML page: tables built here, laid out by templates/report.html.j2 (jinja2, autoescaped)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpctrain.track.chain import changes_text, hop_number
from hpctrain.track.report.data import RunData
from hpctrain.track.report.panels import Image, Table, WorkloadReport, fmt
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
            hop_number(h, i),  # from 1, as train, status and the plots count
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


def evaluation_table(data: RunData, explain: Callable[[str], str] = lambda key: "") -> Table | None:
    """evaluate.json's headline figures, each with what it is (per-bin ones are left to the workload's pivot
    table)."""
    metrics = {k: v for k, v in data.evaluation.get("metrics", {}).items() if "_E" not in k}
    if not metrics:
        return None
    rows = [[k, fmt(v), explain(k) or "-"] for k, v in metrics.items()]
    return Table("Evaluation", ["figure", "value", "what it is"], rows, evaluation_note(data.evaluation))


def evaluation_note(evaluation: dict[str, Any]) -> str:
    """What the evaluation judged: checkpoint, events, the truth's clamp at the muon cap, the units."""
    info = evaluation.get("info") or {}
    parts = []
    if info.get("checkpoint"):
        parts.append(f"{info['checkpoint']} (update {info.get('step', '?')})")
    if info.get("events"):
        parts.append(f"{info['events']} events of the {info.get('source', 'true data')}")
    said = "; ".join(parts)
    cap = info.get("muon_cap")
    if cap:  # the generator cannot make more muons than the cap: the truth is cut the same way
        said += (
            f". The truth is clamped at the muon cap (data.max_muons_per_event={cap}): "
            f"{info.get('truth_events_clamped_at_cap', 0)} true events had more muons and keep their first "
            f"{cap}, as the generator stops at {cap}"
        )
    elif cap == 0:
        said += ". No muon cap: the truth is not clamped"
    if info.get("units"):
        said += ". W1 in the log10 units of each feature: log10(N+1) for counts, log10(E/GeV) for energies, "
        said += "log10(r/m) for distances; KS: the largest difference of the two CDFs"
    return said + ("." if said else "")


def notices(data: RunData, evaluated: bool) -> list[tuple[str, str]]:
    """What the reader must know before the figures, each with the command that deals with it: an evaluation
    of another update than the run's last (it was extended, or trained on), or none where the workload has
    one. `evaluated`: the workload's page shows an evaluation."""
    run = str(data.run_dir)
    refresh = f"hpctrain evaluate {run} && hpctrain report {run}"
    info = data.evaluation.get("info") or {}
    done = data.summary.get("step", max([int(h.get("last_update") or 0) for h in data.hops] or [0]))
    if not data.evaluation:
        return (
            [("No evaluation yet (evaluate.json): the page shows the training only.", refresh)]
            if evaluated
            else []
        )
    step = info.get("step")
    if isinstance(step, int) and isinstance(done, int) and step != done:
        return [
            (
                f"The evaluation below is of update {step}, but the run has trained to update {done}: it is "
                "stale. To bring it up to date:",
                refresh,
            )
        ]
    return []


def render_page(data: RunData, images: list[Image], tables: list[Table], workload: WorkloadReport) -> str:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, undefined=jinja2.StrictUndefined
    )
    table = evaluation_table(data, workload.explain) if workload.evaluation_table else None
    return env.get_template("report.html.j2").render(
        title=f"hpctrain report: {data.run_dir.name}",
        run_dir=str(data.run_dir),
        generated=time.strftime("%Y-%m-%d %H:%M:%S"),
        notices=notices(data, bool(workload.panels)),
        summary=summary_table(data),
        hops=hops_table(data),
        tables=([table] if table else []) + tables,
        images=images,
    )
