"""Sampling speed of a muon generator on CPU against the synthetic-truth process (a stand-in for simulation), and
of the default muon model against the one before it (independent muons given the primary and N).

    python bench/muon_sample.py [--model RUN_DIR] [--events 65536] [--batch-sizes 1024,4096,16384,65536]
                                [--previous RUN_DIR | --no-previous] [--previous-src CHECKOUT]

Without --model, trains configs/muons.yaml for --updates updates on fresh truth data first (realistic
multiplicities matter: time goes with the muons), and (unless --no-previous) the previous default, the same
config with `model.latent=0 model.leading_muon=false`, on the same data. For each batch size, `hpctrain sample
RUN --n-events N --batch-size B` runs as its own process (streamed to Parquet), timed end to end and for the
generation alone (the line the command prints), with its peak resident memory. The truth process draws the same
number of events (`hpctrain data generate --kind muons`, one file) in its own process. In this process, the
milliseconds per event of `Sampler.generate` at batch 1, 100 and 10,000 (the model loaded once). Figures:
bundles/s and muons/s. Last line: one JSON object; `ratio` = the best bundles/s of the sampler / the truth
process's bundles/s; `previous_ratio` = the model's bundles/s at batch 1,024 (or the first batch size) / the
previous default's (higher is better: >= 1 is no slower); `ms_per_event` {batch: ms} for each model.
`--previous-src CHECKOUT` samples the previous default with the hpctrain of another checkout (its `src/` first on
PYTHONPATH; e.g. `git worktree add CHECKOUT <commit>`): what a user had on the day the goal was set, against
the new default on this code (`previous_src` in the JSON names it).
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
PREVIOUS = ["model.latent=0", "model.leading_muon=false"]  # the default muon model before 2026-11-28
PEAK = """
import resource, sys
from hpctrain.cli import main
code = main(sys.argv[1:])
print("PEAK_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
sys.exit(code)
"""


def timed(args: list[str], threads: int, env: dict[str, str] | None = None) -> tuple[float, int, str]:
    """(seconds, peak kB, stdout) of one hpctrain process (`env`: added to this one's environment)."""
    env_threads = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), **(env or {})}

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
    parser.add_argument(
        "--previous", help="run folder of the previous default to compare (default: train one)"
    )
    parser.add_argument("--no-previous", action="store_true", help="no comparison with the previous default")
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed runs per batch size (the median is kept)"
    )
    parser.add_argument(
        "--previous-src", help="checkout whose hpctrain samples the previous default (its src/ on PYTHONPATH)"
    )
    parser.add_argument("--per-event", help=argparse.SUPPRESS)  # internal: one model's ms per event, as JSON
    args = parser.parse_args()
    if args.per_event:
        print(json.dumps(per_event_ms({"previous": args.per_event}, args.threads)["previous"]))
        return
    if args.previous_src:
        found = subprocess.run(
            [sys.executable, "-c", "import hpctrain; print(hpctrain.__file__)"], capture_output=True, text=True,
            env={**os.environ, **_code_of(args.previous_src)},
        )  # fmt: skip
        if not found.stdout.strip().startswith(str(Path(args.previous_src).resolve() / "src")):
            raise SystemExit(f"--previous-src {args.previous_src}: no hpctrain of that checkout imported")
    if args.events < 1 or args.updates < 1 or args.threads < 1 or args.repeats < 1:
        raise SystemExit("--events, --updates, --threads and --repeats must be at least 1")

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="muon_sample_"))
    work.mkdir(parents=True, exist_ok=True)
    hp = [sys.executable, "-m", "hpctrain"]
    if (args.model is None or (args.previous is None and not args.no_previous)) and not (
        work / "train"
    ).is_dir():
        subprocess.run(
            [*hp, "data", "generate", "--kind", "muons", "--out", str(work / "train"), "--files", "1",
             "--events-per-file", "20000", "--seed", "1"], check=True, capture_output=True,
        )  # fmt: skip

    def train(name: str, extra: list[str]) -> str:
        subprocess.run(
            [*hp, "train", "-c", str(REPO / "configs" / "muons.yaml"), f"run.out_dir={work}", f"run.name={name}",
             f"data.paths=[{work / 'train'}]", "data.val_paths=[]", f"train.total_updates={args.updates}",
             "train.eval_every=0", "checkpoint.every=0", f"train.threads={args.threads}", *extra],
            check=True, capture_output=True, cwd=work,
        )  # fmt: skip
        return str(work / name)

    model = args.model or train("model", [])
    previous = None if args.no_previous else args.previous or train("previous", PREVIOUS)

    truth_s, truth_kb, _ = timed(
        ["data", "generate", "--kind", "muons", "--out", str(work / "truth"), "--files", "1",
         "--events-per-file", str(args.events), "--seed", "9", "--overwrite"], args.threads,
    )  # fmt: skip
    truth_muons = int(re.search(r"(\d+) muons", _).group(1))  # type: ignore[union-attr]
    rows = []
    print(f"{'what':<22}{'seconds':>9}{'bundles/s':>12}{'muons/s':>12}{'peak MB':>9}")
    print(
        f"{'truth process':<22}{truth_s:>9.1f}{args.events / truth_s:>12.0f}{truth_muons / truth_s:>12.0f}"
        f"{truth_kb / 1024:>9.0f}"
    )
    batches = [int(b) for b in args.batch_sizes.split(",")]
    # the first batch size: the two models' processes interleaved (model, previous, previous, model, ...), so a
    # change of the machine's load during the run falls on both alike
    first = sample_rows(
        {"sample": model, **({"previous": previous} if previous else {})}, work, batches[0], args
    )
    rows.append(first["sample"])
    for batch in batches[1:]:
        rows.append(sample_rows({"sample": model}, work, batch, args)["sample"])
    previous_rows = [first["previous"]] if previous else []
    best = max(rows, key=lambda r: r["bundles_per_s"])
    truth = {"seconds": round(truth_s, 2), "bundles_per_s": args.events / truth_s, "peak_mb": truth_kb / 1024}
    truth["muons_per_s"] = truth_muons / truth_s
    ratio = best["bundles_per_s"] / truth["bundles_per_s"]
    print(f"best sampler / truth process (bundles/s, whole process incl. start-up) = {ratio:.2f}")
    figures: dict[str, object] = {"events": args.events, "model": model, "truth": truth, "sample": rows}
    figures["ratio"] = ratio
    if previous is not None and args.previous_src:  # the previous default timed on its own code
        figures["ms_per_event"] = per_event_ms({"model": model}, args.threads)
        done = subprocess.run(
            [sys.executable, __file__, "--per-event", previous, "--threads", str(args.threads)],
            capture_output=True, text=True, env={**os.environ, **_code_of(args.previous_src)}, check=True,
        )  # fmt: skip
        figures["ms_per_event"]["previous"] = {int(k): v for k, v in json.loads(done.stdout).items()}  # type: ignore[index]
        figures["previous_src"] = args.previous_src
    else:
        figures["ms_per_event"] = per_event_ms(
            {"model": model, **({"previous": previous} if previous else {})}, args.threads
        )
    if previous is not None:
        figures["previous"] = previous_rows
        figures["previous_ratio"] = rows[0]["bundles_per_s"] / previous_rows[0]["bundles_per_s"]
        print(
            f"model / previous default at batch {batches[0]} (bundles/s, median of {args.repeats}) = "
            f"{figures['previous_ratio']:.2f}"
        )
    for who, ms in figures["ms_per_event"].items():  # type: ignore[attr-defined]
        print(f"{who}: ms per event " + ", ".join(f"batch {b}: {v:.3f}" for b, v in ms.items()))
    print(json.dumps(figures))


