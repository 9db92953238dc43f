"""Sampling speed of a muon generator on CPU against the synthetic-truth process (a stand-in for simulation).

    python bench/muon_sample.py [--model RUN_DIR] [--events 65536] [--batch-sizes 1024,4096,16384,65536]

Without --model, trains configs/muons.yaml for --updates updates on fresh truth data first (realistic
multiplicities matter: time goes with the muons). For each batch size, `hpctrain sample RUN --n-events N
--batch-size B` runs as its own process (streamed to Parquet), timed end to end and for the generation alone
(the line the command prints), with its peak resident memory. The truth process draws the same number of events
(`hpctrain data generate --kind muons`, one file) in its own process. Figures: bundles/s and muons/s. Last line:
one JSON object; `ratio` = the best bundles/s of the sampler / the truth process's bundles/s.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PEAK = """
import resource, sys
from hpctrain.cli import main
code = main(sys.argv[1:])
print("PEAK_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
sys.exit(code)
"""


def timed(args: list[str], threads: int) -> tuple[float, int, str]:
    """(seconds, peak kB, stdout) of one hpctrain process."""
    env_threads = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    import os

    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", PEAK, *args], capture_output=True, text=True, env={**os.environ, **env_threads}
    )
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args[:2])} failed: {proc.stderr[-2000:]}")
    return seconds, int(proc.stdout.split("PEAK_KB")[1].split()[0]), proc.stdout


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", help="run folder or checkpoint of a muon_wgan model (default: train one)")
    parser.add_argument(
        "--updates", type=int, default=200, help="updates of the model trained without --model"
    )
    parser.add_argument("--events", type=int, default=65536, help="events per measurement")
    parser.add_argument("--batch-sizes", default="1024,4096,16384,65536", help="comma-separated batch sizes")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads (OMP/MKL)")
    parser.add_argument("--keep", help="work in this folder (kept) instead of a temporary one")
    args = parser.parse_args()

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="muon_sample_"))
    work.mkdir(parents=True, exist_ok=True)
    hp = [sys.executable, "-m", "hpctrain"]
    model = args.model
    if model is None:
        if not (work / "train").is_dir():
            subprocess.run(
                [*hp, "data", "generate", "--kind", "muons", "--out", str(work / "train"), "--files", "1",
                 "--events-per-file", "20000", "--seed", "1"], check=True, capture_output=True,
            )  # fmt: skip
        subprocess.run(
            [*hp, "train", "-c", str(REPO / "configs" / "muons.yaml"), f"run.out_dir={work}", "run.name=model",
             f"data.paths=[{work / 'train'}]", "data.val_paths=[]", f"train.total_updates={args.updates}",
             "train.eval_every=0", "checkpoint.every=0", f"train.threads={args.threads}"],
            check=True, capture_output=True, cwd=work,
        )  # fmt: skip
        model = str(work / "model")

    truth_s, truth_kb, _ = timed(
        ["data", "generate", "--kind", "muons", "--out", str(work / "truth"), "--files", "1",
         "--events-per-file", str(args.events), "--seed", "9"], args.threads,
    )  # fmt: skip
    truth_muons = int(re.search(r"(\d+) muons", _).group(1))  # type: ignore[union-attr]
    rows = []
    print(f"{'what':<22}{'seconds':>9}{'bundles/s':>12}{'muons/s':>12}{'peak MB':>9}")
    print(
        f"{'truth process':<22}{truth_s:>9.1f}{args.events / truth_s:>12.0f}{truth_muons / truth_s:>12.0f}"
        f"{truth_kb / 1024:>9.0f}"
    )
    for batch in [int(b) for b in args.batch_sizes.split(",")]:
        out = work / f"gen_{batch}.parquet"
        seconds, kb, text = timed(
            ["sample", model, "--n-events", str(args.events), "--batch-size", str(batch), "--out", str(out),
             "--device", "cpu", "--seed", "1"], args.threads,
        )  # fmt: skip
        match = re.search(r"wrote (\d+) events, (\d+) muons .*, ([\d.]+) s\)", text)
        assert match is not None, text
        muons, inner = int(match.group(2)), float(match.group(3))
        row = {
            "batch_size": batch,
            "seconds": round(seconds, 2),
            "generate_seconds": inner,
            "bundles_per_s": args.events / seconds,
            "muons_per_s": muons / seconds,
            "peak_mb": kb / 1024,
        }
        rows.append(row)
        print(
            f"{f'sample batch {batch}':<22}{seconds:>9.1f}{row['bundles_per_s']:>12.0f}{row['muons_per_s']:>12.0f}"
            f"{row['peak_mb']:>9.0f}"
        )
    best = max(rows, key=lambda r: r["bundles_per_s"])
    truth = {"seconds": round(truth_s, 2), "bundles_per_s": args.events / truth_s, "peak_mb": truth_kb / 1024}
    truth["muons_per_s"] = truth_muons / truth_s
    ratio = best["bundles_per_s"] / truth["bundles_per_s"]
    print(f"best sampler / truth process (bundles/s, whole process incl. start-up) = {ratio:.2f}")
    print(json.dumps({"events": args.events, "model": model, "truth": truth, "sample": rows, "ratio": ratio}))


if __name__ == "__main__":
    main()
