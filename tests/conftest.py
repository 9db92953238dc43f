"""Shared fixtures: a clean environment for subprocesses and a runner for the `hpctrain` command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest_plugins = ["tests.integration.slurm_fixtures"]

ROOT = Path(__file__).resolve().parents[1]
# Variables that would leak the developer's or CI's settings into a test's configuration.
_LEAKY = ("LR", "BATCH_SIZE", "TOTAL_UPDATES", "EPOCHS", "SEED", "RESULTS_DIR", "DATA_DIR", "WANDB_API_KEY")


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("HPCTRAIN_", "SLURM_")) and k not in _LEAKY
    }
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


@dataclass
class Done:
    code: int
    out: str
    err: str


def hpctrain(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 180) -> Done:
    """Run `python -m hpctrain ARGS` in a subprocess (bounded), as a user would."""
    proc = subprocess.run(
        [sys.executable, "-m", "hpctrain", *args],
        cwd=cwd,
        env=env or clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Done(proc.returncode, proc.stdout, proc.stderr)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process tests must not see the caller's HPCTRAIN_*/SLURM_*/alias variables either."""
    for key in list(os.environ):
        if key.startswith(("HPCTRAIN_", "SLURM_")) or key in _LEAKY:
            monkeypatch.delenv(key, raising=False)