def _code_of(checkout: str) -> dict[str, str]:
    """The environment in which `python -c/-m` imports the hpctrain of `checkout` before the installed one."""
    src = str(Path(checkout).resolve() / "src")
    return {"PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH", "")) if p)}


def sample_rows(models: dict[str, str], work: Path, batch: int, args: argparse.Namespace) -> dict[str, dict]:
    """For each model (who -> run folder), the median of `args.repeats` `hpctrain sample` processes at this
    batch size; the models' processes interleaved, in an order that turns each repeat (ABBA...)."""
    runs: dict[str, list[tuple[float, int, int, float]]] = {who: [] for who in models}
    for repeat in range(args.repeats):
        order = list(models) if repeat % 2 == 0 else list(reversed(models))
        for who in order:
            out = work / f"gen_{who}_{batch}.parquet"
            code = _code_of(args.previous_src) if who == "previous" and args.previous_src else None
            seconds, kb, text = timed(
                ["sample", models[who], "--n-events", str(args.events), "--batch-size", str(batch), "--out",
                 str(out), "--device", "cpu", "--seed", "1", "--overwrite"], args.threads, code,
            )  # fmt: skip
            match = re.search(r"wrote (\d+) events, (\d+) muons .*, ([\d.]+) s\)", text)
            assert match is not None, text
            runs[who].append((seconds, kb, int(match.group(2)), float(match.group(3))))
    return {who: _row(who, batch, got, args) for who, got in runs.items()}


def _row(who: str, batch: int, runs: list[tuple[float, int, int, float]], args: argparse.Namespace) -> dict:
    seconds, kb, muons, inner = sorted(runs)[len(runs) // 2]
    row = {
        "batch_size": batch,
        "seconds": round(seconds, 2),
        "seconds_min_max": [round(min(r[0] for r in runs), 2), round(max(r[0] for r in runs), 2)],
        "generate_seconds": inner,
        "bundles_per_s": args.events / seconds,
        "muons_per_s": muons / seconds,
        "peak_mb": kb / 1024,
    }
    label = f"{who} batch {batch}"
    print(
        f"{label:<22}{seconds:>9.1f}{row['bundles_per_s']:>12.0f}{row['muons_per_s']:>12.0f}{row['peak_mb']:>9.0f}"
    )
    return row


def per_event_ms(models: dict[str, str], threads: int) -> dict[str, dict[int, float]]:
    """For each model, milliseconds per event of Sampler.generate in this process at batch 1, 100 and 10,000
    (median of 3; the models loaded and warmed first, then timed in turn, so neither pays the process's
    warm-up)."""
    import numpy as np
    import torch

    import hpctrain
    from hpctrain.workloads.muons.truth import v1 as truth

    torch.set_num_threads(threads)
    samplers = {who: hpctrain.load(path, device="cpu").sampler for who, path in models.items()}
    rng = np.random.default_rng(3)
    times: dict[str, dict[int, list[float]]] = {who: {} for who in models}
    for batch, calls in ((1, 200), (100, 20), (10_000, 2)):
        primaries = truth.sample_primaries(batch, rng)
        for sampler in samplers.values():
            sampler.generate(primaries, seed=0, batch_size=batch)  # warm
        for _ in range(3):
            for who, sampler in samplers.items():
                start = time.perf_counter()
                for i in range(calls):
                    sampler.generate(primaries, seed=i, batch_size=batch)
                elapsed = (time.perf_counter() - start) / (calls * batch) * 1000.0
                times[who].setdefault(batch, []).append(elapsed)
    return {who: {b: float(sorted(t)[1]) for b, t in got.items()} for who, got in times.items()}


if __name__ == "__main__":
    main()
