"""What ran in a hop, recorded once at its start (chain.json's `ran`, summary.json, W&B's config, `hpctrain
status`): hpctrain's version, the git commit and dirty state of the tree the config came from (a hash of the diff,
and the diff itself when small), Python, torch, CUDA, cuDNN and NCCL versions, the GPUs and their driver, the
hosts, and SLURM's job, array and restart ids. Nothing is done per update.

This module reads and compares records without torch (`hpctrain status` runs on login nodes); the training
process adds what only torch knows (train/what_ran.py).
"""

from __future__ import annotations

import hashlib
import platform
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from hpctrain.runtime.env import ClusterEnv

DIFF_KEPT = 4096  # characters of `git diff HEAD` kept in the record itself (the hash covers all of it)
GIT_SECONDS = 10.0  # a git that hangs (a network file system) delays the start at most this long per call


def hpctrain_version() -> str:
    try:
        return version("hpctrain")
    except PackageNotFoundError:  # a source tree that was never installed: the package's own (loaded already)
        return str(getattr(sys.modules.get("hpctrain"), "__version__", "unknown"))


def _git(folder: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=GIT_SECONDS
        )
    except (OSError, subprocess.TimeoutExpired, UnicodeDecodeError):
        return None
    return done.stdout if done.returncode == 0 else None


def git_state(folder: Path) -> dict[str, Any] | None:
    """The commit of the git tree `folder` is in, whether tracked files differ from it, the SHA-256 of `git diff
    HEAD` and the diff itself when it has at most DIFF_KEPT characters; None outside a git tree (or no git)."""
    top = _git(folder, "rev-parse", "--show-toplevel")
    commit = _git(folder, "rev-parse", "HEAD")
    if top is None or commit is None:
        return None
    diff = _git(folder, "diff", "HEAD", "--no-color", "--no-ext-diff") or ""
    return {
        "top": top.strip(),
        "commit": commit.strip(),
        "dirty": bool(diff),
        "diff_sha256": hashlib.sha256(diff.encode()).hexdigest() if diff else None,
        "diff_chars": len(diff),
        "diff": diff if diff and len(diff) <= DIFF_KEPT else None,
    }


def base_record(env: ClusterEnv, config_file: str | None) -> dict[str, Any]:
    """What every process knows without torch: versions, the config's git tree (rank 0 asks), SLURM's ids."""
    origin = Path(config_file).resolve().parent if config_file else Path.cwd()
    return {
        "hpctrain": hpctrain_version(),
        "python": platform.python_version(),
        "config_file": str(Path(config_file).resolve()) if config_file else None,
        "git": git_state(origin) if env.is_main else None,
        "slurm": {
            "job_id": env.job_id,
            "array_job_id": env.array_job_id,
            "array_task_id": env.array_task_id,
            "restart_count": env.restart_count,
        }
        if env.job_id
        else None,
    }


def _commit(ran: dict[str, Any]) -> str | None:
    git = ran.get("git")
    if not isinstance(git, dict) or not git.get("commit"):
        return None
    sha = str(git.get("diff_sha256") or "")
    return str(git["commit"])[:12] + (f" (dirty, diff {sha[:12]})" if git.get("dirty") else "")


def describe(ran: dict[str, Any]) -> str:
    """One line: `hpctrain 0.1.0, Python 3.11.2, torch 2.13.0 (CUDA 12.6, cuDNN 91000, NCCL 2.26.2), 4x NVIDIA
    H100 (driver 570.1), hosts c1,c2, git 1a2b3c4d5e6f (dirty, diff 9f8e...)`."""
    parts = [f"hpctrain {ran.get('hpctrain')}", f"Python {ran.get('python')}"]
    if ran.get("torch"):
        cuda = ", ".join(
            f"{k} {ran[key]}"
            for k, key in (("CUDA", "cuda"), ("cuDNN", "cudnn"), ("NCCL", "nccl"))
            if ran.get(key)
        )
        parts.append(f"torch {ran['torch']}" + (f" ({cuda})" if cuda else ""))
    gpus = ran.get("gpus") or []
    if gpus:
        names = sorted({str(g.get("name")) for g in gpus})
        driver = next((g.get("driver") for g in gpus if g.get("driver")), None)
        parts.append(f"{len(gpus)}x {'/'.join(names)}" + (f" (driver {driver})" if driver else ""))
    if ran.get("hosts"):
        parts.append(f"hosts {','.join(ran['hosts'])}")
    commit = _commit(ran)
    parts.append(f"git {commit}" if commit else "no git tree")
    return ", ".join(parts)


def differences(before: dict[str, Any] | None, after: dict[str, Any] | None) -> str:
    """What a hop runs under that the hop before it did not, in one line ("" when nothing that matters
    changed, or either hop has no record): hpctrain, Python, torch, CUDA, cuDNN, NCCL, the commit (or its diff)."""
    if not isinstance(before, dict) or not isinstance(after, dict):
        return ""
    parts = []
    for key, name in (("hpctrain", "hpctrain"), ("python", "Python"), ("torch", "torch"), ("cuda", "CUDA"),
                      ("cudnn", "cuDNN"), ("nccl", "NCCL")):  # fmt: skip
        old, new = before.get(key), after.get(key)
        if old != new and (old or new):
            parts.append(f"{name} {old or '-'} -> {new or '-'}")
    old_commit, new_commit = _commit(before), _commit(after)
    if old_commit != new_commit:
        parts.append(f"git {old_commit or 'none'} -> {new_commit or 'none'}")
    return "; ".join(parts)
