"""Weights & Biases: offline by default, and ONE W&B run per hpctrain run however many jobs it takes.

The W&B run id is kept in each checkpoint (state_dict), so a resumed hop calls `wandb.init(id=<same>,
resume="allow")` and logs with the trainer's update count as the step: the hops' offline folders
(<dir>/wandb/offline-run-<time>-<id>) then sync, in order, into one run with one step axis.
The API key comes only from the environment or .env (logging.wandb.api_key); it is handed to wandb in memory
and never printed, logged or written. Nothing else secret reaches W&B either: the config is sent masked, and
W&B's own capture of the command line, the code and the git state (which an offline record keeps and
`hpctrain sync` uploads) is switched off; sys.argv is scrubbed besides.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import string
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from hpctrain.config.schema import ConfigBase
from hpctrain.config.secrets import is_masked
from hpctrain.fsutil import make_folders
from hpctrain.track.tensorboard import MAX_HIST_VALUES, cap_values

log = logging.getLogger(__name__)

RECORD_FILE = "wandb.json"
# W&B settings that stop it from recording the command line (x_disable_meta: the run metadata, which holds
# sys.argv, the program path, host and git remote), the code and the git state. Only those the installed
# wandb knows are passed.
PRIVATE_SETTINGS: dict[str, Any] = {
    "x_disable_meta": True,
    "disable_code": True,
    "save_code": False,
    "disable_git": True,
    "disable_job_creation": True,
}


def new_run_id(length: int = 8) -> str:
    """A W&B-style run id (lowercase letters and digits); wandb's own helper moved between versions."""
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(length))


class _NoRun:
    """A do-nothing stand-in for a wandb Run (mode disabled): the tracker calls it without branches."""

    id: str | None = None
    summary: dict[str, Any] = {}

    def log(self, data: dict[str, Any], step: int | None = None) -> None:
        pass

    def finish(self, exit_code: int | None = None) -> None:
        pass


def _effective_mode(configured: str) -> str:
    """WANDB_MODE in the environment wins (wandb's own convention, and a safety switch on compute nodes)."""
    env_mode = os.environ.get("WANDB_MODE", "").strip().lower()
    if env_mode in ("online", "offline", "disabled") and env_mode != configured:
        log.info("W&B mode %s from WANDB_MODE (config says %s)", env_mode, configured)
        return env_mode
    if env_mode == "dryrun":
        return "offline"
    return configured


