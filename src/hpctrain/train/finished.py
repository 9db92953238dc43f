"""A finished run started again: nothing to train, but what a kill after its final save left undone is done.

The final save commits the finished state (`latest` moves); pruning, the hop's record in chain.json and
summary.json come after it. A process killed there leaves a finished run (the next start trains nothing) whose
hop never closed (`hpctrain status` calls it crashed) and that has no summary.json, or the previous hop's. The
start that finds the run finished completes that record instead of opening a hop of its own: it closes the open
hop, writes summary.json (with the hash of the weights it loaded), and redoes the pruning and the mirror copy.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hpctrain.config.schema import ConfigBase
from hpctrain.errors import EXIT_FAILURE
from hpctrain.remote.mirror import FolderMirror, run_mirror
from hpctrain.runtime.budget import Stop, TimeBudget
from hpctrain.track.chain import ChainLog, read_json, write_summary
from hpctrain.train.checkpoint import CheckpointStore
from hpctrain.train.checkpointer import Checkpointer
from hpctrain.train.counters import Counters
from hpctrain.train.outcome import RunResult
from hpctrain.train.remote_ckpt import RemoteCheckpoints

log = logging.getLogger(__name__)

NOTE = "killed after its final save; closed by the next start"


def complete_finished_run(
    chain: ChainLog,
    store: CheckpointStore,
    run_dir: Path,
    state: Counters,
    cfg: ConfigBase,
    digest: str,
    remote: RemoteCheckpoints,
) -> tuple[list[str], dict[str, str]]:
    """On rank 0 of a run found finished: repair what a kill after the final save left, and the mirror copy its
    last hop could not make; returns what was done (empty when nothing was missing) and {mirror: why it
    failed again} (the uploads, submitted again here, are waited for by the caller)."""
    step = state.step
    reason = Stop.FINISHED if step >= state.total_updates else Stop.EARLY_STOP
    committed = _mtime(store.path_for(step))
    done = []
    if chain.close_killed(step, committed, reason, NOTE) is not None:
        done.append("closed its last hop in chain.json")
    path = run_dir / "summary.json"
    if done or _stale(path, step, committed, len(chain.hops)):
        write_summary(run_dir, _summary(chain, state, reason, digest))
        done.append("wrote summary.json")
    # a kill while the last upload ran leaves no other trace: check the remote copy (two small reads if whole)
    remote.submit(store.folder)
    failed: dict[str, str] = {}
    if done:
        store.prune()
    if done or read_json(path, {}).get("copy_failures"):
        failed = _mirror(store, cfg.checkpoint.mirror_to, cfg.run.name or "", remote)
    if done:
        log.warning("run %s was killed after its final save (update %d): %s", run_dir, step, "; ".join(done))
    return done, failed


def start_finished_run(
    result: RunResult,
    chain: ChainLog,
    store: CheckpointStore,
    run_dir: Path,
    state: Counters,
    cfg: ConfigBase,
    checkpointer: Checkpointer,
    budget: TimeBudget,
) -> RunResult:
    """Rank 0 of a start that found its run finished (`result`: that start's, nothing trained): the record a kill
    after the final save left undone is completed, and the copies checked (and sent again): a copy still
    missing fails this start as it did the run's last hop."""
    _, mirrored = complete_finished_run(
        chain, store, run_dir, state, cfg, result.params_sha256, checkpointer.remote
    )
    result.copy_failures = {**mirrored, **checkpointer.settle(budget)}
    note_copies(run_dir, result.copy_failures)
    if result.copy_failures:
        result.exit_code = EXIT_FAILURE
    return result


def note_copies(run_dir: Path, failures: dict[str, str]) -> None:
    """summary.json says which copies of the checkpoints are missing as of this start (its `copy_failures`),
    when that changed: a copy sent again by a later start is no longer said to have failed."""
    path = run_dir / "summary.json"
    summary = read_json(path, None)
    if isinstance(summary, dict) and summary.get("copy_failures", {}) != failures:
        write_summary(run_dir, {**summary, "copy_failures": failures})


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _stale(path: Path, step: int, committed: float | None, hops: int) -> bool:
    """Whether summary.json is missing or not the final one: another update or status, written before the
    final checkpoint, or before the last hop."""
    summary = read_json(path, None)
    if not isinstance(summary, dict):
        return True
    if summary.get("step") != step or summary.get("status") not in ("finished", "already_finished"):
        return True
    written_by = summary.get("hops")
    if isinstance(written_by, int) and written_by < hops:
        return True
    written = _mtime(path)
    return committed is not None and written is not None and written < committed


def _summary(chain: ChainLog, t: Counters, reason: Stop, digest: str) -> dict[str, Any]:
    """summary.json as the killed hop would have written it; what that hop measured and lost is None."""
    last = chain.hops[-1] if chain.hops else {}
    end, start = last.get("end"), last.get("start")
    return {
        "status": "finished",
        "reason": reason,
        "step": t.step,
        "total_updates": t.total_updates,
        "samples": t.samples,
        "params_sha256": digest,
        "wall_seconds": end - start if end is not None and start is not None else None,
        "seconds": None,
        "goodput": last.get("goodput"),
        "best": t.best,
        "job_id": last.get("job_id"),
        "note": "written by a later start: the run was killed after its final save",
        **chain.totals(),
    }


def _mirror(
    store: CheckpointStore, dest: str | None, run_name: str, remote: RemoteCheckpoints
) -> dict[str, str]:
    """The mirror copy after the final save may have been cut short too, or failed: {dest: why} if it fails."""
    if not dest or remote.takes(dest):
        return {}
    try:
        FolderMirror(run_mirror(dest, run_name)).sync(store.folder, last=("latest",))
    except Exception as exc:  # a failed mirror loses nothing local: warn, as after any save
        log.warning("mirroring checkpoints to %s failed: %s", dest, exc)
        return {str(dest): f"{type(exc).__name__}: {exc}"}
    return {}
