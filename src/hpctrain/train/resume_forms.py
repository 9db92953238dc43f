"""The forms of `checkpoint.resume` (parsed once, when the config is validated: `cfg.checkpoint.resume_form`,
config/sections/checkpoint.py) and what each asks for.

auto    continue this run folder's latest checkpoint, or start afresh when it holds none
never   start afresh (a previous run in the folder is moved aside)
latest  continue this run folder's latest checkpoint; refused when it holds none (a job that must not restart)
best    go back to this run folder's best.pt, once: later hops (requeue, chained jobs) continue the run
step_N  go back to this run folder's checkpoint of update N, once (as best)
else    a checkpoint file or a run folder to start from while this folder holds none

Going back needs no deletion: the store orders checkpoints by the order they were written, so the saves after a
rewind are the newest even where older files hold higher update numbers (they are pruned as they age). That the
rewind was applied is kept in <run>/resume_applied.json, so a requeued hop does not go back again.
"""

from __future__ import annotations

from pathlib import Path

from hpctrain.config.sections.checkpoint import ResumeForm, resume_form
from hpctrain.fsutil import atomic_write_json
from hpctrain.track.chain import read_json

__all__ = ["APPLIED", "GIVEN_MISSING", "ResumeForm", "note_rewind", "resume_form", "rewound"]

APPLIED = "resume_applied.json"
# checkpoint.resume=<path> where there is nothing (said by preflight on a login node, and by resume)
GIVEN_MISSING = "no such file or folder (give a checkpoint file or a run folder, or auto | never | latest | best | step_N)"


def rewound(form: ResumeForm, run_dir: Path) -> bool:
    """Whether this run already went back with this best/step_N form (a later hop continues instead)."""
    return bool(read_json(run_dir / APPLIED, {}).get("form") == form.text)


def note_rewind(run_dir: Path, form: ResumeForm, path: Path, step: int) -> None:
    """Remember that this run went back with `form`: later hops with the same setting continue instead."""
    atomic_write_json(run_dir / APPLIED, {"form": form.text, "file": str(path), "step": step})
