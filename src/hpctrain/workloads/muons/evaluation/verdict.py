"""One verdict word at one strength: what a judgement (evaluate.json's content) says in words, and how strongly.

`hpctrain evaluate` judges EVALUATE_EVENTS (10,000) events by default; a table of fewer (the end-of-training check
of a quick run on its validation files, `--events 1000`) sees only the grossest failures: few of its bins hold
enough true values to be judged, and its null band is wide. Such a table is a SMOKE CHECK: it says so in its first
line with its event and bin counts and the command that judges, and it never says "met" or "within null": a
failure it sees is there (NOT met, DIFFERS), but a pass it gives says only "smoke ok". Every copy of the tables
(the console of train and evaluate, evaluate.json's "summary", evaluate_val.txt) ends with the legend of their
columns, one line each.
"""

from __future__ import annotations

from typing import Any

from hpctrain.workloads.muons.evaluation import quality, two_sample
from hpctrain.workloads.muons.evaluation.cap_note import cap_statement
from hpctrain.workloads.muons.evaluation.quality_judge import LEGEND as QUALITY_LEGEND
from hpctrain.workloads.muons.spec import EVALUATE_EVENTS

SMOKE_WORD = "smoke ok"  # what a smoke check says where a verdict would say "met" or "within null"
SMOKE_LEGEND = f"{SMOKE_WORD}: no failure seen in a smoke check (too few events to say met or within null)"


def table_events(result: dict[str, Any]) -> int:
    """The true events each table compares (held-out files and judged files: one half of them)."""
    info = result.get("info", {})
    return int(info.get("table_events", info.get("events", 0)))


def is_smoke(result: dict[str, Any]) -> bool:
    """Whether a judgement (evaluate_model's or judge_files' result) compared fewer true events than a verdict
    needs (EVALUATE_EVENTS)."""
    return table_events(result) < EVALUATE_EVENTS


def bins_judged(result: dict[str, Any]) -> str:
    """The per-feature table's judged bins, "least-most of all" over the features (e.g. "2-8 of 50")."""
    features = (result.get("quality") or {}).get("features") or {}
    if not features:
        return "no bins"
    judged = [f["bins_judged"] for f in features.values()]
    total = max(len(f["bins"]) for f in features.values())
    least, most = min(judged), max(judged)
    return f"{least}-{most} of {total}" if least != most else f"{least} of {total}"


def smoke_line(result: dict[str, Any], judge: str) -> str:
    """The first line of a smoke check: its counts, why it is one, and `judge`, the command that judges."""
    events = table_events(result)
    return (
        f"SMOKE CHECK, not a verdict: {events:,} events judged, {bins_judged(result)} bins per feature with "
        f"enough true values (a verdict needs {EVALUATE_EVENTS:,} events); it can fail a model, never pass one. "
        f"The judge: {judge}"
    )


def legend(result: dict[str, Any]) -> list[str]:
    """The columns of the tables `result` holds, one line each."""
    lines = list(QUALITY_LEGEND) if result.get("quality") else []
    lines += two_sample.LEGEND if result.get("two_sample") else []
    return lines + ([SMOKE_LEGEND] if is_smoke(result) else [])


def table_lines(result: dict[str, Any]) -> list[str]:
    """The per-feature table, its summary line, the classifier test's table, the muon cap on both sides and the
    legend of their columns."""
    smoke = is_smoke(result)
    lines: list[str] = []
    q = result.get("quality")
    if q:
        lines += quality.table(q, smoke)
        ratio, n = q["min_feature_ratio"], len(q["features"])
        met = f"{SMOKE_WORD} (no failure seen)" if smoke else "goal met"
        lines.append(
            f"min_feature_ratio {'n/a' if ratio is None else f'{ratio:.2f}'} | features within the floor "
            f"{q['features_within_floor']}/{n} | {met} {q['features_goal_met']}/{n}"
        )
    if result.get("two_sample"):
        lines += two_sample.table_lines(result["two_sample"], smoke)
    cap = cap_statement(result.get("info", {}))
    lines += [cap] if cap else []
    return [*lines, "columns:", *(f"  {line}" for line in legend(result))]


def summary(result: dict[str, Any], head: str, judge: str) -> list[str]:
    """The human summary (evaluate.json's "summary", the console, evaluate_val.txt): `head` (what was judged
    against what), the smoke line if it is one (`judge`: the command that judges), the tables, the legend."""
    first = [head, smoke_line(result, judge)] if is_smoke(result) else [head]
    return first + [f"  {line}" for line in table_lines(result)]
