"""A throwaway project folder for running the real sbatch templates on the local cluster.

sbatch jobs find the project from SLURM_SUBMIT_DIR, so each test submits from a folder that looks like the
project: `slurm/` (the repository's templates) and `.venv` (this interpreter's environment) are symlinks; runs
and logs land in the folder itself.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import clean_env
from tests.conftest import wait_for as wait_for  # the SLURM tests import it from here
from tests.integration.slurm_fixtures import REPO, SlurmCluster

VENV = Path(sys.executable).parent.parent


def make_project(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, target in (("slurm", REPO / "slurm"), (".venv", VENV)):
        link = root / name
        if not link.exists():
            link.symlink_to(target)
    (root / "logs" / "slurm").mkdir(parents=True, exist_ok=True)
    return root


def variant(project: Path, template: str, name: str, **sbatch: str) -> Path:
    """A copy of slurm/<template>.sh with some #SBATCH options changed (as a user edits the header)."""
    text = (REPO / "slurm" / f"{template}.sh").read_text()
    for key, value in sbatch.items():
        option = key.replace("_", "-")
        text, count = re.subn(rf"^#SBATCH --{option}=.*$", f"#SBATCH --{option}={value}", text, flags=re.M)
        assert count == 1, f"no #SBATCH --{option} in {template}.sh"
    path = project / f"{name}.sh"
    path.write_text(text)
    path.chmod(0o755)
    return path


def job_env(cluster: SlurmCluster, **extra: str) -> dict[str, str]:
    """A clean environment (no developer LR/SLURM_* leaking in) that reaches this cluster."""
    return clean_env(SLURM_CONF=cluster.env["SLURM_CONF"], PATH=cluster.env["PATH"], **extra)


def submit(cluster: SlurmCluster, project: Path, args: list[str], **extra_env: str) -> str:
    import subprocess

    res = subprocess.run(
        ["sbatch", "--parsable", *args],
        cwd=project,
        env=job_env(cluster, **extra_env),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().split(";")[0]


def log_of(project: Path, job: str) -> str:
    logs = list((project / "logs" / "slurm").glob(f"*-{job}.out"))
    return logs[0].read_text(errors="replace") if logs else ""


_CONFIG_LINE = re.compile(r"^(\s*[\w.]+:( .*)?|\s*- .*)$")


def failure_log(project: Path, job: str) -> str:
    """The job's log for a failed assertion: the resolved config each hop prints (100+ lines of YAML after
    "run folder ...") elided, so that every rank's last lines fit in what CI shows of a failure."""
    kept: list[str] = []
    in_config = False
    for line in log_of(project, job).splitlines():
        if in_config and _CONFIG_LINE.match(line):
            continue
        in_config = line.startswith("run folder ")
        kept.append(line)
        if in_config:
            kept.append("  [the resolved config, elided]")
    return "\n".join(kept)


def wait_done(
    cluster: SlurmCluster, project: Path, job: str, timeout: float, progress: Callable[[], Any] | None = None
) -> str:
    """Wait for a terminal state in accounting (a requeued job passes through the controller's states).

    With `progress` (say, the run's chain.json), `timeout` is the longest wait WITHOUT a change in what it
    returns: a chain that keeps hopping is waited for however slow the machine makes its hops, a stuck one fails.
    """
    deadline = time.monotonic() + timeout
    state, seen = None, progress() if progress else None
    while time.monotonic() < deadline:
        state = cluster.sacct_state(job)
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
            return state
        time.sleep(0.5)
        if progress is not None and (now := progress()) != seen:
            seen, deadline = now, time.monotonic() + timeout
    what = f"made no progress ({state})" if progress else f"still {state}"
    if state == "PENDING":  # never started: the log is empty, the scheduler says why
        what += f" ({cluster.pending_reason(job)})"
    raise TimeoutError(f"job {job} {what} for {timeout:.0f} s; log:\n{failure_log(project, job)[-6000:]}")


def read_json(path: Path, default: Any = None) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return default


def loss_steps(run_dir: Path) -> list[int]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [row["step"] for row in rows if "loss" in row]
