"""The README's quick start, timed as a newcomer runs it: clone to a first muon model and its evaluation page.

    python bench/quick_start.py [--rounds 3]

Each round copies the project's configs and docs into a new folder and runs the shell lines of README.md's
section "A first muon model" there, in order and as written (the same lines tests/docs/test_docs_commands.py
runs), with the `hpctrain` of this environment on the PATH and `MPLBACKEND=Agg`. `make install` is not timed
(the README gives it apart). Per command and in total: the median and spread (min..max) over the rounds. The
promise is about 5 minutes on 2 cores: `promise_ratio` = 300 s / the median total (>= 1 keeps it). The LAST line
printed is one JSON object with the figures and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.docs.commands import commands  # noqa: E402  (the one parser of the documents' shell lines)

SECTION = "## A first muon model"
PROMISE_S = 300.0


def quick_start_lines() -> list[str]:
    """The shell lines of README.md's quick-start section, in order."""
    readme = REPO / "README.md"
    text = readme.read_text().splitlines()
    start = next(i for i, line in enumerate(text, 1) if line.startswith(SECTION))
    end = next((i for i, line in enumerate(text, 1) if i > start and line.startswith("## ")), len(text) + 1)
    return [c.text for c in commands(readme) if start < c.line < end and not c.not_here]  # no install


def one_round(lines: list[str]) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPCTRAIN_", "SLURM_"))}
    env.pop("TOTAL_UPDATES", None)
    env["MPLBACKEND"] = "Agg"
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="hpctrain-quick-") as tmp:
        for name in ("configs", "README.md"):
            src = REPO / name
            (shutil.copytree if src.is_dir() else shutil.copy2)(src, Path(tmp) / name)
        for line in lines:
            began = time.perf_counter()
            done = subprocess.run(["bash", "-c", line], cwd=tmp, env=env, capture_output=True, text=True)
            seconds[line] = time.perf_counter() - began
            if done.returncode != 0:
                raise SystemExit(f"{line}: exit {done.returncode}\n{done.stderr[-2000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    lines = quick_start_lines()
    load_before = os.getloadavg()[0]
    rounds = []
    for number in range(args.rounds):
        rounds.append(one_round(lines))
        total = sum(rounds[-1].values())
        print(f"round {number + 1}: {total:.1f} s (load {os.getloadavg()[0]:.1f})", flush=True)
    per_command = {}
    for line in lines:
        values = [r[line] for r in rounds]
        per_command[line] = [round(statistics.median(values), 1), min(values), max(values)]
        print(f"{statistics.median(values):7.1f} s ({min(values):.1f}..{max(values):.1f})  {line}")
    totals = [sum(r.values()) for r in rounds]
    median = statistics.median(totals)
    print(
        json.dumps(
            {
                "total_s": round(median, 1),
                "total_spread_s": [round(min(totals), 1), round(max(totals), 1)],
                "per_command_s": {k: [round(x, 1) for x in v] for k, v in per_command.items()},
                "promise_s": PROMISE_S,
                "promise_ratio": round(PROMISE_S / median, 3),
                "rounds": args.rounds,
                "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)],
            }
        )
    )


if __name__ == "__main__":
    main()
