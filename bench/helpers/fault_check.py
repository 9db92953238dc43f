"""Checking a run folder after a fault campaign (bench/faults.py): the final hash, the history, `best.pt`.

Reads only what a user can see: the last stdout line, summary.json, metrics.jsonl, chain.json and the checkpoint
files the README names (`checkpoints/latest`, `best.pt`, `best.json`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HASH_LINE = re.compile(r"params_sha256=([0-9a-f]{64})")


@dataclass
class Job:
    name: str
    args: list[str]  # after `python -m hpctrain`
    total: int
    log_every: int
    eval_every: int

    @property
    def logged_steps(self) -> set[int]:
        return {s for s in range(1, self.total + 1) if s % self.log_every == 0 or s == self.total}

    @property
    def eval_steps(self) -> set[int]:
        """Periodic evaluations before the end, and the final one."""
        return set(range(self.eval_every, self.total, self.eval_every)) | {self.total}


@dataclass
class Reference:
    """An uninterrupted run of the same command, and what it tells about the kill points."""

    run_dir: Path
    digest: str
    counts: dict[str, int]  # matching calls of each exact kill point in the whole run
    startup: float  # seconds from start to the first update logged
    step: float  # seconds per update
    eval: float  # seconds per evaluation
    losses: dict[int, float]
    best_digest: str | None


def reference_from_dir(run_dir: Path) -> Reference:
    """A finished run folder as the reference (hash from its summary.json; no timings or counts)."""
    summary = json.loads((run_dir / "summary.json").read_text())
    losses = {r["step"]: r["loss"] for r in read_metrics(run_dir / "metrics.jsonl") if "loss" in r}
    best = checkpoint_digest(run_dir / "checkpoints" / "best.pt")
    return Reference(run_dir, summary["params_sha256"], {}, 0.0, 0.0, 0.0, losses, best)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            continue  # a line cut by a kill
    return records


def latest_step(run_dir: Path) -> int | None:
    """The update `checkpoints/latest` names (None before the first save)."""
    try:
        name = (run_dir / "checkpoints" / "latest").read_text().strip()
    except FileNotFoundError:
        return None
    found = re.search(r"(\d+)", name)
    return int(found.group(1)) if found else None


def history(job: Job, records: list[dict[str, Any]], ref_losses: dict[int, float] | None) -> dict[str, int]:
    """Updates and evaluations logged twice, missing or unexpected; losses that differ from the reference."""
    train = Counter(r["step"] for r in records if "loss" in r)
    evals = Counter(r["step"] for r in records if "loss" not in r)  # evaluation records carry val_* only

    def off(counts: Counter[int], expected: set[int]) -> int:
        repeated = sum(n - 1 for n in counts.values())
        return repeated + len(expected - set(counts)) + len(set(counts) - expected)

    mismatched = 0
    if ref_losses is not None:
        mismatched = sum(1 for r in records if "loss" in r and ref_losses.get(r["step"]) != r["loss"])
    return {
        "steps_repeated_or_lost": off(train, job.logged_steps),
        "evals_repeated_or_lost": off(evals, job.eval_steps),
        "loss_mismatches": mismatched,
    }


def checkpoint_digest(path: Path) -> str | None:
    """params_sha256 (as the trainer computes it: networks by name, tensors in state-dict order) of the
    networks in one checkpoint file; None if it cannot be read."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        modules = state["modules"]
    except (OSError, RuntimeError, KeyError, TypeError):
        return None
    digest = hashlib.sha256()
    for name in sorted(modules):
        for key, tensor in modules[name].items():
            digest.update(f"{name}.{key}".encode())
            digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def final_digest(job: Job, run_dir: Path, last_line: str | None, anomalies: list[str]) -> str | None:
    """The hash the run reports (last stdout line, else summary.json), else the one its checkpoint holds."""
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    found = HASH_LINE.search(last_line or "")
    digest = found.group(1) if found else None
    if last_line is not None and not found:
        anomalies.append("the last stdout line of the finished run has no params_sha256")
    if not summary:
        anomalies.append("no summary.json after the run finished")
    elif digest and summary.get("params_sha256") != digest:
        anomalies.append("summary.json and the last stdout line disagree on params_sha256")
    if digest is None and summary.get("status") == "finished" and summary.get("step") == job.total:
        digest = summary.get("params_sha256")
    if digest is None:  # nothing printed or written: at least check what the final checkpoint holds
        latest = run_dir / "checkpoints" / "latest"
        digest = checkpoint_digest(latest.parent / latest.read_text().strip()) if latest.exists() else None
    return digest


def verify(job: Job, run_dir: Path, last_line: str | None, ref: Reference) -> dict[str, Any]:
    """Everything promised about one finished run folder; `last_line` None: take the hash from summary.json."""
    anomalies: list[str] = []
    digest = final_digest(job, run_dir, last_line, anomalies)
    chain = run_dir / "chain.json"
    hops = json.loads(chain.read_text()) if chain.exists() else []
    if not hops or hops[-1].get("end") is None or hops[-1].get("exit_reason") != "finished":
        anomalies.append("chain.json does not end with a finished hop")
    best = run_dir / "checkpoints" / "best.pt"
    best_equal = ref.best_digest is None or (best.exists() and checkpoint_digest(best) == ref.best_digest)
    if not best_equal:
        anomalies.append("best.pt holds other networks than the reference's best.pt")
    if best.exists() and not best.with_suffix(".json").exists():
        anomalies.append("best.pt has no best.json (its hash cannot be checked)")
    temporaries = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if "tmp" in p.name)
    if temporaries:  # named without their writer's pid: which write was cut says where the kill was
        kinds = sorted({re.sub(r"\d+$", "*", name) for name in temporaries})
        anomalies.append(f"temporary files left in the run folder: {', '.join(kinds)}")
    return {
        "params_sha256": digest,
        "params_equal": digest == ref.digest,
        "best_equal": best_equal,
        **history(job, read_metrics(run_dir / "metrics.jsonl"), ref.losses),
        "temporaries": temporaries,
        "anomalies": anomalies,
    }
