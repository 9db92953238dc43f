"""Quality of the default muon WGAN after a bounded CPU training, against a trivial unconditional baseline.

    python bench/muon_quality.py [--minutes 8] [--events 20000] [--eval-events 10000] [--keep DIR]

Generates synthetic-truth data, trains configs/muons.yaml on CPU for at most --minutes (the time budget stops
the run cleanly), then compares, on fresh truth events, (a) the model's bundles and (b) a baseline that ignores
the primary: multiplicities drawn from the training set's marginal, muons drawn from the pool of all training
muons. Figure: the conditional W1 (mean over multiplicity, log-energy and lateral distance, per primary-energy
bin; see hpctrain.workloads.muons.evaluate). `ratio` = baseline / ours; goal >= 2. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
GOAL = 2.0


def baseline_events(train_dir: Path, primaries: np.ndarray, cap: int, seed: int):  # type: ignore[no-untyped-def]
    """Bundles that ignore the primary: counts from the marginal, muons from the pooled training muons."""
    from hpctrain.workloads.muons import layouts

    parts = [layouts.read_all(str(p))[1] for p in sorted(train_dir.glob("*.parquet"))]
    data = layouts.concat_events(parts)
    keep = data.counts <= cap
    counts_pool = data.counts[keep]
    muon_pool = data.muons[np.repeat(keep, data.counts)]
    rng = np.random.default_rng(seed)
    counts = rng.choice(counts_pool, size=len(primaries))
    muons = muon_pool[rng.integers(0, len(muon_pool), int(counts.sum()))]
    ids = np.stack([np.zeros(len(primaries), np.int64), np.arange(len(primaries))], 1)
    return layouts.Events(primaries.astype(np.float32), muons, counts.astype(np.int64), ids)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=8.0, help="training time budget (default 8)")
    parser.add_argument("--events", type=int, default=20000, help="training events per file (2 files)")
    parser.add_argument("--eval-events", type=int, default=10000, help="fresh truth events compared")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--keep", help="work in this folder (kept) instead of a temporary one")
    parser.add_argument("overrides", nargs="*", help="extra config overrides for the training")
    args = parser.parse_args()

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="muon_quality_"))
    work.mkdir(parents=True, exist_ok=True)
    hp = [sys.executable, "-m", "hpctrain"]
    start = time.perf_counter()
    for split, files, n, seed in (("train", 2, args.events, 1), ("val", 1, 2000, 2)):
        if not (work / split).is_dir():
            subprocess.run(
                [*hp, "data", "generate", "--kind", "muons", "--out", str(work / split), "--files", str(files),
                 "--events-per-file", str(n), "--seed", str(seed)],
                check=True, capture_output=True, text=True,
            )  # fmt: skip
    h, rest = divmod(int(args.minutes * 60), 3600)
    limit = f"{h:02d}:{rest // 60:02d}:{rest % 60:02d}"
    train = [
        *hp, "train", "-c", str(REPO / "configs" / "muons.yaml"), f"run.out_dir={work / 'logs'}", "run.name=quality",
        f"data.paths=[{work / 'train'}]", f"data.val_paths=[{work / 'val'}]", "train.total_updates=100000",
        f"train.threads={args.threads}", f"budget.time_limit={limit}", "budget.margin_seconds=5",
        "train.eval_every=0", "checkpoint.every=0", "logging.log_every=100", *args.overrides,
    ]  # fmt: skip
    proc = subprocess.run(train, capture_output=True, text=True, cwd=work)
    if proc.returncode not in (0, 75):
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"training failed with exit code {proc.returncode}")
    train_seconds = time.perf_counter() - start

    import torch

    from hpctrain.workloads.muons import evaluate, sampling
    from hpctrain.workloads.muons.task import muon_cap

    torch.set_num_threads(args.threads)
    model = sampling.load_model(work / "logs" / "quality", "cpu")
    cap = muon_cap(model.cfg)
    ours = evaluate.evaluate_model(model, args.eval_events, seed=777)
    true, _ = evaluate.truth_events(args.eval_events, 777, cap)
    base = evaluate.compare(baseline_events(work / "train", true.primaries, cap, 778), true)
    om, bm = ours["metrics"], base["metrics"]
    print(
        f"trained {model.step} updates in {train_seconds:.0f} s (CPU, {args.threads} threads); work folder {work}"
    )
    print(f"{'figure':<28}{'ours':>10}{'baseline':>10}")
    for key in ("w1_multiplicity", "w1_energy", "w1_lateral_distance", "ks_multiplicity", "ks_energy",
                "ks_lateral_distance", "conditional_w1"):  # fmt: skip
        print(f"{key:<28}{om[key]:>10.4f}{bm[key]:>10.4f}")
    per_feature = {}
    for name in evaluate.FEATURES:
        mine = [row[f"w1_{name}"] for row in ours["per_bin"] if row["events_true"] >= 20]
        theirs = [row[f"w1_{name}"] for row in base["per_bin"] if row["events_true"] >= 20]
        per_feature[name] = {"ours": float(np.nanmean(mine)), "baseline": float(np.nanmean(theirs))}
    ratio = bm["conditional_w1"] / om["conditional_w1"]
    print(f"conditional W1 ratio baseline/ours = {ratio:.2f} (goal >= {GOAL})")
    print(
        json.dumps(
            {
                "updates": model.step,
                "train_seconds": round(train_seconds, 1),
                "conditional_w1": om["conditional_w1"],
                "baseline_conditional_w1": bm["conditional_w1"],
                "per_feature_conditional_w1": per_feature,
                "ratio": ratio,
                "goal": GOAL,
                "passed": ratio >= GOAL,
            }
        )
    )


if __name__ == "__main__":
    main()
