"""Threads that fit the box: the quick muon config alone and beside two busy loops, with `train.threads` auto.

    python bench/threads.py [--rounds 2] [--updates 300] [--no-baseline]

In a new folder: the README's quick-start data (10,000 + 2,000 events), then per round `hpctrain train --config
configs/muons_quick.yaml` (a fresh run folder each time) alone, and again beside two `sh -c 'while :; do :;
done'` loops (ended by PID after the run): the busy neighbours of a login node or a shared workstation. Each
time is the whole command's wall time; the thread count `auto` chose is read from its start line. Once, the
loaded run again with every core of the affinity mask as threads (what `auto` took before it measured the load):
the baseline. The figures:
  slowdown        loaded / alone, medians (goal <= 2; 2 threads beside the loops made it ~5)
  loaded_ratio    the baseline's loaded time / ours (higher is better)
"Alone" is whatever else the machine runs: the load average before and after is printed with the figures. The
LAST line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HPCTRAIN = [sys.executable, "-m", "hpctrain"]
DATA = [
    ["data", "generate", "--kind", "muons", "--out", "data/muons/train", "--files", "1",
     "--events-per-file", "10000", "--seed", "1"],
    ["data", "generate", "--kind", "muons", "--out", "data/muons/val", "--files", "1",
     "--events-per-file", "2000", "--seed", "2"],
]  # fmt: skip


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPCTRAIN_", "SLURM_"))}
    for name in ("TOTAL_UPDATES", "OMP_NUM_THREADS", "OMP_WAIT_POLICY"):
        env.pop(name, None)
    env["MPLBACKEND"] = "Agg"
    return env


def _train(folder: Path, name: str, updates: int, threads: int = 0) -> tuple[float, str]:
    """(wall seconds, the start line's thread count and why) of one fresh training."""
    cmd = [*HPCTRAIN, "train", "--config", "configs/muons_quick.yaml", f"run.name={name}",
           f"train.total_updates={updates}", f"train.threads={threads}"]  # fmt: skip
    began = time.perf_counter()
    done = subprocess.run(cmd, cwd=folder, env=_env(), capture_output=True, text=True)
    seconds = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {done.returncode}\n{done.stderr[-2000:]}")
    said = re.search(r"device cpu; (\d+ CPU threads? \(.*?\)); run folder", done.stdout)
    return seconds, said.group(1) if said else "?"


class BusyLoops:
    """Two shell loops that keep a core each busy, ended by their PIDs."""

    def __init__(self, count: int = 2) -> None:
        self.count = count
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> BusyLoops:
        self.procs = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(self.count)]
        time.sleep(0.5)  # running before the training starts, as a neighbour would be
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.kill()  # this PID only: the loop is the shell itself
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--updates", type=int, default=300, help="train.total_updates (the config's: 300)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the all-cores loaded run")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    alone, loaded, said = [], [], {}
    baseline = None
    with tempfile.TemporaryDirectory(prefix="hpctrain-threads-") as tmp:
        folder = Path(tmp)
        shutil.copytree(REPO / "configs", folder / "configs")
        for argv in DATA:
            subprocess.run([*HPCTRAIN, *argv], cwd=folder, env=_env(), check=True, capture_output=True)
        for number in range(args.rounds):
            seconds, said["alone"] = _train(folder, f"alone-{number}", args.updates)
            alone.append(seconds)
            with BusyLoops():
                seconds, said["loaded"] = _train(folder, f"loaded-{number}", args.updates)
                loaded.append(seconds)
                if number == 0 and not args.no_baseline:
                    cores = len(os.sched_getaffinity(0))
                    baseline, said["baseline"] = _train(folder, "baseline", args.updates, threads=cores)
            print(
                f"round {number + 1}: alone {alone[-1]:.1f} s, beside 2 busy loops {loaded[-1]:.1f} s "
                f"(load {os.getloadavg()[0]:.1f})",
                flush=True,
            )
    for what, text in said.items():
        print(f"{what}: {text}")
    median_alone, median_loaded = statistics.median(alone), statistics.median(loaded)
    figures = {
        "alone_s": round(median_alone, 1),
        "alone_spread_s": [round(min(alone), 1), round(max(alone), 1)],
        "loaded_s": round(median_loaded, 1),
        "loaded_spread_s": [round(min(loaded), 1), round(max(loaded), 1)],
        "slowdown": round(median_loaded / median_alone, 2),
        "slowdown_goal": 2.0,
        "rounds": args.rounds,
        "updates": args.updates,
        "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)],
    }
    if baseline is not None:
        figures["baseline_loaded_s"] = round(baseline, 1)
        figures["loaded_ratio"] = round(baseline / median_loaded, 2)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
