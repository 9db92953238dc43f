"""Start-up per hop: seconds from launching `hpctrain train` to its first training update, fresh and resumed.

    python bench/startup.py [--rounds 5] [--no-muons] [--baseline-src OTHER/src]

`--baseline-src`: another version's sources (e.g. `git archive REV src | tar -x -C /tmp/before`), started in the
same rounds (PYTHONPATH first) for a before/after side by side: `*_speedup_over_baseline` = its time over ours.

Four cases, each a new process like a job hop, against two floors: `python -c 'import torch'`, and torch up to one
Adam step on one parameter (`torch_first_step`: an optimizer's first step imports torch._dynamo, ~0.7 s here, in
any PyTorch training):
- default: `hpctrain train` (configs/debug.yaml) in a new run folder;
- default_resume: the same command again on that folder, after the first was stopped by USR1 (as a job hop is
  stopped before its walltime): it loads the checkpoint the stop saved;
- muon, muon_resume: the same with configs/muons.yaml on the README's data (`hpctrain data generate --kind muons`,
  2 x 20,000 training events and 2,000 validation events; made once in a temporary folder).

The first update is the trainer's own record: chain.json's `startup_seconds` for the hop, written once when every
optimizer has stepped once (the hop's start is the process's start from /proc). The figure here is that moment
minus the time just before this script launched the process (so the fork and exec count, as for the floor). Each
run gets `train.total_updates` raised far beyond the first update and is stopped by USR1 once the record is
there, so that every case is one short hop whatever the machine's speed. The cases run in rounds (each case
once per round, in turn); medians and the spread (min..max) are over the rounds. The LAST line printed is one
JSON object: `*_first_update_s` medians (and `*_spread`), `import_torch_s`, `torch_first_step_s`, `goal_default_s`
(2.5) and `default_ratio` = goal / default median (>= 1 meets the goal), with the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
HPCTRAIN = [sys.executable, "-m", "hpctrain"]
if (BIN / "hpctrain").exists():
    HPCTRAIN = [str(BIN / "hpctrain")]  # what a user (and the sbatch scripts) run
GOAL = 2.5
CASES = ("import_torch", "torch_first_step", "default", "default_resume", "muon", "muon_resume")


def _env(src: Path | None = None) -> dict[str, str]:
    # A job's variables would make the runs think they are in one; the bench's runs are plain processes.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HPCTRAIN_", "WANDB_"))}
    env["PYTHONUNBUFFERED"] = "1"
    if src is not None:  # another version's sources first on the path (--baseline-src)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(src), env.get("PYTHONPATH", "")) if p)
    return env


# The two floors: torch itself, and torch up to one optimizer step (its first step imports torch._dynamo).
FLOORS = {
    "import_torch": "import torch",
    "torch_first_step": "import torch; p = torch.nn.Parameter(torch.zeros(1)); o = torch.optim.Adam([p]); "
    "p.grad = torch.ones(1); o.step()",
}


def floor(code: str) -> float:
    """Seconds from launching `python -c CODE` to the end of CODE (not to the exit: torch's teardown would count)."""
    start = time.time()
    done = subprocess.run(
        [sys.executable, "-c", f"{code}; import time; print(time.time())"],
        check=True,
        env=_env(),
        capture_output=True,
        text=True,
    )
    return float(done.stdout.split()[-1]) - start


def _hop_record(run_dir: Path, hop: int) -> dict[str, object] | None:
    try:
        hops = json.loads((run_dir / "chain.json").read_text())
    except (OSError, ValueError):  # not there yet, or being replaced: ask again
        return None
    return hops[hop] if len(hops) > hop and "startup_seconds" in hops[hop] else None


def first_update(
    args: list[str], run_dir: Path, hop: int, src: Path | None = None, timeout: float = 300
) -> tuple[float, float]:
    """Launch `hpctrain train ARGS`, wait for its first update's record, stop it with USR1 (it saves and exits
    75). Returns (seconds from launch to the first update, the process's own startup_seconds)."""
    start = time.time()
    proc = subprocess.Popen(
        [*HPCTRAIN, "train", *args],
        env=_env(src),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    record = None
    try:
        while record is None:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"hpctrain train ended ({proc.returncode}) before its first update:\n"
                    f"{proc.stderr.read() if proc.stderr else ''}"
                )
            if time.time() - start > timeout:
                raise RuntimeError(f"no first update within {timeout:.0f} s")
            time.sleep(0.02)
            record = _hop_record(run_dir, hop)
        proc.send_signal(signal.SIGUSR1)
        _, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode not in (0, 75):
        raise RuntimeError(f"hpctrain train exited {proc.returncode}:\n{err}")
    at = float(record["start"]) + float(record["startup_seconds"])  # type: ignore[arg-type]
    return at - start, float(record["startup_seconds"])  # type: ignore[arg-type]


def _generate(data: Path) -> None:
    for split, files, events, seed in (("train", 2, 20000, 1), ("val", 1, 2000, 2)):
        subprocess.run(
            [*HPCTRAIN, "data", "generate", "--kind", "muons", "--out", str(data / split), "--files", str(files),
             "--events-per-file", str(events), "--seed", str(seed)],
            check=True, env=_env(), stdout=subprocess.DEVNULL,
        )  # fmt: skip


def one_round(
    tmp: Path, data: Path | None, index: int, baseline: Path | None
) -> dict[str, tuple[float, float]]:
    runs = tmp / "runs"
    common = [f"run.out_dir={runs}", "train.total_updates=1000000"]
    out: dict[str, tuple[float, float]] = {}
    for name, code in FLOORS.items():
        t = floor(code)
        out[name] = (t, t)
    versions: list[tuple[str, Path | None]] = [("", None)] + ([("baseline_", baseline)] if baseline else [])
    for prefix, src in versions:
        name = f"{prefix}default-{index}"
        out[f"{prefix}default"] = first_update([*common, f"run.name={name}"], runs / name, 0, src)
        out[f"{prefix}default_resume"] = first_update([*common, f"run.name={name}"], runs / name, 1, src)
    for prefix, src in versions if data is not None else []:
        name = f"{prefix}muon-{index}"
        muon = ["--config", str(REPO / "configs" / "muons.yaml"), *common, f"run.name={name}"]
        muon += [f"data.paths=[{data / 'train'}]", f"data.val_paths=[{data / 'val'}]"]  # type: ignore[operator]
        out[f"{prefix}muon"] = first_update(muon, runs / name, 0, src)
        out[f"{prefix}muon_resume"] = first_update(muon, runs / name, 1, src)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of every case; medians are reported")
    parser.add_argument("--no-muons", action="store_true", help="only the floors and the default job")
    parser.add_argument(
        "--baseline-src",
        type=Path,
        help="another version's src/ folder (e.g. from `git archive`): its starts run in the same rounds, "
        "and `*_over_baseline` ratios are reported",
    )
    args = parser.parse_args()
    rounds: list[dict[str, tuple[float, float]]] = []
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="hpctrain-startup-") as name:
        tmp = Path(name)
        data = None
        if not args.no_muons:
            data = tmp / "data"
            _generate(data)
        for index in range(args.rounds):
            rounds.append(one_round(tmp, data, index, args.baseline_src))
            shown = ", ".join(f"{k} {v[0]:.2f}" for k, v in rounds[-1].items())
            print(f"round {index + 1}/{args.rounds}: {shown} (load {os.getloadavg()[0]:.2f})", flush=True)
    load_after = os.getloadavg()[0]
    summary: dict[str, object] = {}
    print(f"\n{'case':24s} {'first update s':>14s} {'spread':>13s} {'in-process s':>13s}")
    for case in [c for c in CASES if c in rounds[0]] + [c for c in rounds[0] if c not in CASES]:
        outside = [r[case][0] for r in rounds]
        inside = [r[case][1] for r in rounds]
        median = statistics.median(outside)
        key = f"{case}_s" if case in FLOORS else f"{case}_first_update_s"
        summary[key] = round(median, 3)
        summary[key.removesuffix("_s") + "_spread"] = [round(min(outside), 3), round(max(outside), 3)]
        print(
            f"{case:24s} {median:14.2f} {min(outside):6.2f}..{max(outside):<6.2f}"
            f"{statistics.median(inside):13.2f}"
        )
    for case in CASES[2:] if args.baseline_src else []:
        if f"baseline_{case}" in rounds[0]:  # ratio within each round, then the median: baseline over ours
            ratios = [r[f"baseline_{case}"][0] / r[case][0] for r in rounds]
            summary[f"{case}_speedup_over_baseline"] = round(statistics.median(ratios), 3)
            summary[f"{case}_speedup_over_baseline_spread"] = [round(min(ratios), 3), round(max(ratios), 3)]
    summary["goal_default_s"] = GOAL
    summary["default_ratio"] = round(GOAL / float(summary["default_first_update_s"]), 3)  # type: ignore[arg-type]
    summary["default_over_import_torch"] = round(
        float(summary["default_first_update_s"]) / float(summary["import_torch_s"]),  # type: ignore[arg-type]
        3,
    )
    summary["default_over_torch_first_step"] = round(
        float(summary["default_first_update_s"]) / float(summary["torch_first_step_s"]),  # type: ignore[arg-type]
        3,
    )
    summary["rounds"] = args.rounds
    summary["load_average"] = [round(load_before, 2), round(load_after, 2)]
    print(f"goal: default first update <= {GOAL} s; load average {load_before:.2f} -> {load_after:.2f}")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
