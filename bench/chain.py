"""Goodput of a chained training on the local SLURM cluster: 2-minute hops, requeued until the run finishes.

    python bench/chain.py [--updates 30000] [--hop-minutes 2] [--hidden 256] [--save-every 0]

Brings up its own cluster (hpc/local-cluster, private state folder), submits slurm/single_gpu.sh with a short
wall time from a throwaway project folder, waits, tears the cluster down. Prints the hops, the updates lost or
repeated between hops (goal 0) and the goodput: training-step seconds over allocated seconds (every run of the
job, from accounting; goal >= 0.8). The last line is one JSON object.

`--save-every N` (checkpoint.every): 0 by default, the cluster presets' policy within a 2-minute hop (a save
before each stop, and every 30 minutes of wall time). The debug preset's own 100 saves ~4 times a second at this
model's speed: ~20% of the time on this disk goes to periodic saves, a cost of the save policy, not of the hops
(`--save-every 100` measures it: issue 17's 0.883 was measured so).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOCAL_CLUSTER = [sys.executable, str(REPO / "hpc" / "local-cluster")]
GOAL = 0.8


def sh(argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    return subprocess.run(
        argv, env=env, cwd=cwd, check=True, capture_output=True, text=True, timeout=120
    ).stdout


def seconds(text: str) -> float:
    """sacct Elapsed ("MM:SS", "HH:MM:SS", "D-HH:MM:SS") in seconds."""
    days, _, rest = text.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    return (int(days or 0) * 24 + parts[0]) * 3600 + parts[1] * 60 + parts[2]


def project_folder(root: Path, hop_minutes: int, lead: int) -> Path:
    root.mkdir(parents=True)
    for name, target in (("slurm", REPO / "slurm"), (".venv", Path(sys.executable).parent.parent)):
        (root / name).symlink_to(target)
    (root / "logs" / "slurm").mkdir(parents=True)
    text = (REPO / "slurm" / "single_gpu.sh").read_text()
    text = re.sub(r"^#SBATCH --time=.*$", f"#SBATCH --time=00:{hop_minutes:02d}:00", text, flags=re.M)
    text = re.sub(r"^#SBATCH --signal=.*$", f"#SBATCH --signal=B:USR1@{lead}", text, flags=re.M)
    text = re.sub(r"^#SBATCH --cpus-per-task=.*$", "#SBATCH --cpus-per-task=1", text, flags=re.M)
    (root / "bench.sh").write_text(text)
    return root


def measure(args: argparse.Namespace, env: dict[str, str], root: Path) -> dict[str, object]:
    overrides = [
        "--preset",
        "debug",  # the CPU job this benchmark measured, not single_gpu.sh's own preset
        "run.name=bench",
        f"train.total_updates={args.updates}",
        "train.threads=1",
        "logging.log_every=10",
        f"model.hidden=[{args.hidden},{args.hidden}]",
        "data.batch_size=128",
        "budget.margin_seconds=5",
        f"checkpoint.every={args.save_every}",
        "train.eval_every=0",
        f"slurm.max_resubmits={args.max_hops}",
    ]
    job = sh(["sbatch", "--parsable", "bench.sh", *overrides], env=env, cwd=root).strip().split(";")[0]
    print(f"job {job}: {args.updates} updates in {args.hop_minutes}-minute hops", flush=True)
    deadline = time.monotonic() + args.max_hops * (args.hop_minutes * 60 + 30)
    state = ""
    while time.monotonic() < deadline:
        state = (
            sh(["sacct", "-n", "-X", "-P", "-o", "State", "-j", job], env=env).split("\n")[0].split(" ")[0]
        )
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            break
        time.sleep(2)
    run = root / "logs" / "bench"
    hops = json.loads((run / "chain.json").read_text())
    for hop in hops:
        print(
            f"  hop {hop['hop']}: updates {hop['first_update']}->{hop['last_update']}, {hop['exit_reason']}, "
            f"{hop['end'] - hop['start']:.0f} s, goodput {hop.get('goodput', 0):.2f}, "
            f"start-up {hop.get('startup_seconds', float('nan')):.2f} s",
            flush=True,
        )
    lost = sum(max(b["first_update"] - a["last_update"], 0) for a, b in zip(hops, hops[1:]))
    repeated = sum(max(a["last_update"] - b["first_update"], 0) for a, b in zip(hops, hops[1:]))
    steps = [
        json.loads(line)["step"]
        for line in (run / "metrics.jsonl").read_text().splitlines()
        if '"loss"' in line
    ]
    expected = set(range(10, args.updates + 1, 10)) | {args.updates}
    lost += len(expected - set(steps)) * 10 if steps else 0
    repeated += (len(steps) - len(set(steps))) * 10
    # Allocated time: every run of the requeued job as accounting saw it (-D lists each requeue).
    rows = sh(["sacct", "-D", "-n", "-X", "-P", "-o", "Elapsed", "-j", job], env=env).split()
    allocated = sum(seconds(r) for r in rows)
    trained = sum(h.get("train_seconds", 0.0) for h in hops)
    goodput = trained / allocated if allocated else 0.0
    startups = sorted(h["startup_seconds"] for h in hops if "startup_seconds" in h)
    return {
        "state": state,
        # the job's start (SLURM_JOB_START_TIME, else the process's) to the hop's first update; median over hops
        "startup_seconds": round(startups[len(startups) // 2], 2) if startups else None,
        "hops": len(hops),
        "updates": hops[-1]["last_update"],
        "updates_lost": lost,
        "updates_repeated": repeated,
        "train_seconds": round(trained, 1),
        "allocated_seconds": allocated,
        "goodput": round(goodput, 3),
        "goodput_ratio": round(goodput / GOAL, 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=30000, help="updates of the run (default 30000)")
    parser.add_argument("--hop-minutes", type=int, default=2, help="wall time of a hop (default 2)")
    parser.add_argument(
        "--hidden", type=int, default=256, help="MLP width: slower steps with larger (default 256)"
    )
    parser.add_argument(
        "--lead", type=int, default=10, help="USR1 this many seconds before the end (default 10)"
    )
    parser.add_argument("--max-hops", type=int, default=8, help="give up after this many hops (default 8)")
    parser.add_argument(
        "--save-every", type=int, default=0, help="checkpoint.every: also save every N updates (default 0)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hpctrain-bench-") as tmp:
        state_dir = Path(tmp) / "cluster"
        sh([*LOCAL_CLUSTER, "install"])
        up = (
            sh([*LOCAL_CLUSTER, "up", "--nodes", "1", "--state-dir", str(state_dir)]).strip().splitlines()[-1]
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HPCTRAIN_"))}
        env.update(
            SLURM_CONF=up.split("=", 1)[1], PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
        )
        try:
            result = measure(args, env, project_folder(Path(tmp) / "proj", args.hop_minutes, args.lead))
        finally:
            subprocess.run(
                [*LOCAL_CLUSTER, "down", "--state-dir", str(state_dir)], capture_output=True, timeout=120
            )
    print(json.dumps(result))
    return 0 if result["state"] == "COMPLETED" else 1


if __name__ == "__main__":
    sys.exit(main())