class WandbTracker:
    name = "wandb"

    def __init__(
        self,
        cfg: ConfigBase,
        run_dir: Path,
        resume_step: int | None,
        state: dict[str, Any] | None = None,
        ran: dict[str, Any] | None = None,
    ):
        wcfg = cfg.logging.wandb
        state = state or {}
        self.run_dir = Path(run_dir)
        self.mode = _effective_mode(wcfg.mode)
        self.run_id: str | None = state.get("run_id")
        self.resume_step = resume_step
        self.dir = Path(wcfg.dir) if wcfg.dir else self.run_dir
        self._run: Any = _NoRun()
        self._started = time.time()
        if self.mode == "disabled":
            return  # keep a previous hop's run id in state_dict, so enabling W&B again continues that run
        self._run = self._init(cfg, ran or {})
        self.run_id = self._run.id
        self._record_hop()
        upload = f"; upload with: hpctrain sync {self.run_dir}" if self.mode == "offline" else ""
        log.info("W&B %s run %s in %s%s", self.mode, self.run_id, self.dir, upload)

    # ---- set-up -------------------------------------------------------------------------------------------

    def _init(self, cfg: ConfigBase, ran: dict[str, Any]) -> Any:
        import wandb

        from hpctrain.config.dump import dump_config
        from hpctrain.config.secrets import scrub_argv

        wcfg = cfg.logging.wandb
        if self.run_id is None:
            self.run_id = new_run_id()
        make_folders(self.dir)
        key = wcfg.api_key.get_secret_value() if wcfg.api_key is not None else None
        kwargs: dict[str, Any] = {
            "project": wcfg.project,
            "entity": wcfg.entity,
            "group": wcfg.group,
            "tags": list(wcfg.tags) or None,
            "name": cfg.run.name,
            "id": self.run_id,
            "resume": "allow",
            "dir": str(self.dir),
            # secrets masked; `ran`: what this hop runs under (versions, git commit, GPUs: track/what_ran.py)
            "config": {**dump_config(cfg), "ran": ran},
            "allow_val_change": True,  # a resumed hop may run with a longer total_updates
        }

        if is_masked(os.environ.get("WANDB_API_KEY")):  # wandb reads it itself: a mask is no key
            del os.environ["WANDB_API_KEY"]
        known = set(type(wandb.Settings()).model_fields)
        private = {k: v for k, v in PRIVATE_SETTINGS.items() if k in known}
        # Whatever wandb still reads from the command line sees no secret-looking value.
        sys.argv[:] = scrub_argv(sys.argv)

        def settings(mode: str) -> Any:
            # console="off": stdout already goes to the SLURM log; a wrapped stdout only costs time.
            extra: dict[str, Any] = {"console": "off", "silent": True, **private}
            if mode == "online" and key:
                extra["api_key"] = key
            return wandb.Settings(**extra)

        try:
            return wandb.init(mode=self.mode, settings=settings(self.mode), **kwargs)  # type: ignore[arg-type]
        except Exception as exc:
            if self.mode != "online":
                raise
            # No network on this node after all: keep the data offline rather than lose it or the job.
            log.warning(
                "W&B online start failed (%s); logging offline, upload later with `hpctrain sync`",
                type(exc).__name__,
            )
            self.mode = "offline"
            return wandb.init(mode="offline", settings=settings("offline"), **kwargs)

    def _record_hop(self) -> None:
        """<run_dir>/wandb.json: each hop's run id and folder, so `hpctrain sync` finds them without torch."""
        from hpctrain.track.chain import read_json, write_json

        path = self.run_dir / RECORD_FILE
        record = read_json(path, {})
        if not isinstance(record.get("hops"), list):  # none yet, or a damaged file: this hop starts it again
            record["hops"] = []
        record["hops"].append(
            {
                "run_id": self.run_id,
                "dir": str(self.dir.resolve()),
                "mode": self.mode,
                "start": time.time(),
                "resume_step": self.resume_step,
            }
        )
        write_json(path, record)

    # ---- the Tracker protocol -----------------------------------------------------------------------------

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None:
        clean = {k: float(v) for k, v in scalars.items() if v is not None and np.isfinite(v)}
        self._run.log(clean, step=step)

    def log_histograms(self, step: int, values: dict[str, np.ndarray]) -> None:
        if isinstance(self._run, _NoRun):
            return
        import wandb

        data = {}
        for key, array in values.items():
            capped = cap_values(array, MAX_HIST_VALUES, seed=step)
            if capped.size:
                data[f"hist/{key}"] = wandb.Histogram(np_histogram=np.histogram(capped, bins=64))
        if data:
            self._run.log(data, step=step)

    def state_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id}

    def flush(self) -> None:
        pass  # wandb writes its offline file continuously; nothing to force at a checkpoint

    def show(self) -> None:
        pass

    def close(self) -> None:
        self._add_run_summary()
        self._run.finish()

    def _add_run_summary(self) -> None:
        """Goodput and hop counts from summary.json (written before closing) into W&B's run summary."""
        path = self.run_dir / "summary.json"
        try:
            if path.stat().st_mtime < self._started:
                return  # an older hop's summary: this hop failed before writing its own
            summary = json.loads(path.read_text())
        except (OSError, ValueError, RecursionError):
            return
        if not isinstance(summary, dict):
            return
        for key in ("goodput", "run_goodput", "hops", "run_wall_seconds", "run_train_seconds", "reason"):
            if summary.get(key) is not None:
                self._run.summary[key] = summary[key]
