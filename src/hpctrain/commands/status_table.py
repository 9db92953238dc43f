"""`hpctrain status FOLDER`: one row per run folder under FOLDER (a sweep, `logs/`, a folder of sweeps).

Each row is read from what is on disk now, never from a process: the state from chain.json, summary.json and
run.lock as `hpctrain status RUN_DIR` decides it (one `squeue` call for all rows), the update and the metric from
the end of metrics.jsonl (live: a running hop writes it about once a second; its last checkpoint may be far
behind), hops and goodput from chain.json. No torch (login nodes).
"""

from __future__ import annotations

import getpass
import math
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from hpctrain.errors import UserError
from hpctrain.launch.chain import read_hops
from hpctrain.track.cancel import read_mark
from hpctrain.track.chain import is_count, is_stamp, read_json, read_summary
from hpctrain.track.run_state import lock_holder, run_state
from hpctrain.track.runs import Tail, read_config, section, tail_records

# `--sort` keys: the column each sorts by (rows without a value come last, whatever the order; `goal` puts the
# most features met first).
SORT_KEYS = (
    "name",
    "state",
    "update",
    "progress",
    "last",
    "best",
    "auc",
    "goal",
    "hops",
    "goodput",
    "activity",
)
# A generator's figures of merit in its records: the periodic judge's classifier AUC (lower is better) and the
# features meeting the goal in its last `hpctrain evaluate` (of how many it judged).
AUC_KEY, GOAL_KEY, GOAL_OF_KEY = "val_auc", "eval_features_goal_met", "eval_features_total"
_STATE_SHOWN = {
    "stopped": "stopped-resumable",
    "cancelled": "cancelled-resumable",
    "not started": "not-started",
}


