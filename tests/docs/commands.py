"""The shell lines of README.md and docs/*.md, as a reader would copy them, sorted by where they can run."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# Lines that need a cluster: run (or checked with `sbatch --test-only`) on the local SLURM cluster in
# tests/integration/test_slurm_templates.py.
CLUSTER = ("sbatch ", "hpc/local-cluster ", 'eval "$(hpc/local-cluster')
# Lines that cannot run in a test, each with the reason. Kept short on purpose: a new entry needs a reason.
NOT_HERE = {
    "make test": "it is this test suite",
    "make run": "the suite's first step in a fresh clone (.ci/run); run by the newcomer check",
    "make install TORCH_SPEC=": "downloads the CUDA build of torch (no network to the torch index here)",
    "tensorboard --logdir": "a server that runs until stopped (its event files are read back in tests/track)",
    "hpctrain sync": "uploads to a W&B account (the offline files it uploads are tested in test_wandb.py)",
    "python -m pytest": "a part of this suite",
    "hpctrain supervise -- torchrun --nnodes 2": "needs a second machine (the single-node form runs here)",
    "condor_submit": "needs an HTCondor pool (tests/launch/test_condor.py parses the file with HTCondor's parser "
    "and runs its executable)",
    "make install": "the environment this suite runs in",
    "source .venv/bin/activate": "the suite runs in that environment already",
}

# Lines that run at their documented length (the environment's TOTAL_UPDATES=4 is not given to them): the quick
# start's promise ("a first muon model and its evaluation page in about 5 minutes on 2 cores") is tested as a
# newcomer runs it, and `bench/quick_start.py` times the same lines.
FULL_LENGTH = ("configs/muons_quick.yaml",)


@dataclass(frozen=True)
class Command:
    doc: Path
    line: int
    text: str  # the command without its trailing comment

    def __str__(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}: {self.text}"

    @property
    def on_cluster(self) -> bool:
        submit_queues = self.text.startswith("hpctrain submit") and not re.search(
            r"--dry-run|--local", self.text
        )
        sbatch_loop = self.text.startswith("for ") and "sbatch " in self.text
        return self.text.startswith(CLUSTER) or submit_queues or sbatch_loop

    @property
    def full_length(self) -> bool:
        return any(name in self.text for name in FULL_LENGTH)

    @property
    def not_here(self) -> str | None:
        return next((why for start, why in NOT_HERE.items() if self.text.startswith(start)), None)


def commands(doc: Path) -> list[Command]:
    """Every command line in the ```bash fences of `doc` (continuations joined, comments dropped)."""
    found: list[Command] = []
    fence: str | None = None
    pending, start = "", 0
    for number, raw in enumerate(doc.read_text().splitlines(), 1):
        if raw.startswith("```"):
            fence = raw[3:].strip() if fence is None else None
            continue
        if fence not in ("bash", "sh", "shell", "console"):
            continue
        if not pending:
            start = number
        pending += raw.rstrip().removesuffix("\\") + (" " if raw.rstrip().endswith("\\") else "")
        if raw.rstrip().endswith("\\"):
            continue
        text = _drop_comment(pending).strip()
        pending = ""
        if text:
            found.append(Command(doc, start, text))
    return found


def _drop_comment(line: str) -> str:
    """The line without a trailing `# comment` (a `#` inside quotes stays)."""
    cut = line.find("#")
    while cut != -1:
        if (cut == 0 or line[cut - 1].isspace()) and not _inside_quotes(line[:cut]):
            return line[:cut]
        cut = line.find("#", cut + 1)
    return line


def _inside_quotes(prefix: str) -> bool:
    return prefix.count("'") % 2 == 1 or prefix.count('"') % 2 == 1


def all_commands() -> list[Command]:
    return [c for doc in DOCS for c in commands(doc)]
