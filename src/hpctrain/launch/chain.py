"""Chain decisions: may this run start another hop, and should a stopped hop be resubmitted?

Read from the run folder's chain.json (one record per hop, written by rank 0 of the trainer). Used by the
sbatch templates (`python -m hpctrain.launch.chain ...`) and by the submitit launcher. Imports neither
torch nor the trainer: it runs in the batch shell and on login nodes.

    python -m hpctrain.launch.chain start RUN_DIR --max-resubmits N --max-idle K   # before a hop
    python -m hpctrain.launch.chain next RUN_DIR --exit-code 75 --max-resubmits N --max-idle K
    exit 0 and print "run"/"resubmit"/"done"; exit 3 and print the reason when the chain must stop.

A run that `hpctrain cancel` marked (track/cancel.py) stops here for the jobs the mark names and their successors.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain.errors import EXIT_OK, EXIT_OUT_OF_MEMORY, EXIT_RESUMABLE
from hpctrain.runtime.env import ClusterEnv
from hpctrain.track.cancel import PREDECESSOR, CancelMark, read_mark
from hpctrain.track.chain import read_chain

EXIT_CHAIN_STOP = 3


@dataclass(frozen=True)
class Decision:
    action: str  # run | resubmit | done | stop
    reason: str

    @property
    def go(self) -> bool:
        return self.action in ("run", "resubmit")


def read_hops(run_dir: Path) -> list[dict[str, Any]]:
    """The hop records of chain.json ([] when the run has none yet or the file is unreadable; entries that are
    no hop records left out)."""
    return read_chain(Path(run_dir) / "chain.json").hops


def hop_progress(hop: dict[str, Any]) -> int:
    """Updates a hop committed (last_update moves only at checkpoint commits and at a clean exit)."""
    return int(hop.get("last_update") or 0) - int(hop.get("first_update") or 0)


def idle_hops(hops: list[dict[str, Any]]) -> int:
    """How many of the most recent hops completed no update."""
    count = 0
    for hop in reversed(hops):
        if hop_progress(hop) > 0:
            break
        count += 1
    return count


def decide(
    hops: list[dict[str, Any]], when: str, exit_code: int, max_resubmits: int, max_idle: int
) -> Decision:
    """`when` is "start" (before a hop runs) or "next" (after a hop ended with `exit_code`)."""
    if when == "next":
        if exit_code == EXIT_OK:
            return Decision("done", "the run finished")
        if exit_code == EXIT_OUT_OF_MEMORY:
            return Decision(
                "stop",
                f"the hop ran out of device memory (exit code {exit_code}, its log says where): a hop at the same "
                "settings would too; change them and submit again",
            )
        if exit_code != EXIT_RESUMABLE:
            return Decision("stop", f"the hop failed with exit code {exit_code}; not resubmitting")
    idle = idle_hops(hops)
    if idle >= max_idle:
        return Decision(
            "stop",
            f"the last {idle} hops completed no update (slurm.max_hops_without_progress={max_idle}): "
            "stopping the chain; look at the previous hops' logs",
        )
    # Hop k (0-based) is resubmission number k: the next hop is number len(hops) at either moment.
    if len(hops) > max_resubmits:
        if when == "start":
            return Decision("stop", f"{len(hops)} hops already ran (slurm.max_resubmits={max_resubmits})")
        return Decision(
            "stop",
            f"slurm.max_resubmits={max_resubmits} reached after {len(hops)} hops; the run is resumable: "
            "raise the cap and submit again",
        )
    if when == "start":
        return Decision("run", f"hop {len(hops)} (at most {max_resubmits + 1})")
    return Decision("resubmit", f"hop {len(hops)} (at most {max_resubmits + 1}) follows")


def cancelled(mark: CancelMark | None, job: str | None, predecessor: str | None) -> Decision | None:
    """The stop a cancel mark means for this job (None: it names neither the job nor the job that queued it)."""
    if mark is None or not mark.names(job, predecessor):
        return None
    return Decision(
        "stop", f"the run was {mark.said()}: the chain ends here; the run is resumable (submit it again)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpctrain.launch.chain", description=__doc__)
    parser.add_argument("when", choices=["start", "next"])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--exit-code", type=int, default=EXIT_RESUMABLE)
    parser.add_argument("--max-resubmits", type=int, required=True)
    parser.add_argument("--max-idle", type=int, required=True)
    args = parser.parse_args(argv)
    job = ClusterEnv.from_environ().scheduler_job
    decision = cancelled(read_mark(args.run_dir), job, os.environ.get(PREDECESSOR)) or decide(
        read_hops(args.run_dir), args.when, args.exit_code, args.max_resubmits, args.max_idle
    )
    if decision.action == "stop":
        print(f"hpctrain chain: {decision.reason}", file=sys.stderr)
        return EXIT_CHAIN_STOP
    print(decision.action)
    print(f"hpctrain chain: {decision.reason}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