def queue_states(job_ids: set[str]) -> dict[str, str]:
    """job id -> its squeue state (RUNNING, PENDING, ...) for this user's queued jobs, in one call; {} when
    squeue is missing or fails. Array elements are matched by both of their ids (`123_4` and its own id)."""
    exe = shutil.which("squeue")
    if not exe or not job_ids:
        return {}
    try:
        user = ["-u", getpass.getuser()]
    except (OSError, KeyError):  # no user name known to this process: every user's jobs, filtered below
        user = []
    try:
        done = subprocess.run(
            [exe, "-h", *user, "-o", "%A|%i|%T"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    states: dict[str, str] = {}
    for line in done.stdout.splitlines() if done.returncode == 0 else []:
        parts = line.strip().split("|")
        if len(parts) == 3:
            states[parts[0]] = states[parts[1]] = parts[2]
    return {job: state for job, state in states.items() if job in job_ids}


def _number(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def _count(value: Any) -> int | None:
    return value if is_count(value) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def metric_figures(
    tail: Tail, cfg: dict[str, Any], summary: dict[str, Any], since: float | None = None
) -> dict[str, Any]:
    """The run's metric (checkpoint.best_metric when the run logs it, else the mean training loss), its last
    value and its best: of best_metric, summary.json's best (the run's, as of its last exit) joined with the
    best_metric records of the last TAIL_LIMIT bytes; of the loss, the best of the records read (`best_of`
    says "run", or how many records it is the best of). `since`: when the running hop began (its records are
    not in summary.json's best: the ones read must reach back to then)."""
    records = tail.records
    ckpt = section(cfg, "checkpoint")
    chosen: str | None = _text(ckpt.get("best_metric")) or "val_loss"
    mode = "max" if ckpt.get("best_mode") == "max" else "min"
    known = _number(summary.get("best"))
    first = _number(records[0].get("time")) if records else None
    whole = tail.kept_whole or (
        known is not None and (since is None or (first is not None and first <= since))
    )
    if known is None and not any(chosen in r for r in records):
        chosen = next((k for k in ("loss_mean", "loss") if any(k in r for r in records)), None)
        mode, whole = "min", tail.whole
    if chosen is None:
        return {
            "metric": None,
            "mode": None,
            "last": None,
            "last_update": None,
            "best": None,
            "best_of": None,
        }
    pairs = [(r["step"], v) for r in records if (v := _number(r.get(chosen))) is not None]
    values = [v for _, v in pairs] + ([known] if known is not None else [])
    pick = min if mode == "min" else max
    return {
        "metric": chosen,
        "mode": mode,
        "last": pairs[-1][1] if pairs else None,
        "last_update": pairs[-1][0] if pairs else None,
        "best": pick(values) if values else None,
        "best_of": "run" if whole else f"last {len(pairs)} records",
    }


def physics_figures(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The last AUC_KEY and the last GOAL_KEY (with GOAL_OF_KEY) among `records` (None where absent)."""
    auc = [(r["step"], v) for r in records if (v := _number(r.get(AUC_KEY))) is not None]
    goal = [r for r in records if _number(r.get(GOAL_KEY)) is not None]
    last = goal[-1] if goal else {}
    return {
        "auc": auc[-1][1] if auc else None,
        "auc_update": auc[-1][0] if auc else None,
        "goal_met": int(last[GOAL_KEY]) if goal else None,
        "goal_features": int(n) if (n := _number(last.get(GOAL_OF_KEY))) is not None else None,
        "goal_update": last.get("step"),
    }


def run_row(run_dir: Path, name: str, queue: dict[str, str], now: float) -> dict[str, Any]:
    """One row of the table: what `hpctrain status RUN_DIR` says first, plus the live figures."""
    hops = _hops(run_dir)
    summary = read_summary(run_dir)
    cfg = read_config(run_dir)
    total = summary.get("total_updates") or _count(section(cfg, "train").get("total_updates"))
    saved = max([int(h.get("last_update") or 0) for h in hops] + [int(summary.get("step") or 0)])
    finished = (
        summary.get("status") in ("finished", "already_finished") and total is not None and saved >= total
    )
    job = str(hops[-1].get("job_id")) if hops and hops[-1].get("job_id") else None
    queued = queue.get(job) if job and not finished else None
    state, evidence = run_state(
        hops, summary, lock_holder(run_dir, now), queued, finished, read_mark(run_dir)
    )
    # The best of the run's metric is known up to its last exit (summary.json); past that, and in a first hop,
    # only from the records: then every evaluation record within the tail's limit is read, else only the last.
    metric = _text(section(cfg, "checkpoint").get("best_metric")) or "val_loss"
    best_open = state == "running" or _number(summary.get("best")) is None
    tail = tail_records(run_dir / "metrics.jsonl", want=(metric,), all_of_want=best_open)
    trained = sum(float(h.get("train_seconds") or 0.0) for h in hops)
    closed = [h.get("end") or h.get("last_seen") or h["start"] for h in hops]
    wall = sum((now if state == "running" and i == len(hops) - 1 else end) - h["start"]
               for i, (end, h) in enumerate(zip(closed, hops)))  # fmt: skip
    lock = read_json(run_dir / "run.lock", {})
    seen = [_mtime(run_dir / n) for n in ("metrics.jsonl", "chain.json", "summary.json")]
    seen += [tail.records[-1].get("time") if tail.records else None]
    seen += [lock.get("heartbeat") if isinstance(lock, dict) else None, *closed]
    activity = [t for t in seen if is_stamp(t)]
    return {
        "name": name,
        "run_dir": str(run_dir),
        "state": state,
        "evidence": evidence,
        "queue": queued,
        "update": max([saved] + [r["step"] for r in tail.records]),  # live: records outrun checkpoints
        "total_updates": total,
        **metric_figures(tail, cfg, summary, hops[-1]["start"] if state == "running" and hops else None),
        **physics_figures(tail.records),
        "hops": len(hops),
        "goodput": trained / wall if wall > 0 else None,
        "last_activity": max(activity) if activity else None,
    }


def _hops(run_dir: Path) -> list[dict[str, Any]]:
    """chain.json's hop records; a record without a start (a hand-edited or foreign file) is no hop."""
    return [h for h in read_hops(run_dir) if isinstance(h, dict) and _number(h.get("start")) is not None]


def collect_rows(folder: Path, runs: list[Path]) -> list[dict[str, Any]]:
    now = time.time()
    jobs = set()
    for run in runs:
        hops = _hops(run)
        if hops and hops[-1].get("job_id"):
            jobs.add(str(hops[-1]["job_id"]))
    queue = queue_states(jobs)
    return [run_row(run, run.relative_to(folder).as_posix(), queue, now) for run in runs]


def sort_rows(rows: list[dict[str, Any]], key: str, reverse: bool = False) -> list[dict[str, Any]]:
    """Rows ordered by `key` (one of SORT_KEYS); rows without a value last, in name order."""
    if key not in SORT_KEYS:
        raise UserError(f"hpctrain status: --sort {key!r}: choose from {', '.join(SORT_KEYS)}")

    def value(row: dict[str, Any]) -> Any:
        if key == "progress":
            total = row["total_updates"]
            return row["update"] / total if total else None
        if key == "goal":  # most features met first, then the lower AUC
            met = row["goal_met"]
            return None if met is None else (-met, row["auc"] if row["auc"] is not None else math.inf)
        return row[{"name": "name", "activity": "last_activity"}.get(key, key)]

    rows = sorted(rows, key=lambda r: r["name"])
    known = sorted((r for r in rows if value(r) is not None), key=value, reverse=reverse)
    return known + [r for r in rows if value(r) is None]


def _age(stamp: float | None, now: float) -> str:
    if stamp is None:
        return "-"
    seconds = max(now - stamp, 0.0)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit} ago"
    return f"{seconds:.0f} s ago"


def _figure(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _goal(row: dict[str, Any]) -> str:
    if row["goal_met"] is None:
        return "-"
    return f"{row['goal_met']}/{row['goal_features'] if row['goal_features'] is not None else '?'}"


def render_table(rows: list[dict[str, Any]]) -> str:
    now = time.time()
    # the physics columns where some run has their figures (a generator's), else none
    physics = any(row["auc"] is not None or row["goal_met"] is not None for row in rows)
    header = ["run", "state", "update", "metric", "last", "best"]
    header += ["AUC", "goal"] if physics else []
    header += ["hops", "goodput", "last activity"]
    cells = [
        [
            row["name"],
            _STATE_SHOWN.get(row["state"], row["state"]) + (f" ({row['queue']})" if row["queue"] else ""),
            f"{row['update']}/{row['total_updates'] if row['total_updates'] is not None else '?'}",
            row["metric"] or "-",
            _figure(row["last"]),
            _figure(row["best"]) + ("*" if row["best_of"] not in (None, "run") else ""),
            *([_figure(row["auc"]), _goal(row)] if physics else []),
            str(row["hops"]),
            "-" if row["goodput"] is None else f"{row['goodput']:.2f}",
            _age(row["last_activity"], now),
        ]
        for row in rows
    ]
    widths = [max(len(line[i]) for line in [header, *cells]) for i in range(len(header))]
    left = {0, 1, 3}  # text columns; numbers right-aligned
    lines = [
        "  ".join(
            c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths))
        ).rstrip()
        for line in [header, *cells]
    ]
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["state"]] = counts.get(row["state"], 0) + 1
    lines.append(
        f"{len(rows)} run{'s' if len(rows) > 1 else ''}: "
        + ", ".join(f"{n} {_STATE_SHOWN.get(s, s)}" for s, n in sorted(counts.items()))
    )
    if physics:
        lines.append(
            "AUC: the last classifier AUC of the generator's bundles against a fixed validation subset (val_auc, "
            "at each evaluation; 0.5: indistinguishable); goal: features meeting the goal in the run's last "
            "`hpctrain evaluate` (--sort auc or --sort goal: the best first)"
        )
    if any(row["best_of"] not in (None, "run") for row in rows):
        lines.append(
            "* the best of the records read from the end of metrics.jsonl (--json: best_of), not of the whole run"
        )
    return "\n".join(lines)
