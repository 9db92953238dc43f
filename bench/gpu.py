"""The GPU figures of issue 26 in one command: the WGAN step, the default muon model end to end, the loader alone,
a time-limited hop with compile on, and the per-update syncs and recompiles.

    python bench/gpu.py                        # on a GPU node: every figure (~10 minutes on an H100, estimated)
    python bench/gpu.py --device cpu --tiny    # the same code paths on CPU in seconds (the test suite runs this)
    python bench/gpu.py --only step            # one part: step | e2e | loader | hop | quality
    bash bench/gpu_lease.sh hop e2e loader     # on a lent GPU machine: the parts in turn, results kept as they end

Without a visible GPU the default (--device auto) runs the CPU check (--device cpu --tiny) and says so.
`--out FILE` keeps the figures so far in FILE after each part (a run stopped at a time limit keeps what ended);
`--merge FILE...` joins such files of separate calls into one JSON line. `--workdir DIR` keeps the generated data
there for the next call (the hop part starts from an empty compile cache whatever the folder holds). Each part's
seconds are in `part_seconds`.

Parts:
- step: the seed-size muon_wgan update (critic_steps 5, default networks) at batch 48000 (tiny: 96), GP off and GP
  every 2 critic updates, for `eager_fp32` (the trainer before compile was on: the baseline measured in the same
  run), `compiled_fp32` and `compiled_bf16`; median updates/s of --repeats timed rounds, peak memory, recompiles
  in the timed rounds, host-device syncs in one update (CUDA's sync debug mode), and each variant's losses after
  the same updates beside the baseline's. `*_ratio` = a variant's updates/s over eager_fp32's.
- e2e: `hpctrain train` of configs/muons.yaml (muon_flow) at batch 8192 (tiny: 256) with workers, compile off and
  auto: steady-state events/s and the data share from metrics.jsonl (the first log windows, which compile, left
  out), the compile seconds from summary.json.
- loader: the same training stream alone (same files, batch and workers): events/s it delivers, the share of
  batches in one buffer (one transfer) and page-locked (CUDA), and the main process's CPU per batch.
- hop: two hops (cold, then warm from the kept cache) with budget.time_limit (60 s; tiny: 25 s) and
  train.compile=auto (on CUDA the cold one compiles in the background while it trains eagerly), then a cold hop
  compiled in the training process as the baseline: updates done, their share of what the steady compiled rate
  (after the switch) would have done in the hop's training and compile time, and `background_gain_ratio`.
- quality: the default muon model (configs/muons.yaml, its own batch and schedule, 4000 updates; tiny: 60) on
  truth v2 with the periodic judge every 250 updates (tiny: 20): updates/s, events/s, the judge's `val_auc` per
  evaluation with its wall seconds since the start, the first update and second where it is <= 0.52 (the
  issue's goal: how long a real training takes to get there), and the final model's AUC overall and per energy
  bin from the classifier test on 50,000 fresh truth-v2 pairs (tiny: 2,000) as bench/muon_quality.py judges.
Last line: one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch  # imported by main() once the flags are checked: a mistyped flag costs no torch import

sys.path.insert(0, str(Path(__file__).resolve().parent))
REPO = Path(__file__).resolve().parents[1]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---- step -------------------------------------------------------------------------------------------------


def count_syncs(step: Any, device: torch.device) -> int | None:
    """Host-device synchronisations in one call of `step` (CUDA's sync debug mode warns at each one)."""
    if device.type != "cuda":
        return None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return sum(1 for w in caught if "synchroniz" in str(w.message).lower())


def step_variant(name: str, device: torch.device, batches: list, args: argparse.Namespace) -> dict[str, Any]:
    from muon_step import build

    from hpctrain.train.compile.policy import compile_network
    from hpctrain.train.compile.stats import compiled_graphs
    from hpctrain.train.context import Context
    from hpctrain.train.task import MicroBatch

    compiled, precision = name.startswith("compiled"), name.rsplit("_", 1)[1]
    out: dict[str, Any] = {}
    task, ctx = build(device, args.critic_steps, 0.0, 1, args.cap)
    if compiled:
        modules = {k: compile_network(m, "default", None, dynamic=True) for k, m in ctx.modules.items()}
        ctx = Context(device, modules, ctx.raw_modules, ctx.optimizers, "fp32", 10.0)
    ctx.dtype = {"bf16": torch.bfloat16}.get(precision)
    micro = [[MicroBatch(b, 1.0, len(b))] for b in batches]
    for label, lambda_gp, every in (("gp_off", 0.0, 1), ("gp_every_2", 10.0, 2)):
        task.cfg.model.lambda_gp, task.cfg.model.gp_every = lambda_gp, every
        start = time.perf_counter()
        for m in micro:  # warm-up: every batch size once (compiles, allocator)
            task.train_step(m, ctx)
        sync(device)
        warm = time.perf_counter() - start
        graphs = compiled_graphs()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        rounds = []
        for r in range(args.repeats):
            start = time.perf_counter()
            for _ in range(args.updates):
                result = task.train_step(micro[r % len(micro)], ctx)
            float(result.loss)
            sync(device)
            rounds.append(args.updates / (time.perf_counter() - start))
        figures: dict[str, Any] = {
            "updates_per_s": statistics.median(rounds),
            "updates_per_s_rounds": rounds,
            "events_per_s": statistics.median(rounds) * len(batches[0]),
            "muons_per_s": statistics.median(rounds) * batches[0].num_muons,
            "warmup_s": warm,
            "recompiles_timed": compiled_graphs() - graphs,
            "syncs_per_update": count_syncs(lambda: task.train_step(micro[0], ctx), device),
            "losses": {k: float(v) for k, v in result.metrics.items()} | {"critic_loss": float(result.loss)},
        }
        if device.type == "cuda":
            figures["peak_mem_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
        out[label] = figures
        print(
            f"step {name:<14} {label:<10}: {figures['updates_per_s']:.3f} updates/s (rounds "
            f"{', '.join(f'{x:.3f}' for x in rounds)}), warm-up {warm:.1f} s, recompiles {figures['recompiles_timed']}, "
            f"syncs/update {figures['syncs_per_update']}, peak {figures.get('peak_mem_gb', 0):.1f} GB",
            flush=True,
        )
    return out


def bench_step(device: torch.device, args: argparse.Namespace) -> dict[str, Any]:
    from muon_step import make_batch

    size = 96 if args.tiny else 48_000
    # two batch sizes, as a loader gives them (the muon count differs every batch)
    batches = [
        make_batch(size + d, args.cap, seed=s).to(device).normalize() for s, d in ((0, 0), (1, -size // 50))
    ]
    print(
        f"step: batch {len(batches[0])} events, {batches[0].num_muons} muons, critic_steps {args.critic_steps}"
    )
    # on CPU the compiled bf16 variant adds a minute of compiling and says nothing about a GPU
    variants = ["eager_fp32", "compiled_fp32"] + (["compiled_bf16"] if device.type == "cuda" else [])
    result: dict[str, Any] = {"batch": len(batches[0]), "muons": batches[0].num_muons}
    for name in variants:
        result[name] = step_variant(name, device, batches, args)
    for name in variants[1:]:
        for label in ("gp_off", "gp_every_2"):
            base = result["eager_fp32"][label]["updates_per_s"]
            result[f"{name}_{label}_ratio"] = result[name][label]["updates_per_s"] / base
    return result


# ---- end to end, loader, hop ------------------------------------------------------------------------------


def hpctrain(args: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpctrain", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def make_data(root: Path, tiny: bool, env: dict[str, str]) -> None:
    files, events = (2, 3000) if tiny else (4, 100_000)
    made = root / "data.json"  # what an earlier call with this --workdir generated
    wanted = {"files": files, "events_per_file": events}
    if made.is_file() and json.loads(made.read_text()) == wanted:
        return
    for split, seed, n in (("train", 1, files), ("val", 2, 1)):
        shutil.rmtree(root / split, ignore_errors=True)
        done = hpctrain(
            ["data", "generate", "--kind", "muons", "--out", str(root / split), "--files", str(n),
             "--events-per-file", str(events), "--seed", str(seed)],
            env, 600,
        )  # fmt: skip
        if done.returncode:
            raise SystemExit(f"data generate failed: {done.stderr[-2000:]}")
    made.write_text(json.dumps(wanted))


def train_args(root: Path, name: str, device: str, tiny: bool, extra: list[str]) -> list[str]:
    batch, workers = (256, 2) if tiny else (8192, 8)
    return [
        "train", "--config", str(REPO / "configs" / "muons.yaml"),
        f"run.out_dir={root / 'runs'}", f"run.name={name}", f"train.device={device}",
        f"data.paths=[{root / 'train'}]", f"data.val_paths=[{root / 'val'}]",
        f"data.batch_size={batch}", f"data.num_workers={workers}", "train.eval_every=0",
        "logging.progress=lines", "checkpoint.every=0", "checkpoint.resume=never", *extra,
    ]  # fmt: skip


def steady(run_dir: Path, skip_first: int) -> dict[str, Any]:
    """Median events/s and data share of the log windows after the first `skip_first` ones."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "events_per_s" in r]
    tail = rows[skip_first:] or rows[-1:]
    summary = json.loads((run_dir / "summary.json").read_text())

    def median(key: str) -> float | None:
        return statistics.median(r.get(key, 0.0) for r in tail) if tail else None

    return {
        "events_per_s": median("events_per_s"),
        "updates_per_s": median("updates_per_s"),
        "data_share": median("data_share"),
        "step_share": median("step_share"),
        "windows": len(tail),
        "steps": summary.get("step"),
        "summary": {k: summary[k] for k in ("status", "step", "seconds", "compile") if k in summary},
    }


def bench_e2e(root: Path, device: str, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    updates, every = (15, 5) if args.tiny else (400, 20)
    for mode in ("off", "auto"):
        extra = [f"train.total_updates={updates}", f"train.compile={mode}", f"logging.log_every={every}"]
        # the steady compiled rate: compiled in the training process from the first update (in the background,
        # the first ~40 s would run eagerly, most of these updates)
        extra.append("train.compile_background=false")
        done = hpctrain(train_args(root, f"e2e-{mode}", device, args.tiny, extra), env, 900)
        if done.returncode:
            raise SystemExit(f"e2e compile={mode} failed: {done.stderr[-3000:]}")
        out[f"compile_{mode}"] = steady(root / "runs" / f"e2e-{mode}", skip_first=2)
        print(f"e2e compile={mode}: {json.dumps(out[f'compile_{mode}'])}", flush=True)
    on, off = out["compile_auto"]["events_per_s"], out["compile_off"]["events_per_s"]
    out["compile_ratio"] = on / off if on and off else None
    return out


AUC_GOAL = 0.52  # the classifier test's goal overall (bench/muon_quality.py)


def bench_quality(root: Path, device: str, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    """The default muon model trained on truth v2 at its own settings, judged while it trains and at its end."""
    files, events, val_events = (1, 3000, 1000) if args.tiny else (2, 20_000, 5000)
    updates, every, pairs = (60, 20, 2000) if args.tiny else (4000, 250, 50_000)
    data = root / "v2"
    for split, seed, n, count in (("train", 1, files, events), ("val", 2, 1, val_events)):
        if not (data / split).is_dir():
            done = hpctrain(
                ["data", "generate", "--kind", "muons", "--truth", "v2", "--out", str(data / split), "--files",
                 str(n), "--events-per-file", str(count), "--seed", str(seed)],
                env, 600,
            )  # fmt: skip
            if done.returncode:
                raise SystemExit(f"data generate (v2) failed: {done.stderr[-2000:]}")
    run_dir = root / "runs" / "quality"
    shutil.rmtree(run_dir, ignore_errors=True)
    start = time.time()
    done = hpctrain(
        ["train", "--config", str(REPO / "configs" / "muons.yaml"), f"run.out_dir={root / 'runs'}",
         "run.name=quality", f"train.device={device}", f"data.paths=[{data / 'train'}]",
         f"data.val_paths=[{data / 'val'}]", f"train.total_updates={updates}", f"train.eval_every={every}",
         "checkpoint.every=0", "checkpoint.resume=never", "logging.progress=lines", "logging.log_every=50"],
        env, 3600,
    )  # fmt: skip
    if done.returncode:
        raise SystemExit(f"quality training failed: {done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    judged = [[r["step"], round(r["time"] - start, 1), r["val_auc"]] for r in rows if "val_auc" in r]
    reached = next(([step, seconds] for step, seconds, auc in judged if auc <= AUC_GOAL), None)
    from hpctrain.workloads.muons.evaluation import evaluate
    from hpctrain.workloads.muons.models import sampling

    model = sampling.load_model(run_dir, device)
    test = evaluate.classifier_on_truth(model, pairs, 778, truth="v2")
    out = steady(run_dir, skip_first=2)
    out.update(
        val_auc=judged,
        goal_reached=None if reached is None else {"update": reached[0], "seconds": reached[1]},
        train_seconds=round(time.time() - start, 1),
        auc=test.auc["all"],
        auc_per_bin={k: v for k, v in test.auc.items() if k != "all"},
        judge_pairs=pairs,
    )
    print(f"quality: {json.dumps(out)}", flush=True)
    return out


def bench_loader(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    from hpctrain.config.loading import ConfigRequest, load_config
    from hpctrain.runtime.env import ClusterEnv
    from hpctrain.workloads.registry import config_model, fill_default_types, make_task

    overrides = train_args(root, "loader", "cpu", args.tiny, [])[3:]
    cfg = load_config(
        ConfigRequest(str(REPO / "configs" / "muons.yaml"), None, overrides, None),
        config_model(),
        {},
        fill_default_types,
    )
    task = make_task(cfg, ClusterEnv())
    stream = task.train_stream(0)
    batches = 30 if args.tiny else 300
    try:
        it = iter(stream)
        for _ in range(3):
            next(it)
        usage = resource.getrusage(resource.RUSAGE_SELF)  # this process alone: the workers are children
        cpu = usage.ru_utime + usage.ru_stime
        start, events, pinned, one_buffer = time.perf_counter(), 0, 0, 0
        for _ in range(batches):
            batch = next(it)
            events += len(batch)
            one_buffer += batch.buffer() is not None  # moved to the GPU in one transfer
            pinned += torch.cuda.is_available() and batch.muons.is_pinned()  # asynchronously
        seconds = time.perf_counter() - start
        usage = resource.getrusage(resource.RUSAGE_SELF)
        cpu = usage.ru_utime + usage.ru_stime - cpu
    finally:
        stream.close()
    result = {"events_per_s": events / seconds, "batches": batches, "workers": cfg.data.num_workers,
              "one_buffer_share": one_buffer / batches, "pinned_share": pinned / batches,
              # the main process's CPU per batch (receiving, joining): the events/s it could take at most
              "main_cpu_ms_per_batch": 1e3 * cpu / batches, "main_ceiling_events_per_s": events / max(cpu, 1e-9)}  # fmt: skip
    print(f"loader alone: {result['events_per_s']:,.0f} events/s", flush=True)
    return result


def bench_hop(root: Path, device: str, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    """Two hops of one run with budget.time_limit and compile on: the first compiles from nothing, the second
    (resumed) finds the compiled code in <run.out_dir>/.compile-cache. On CUDA the first compiles in the
    background (train.compile_background) while the hop trains eagerly, the second in its own process (the cache
    holds the code). Then, as the baseline, a cold hop compiled in the training process, in a folder of its own
    (an empty cache): `background_gain_ratio` = the cold hop's updates over that one's. `updates_ratio` is a hop's
    updates over what the steady compiled rate (its log windows after the switch) would have done in its
    training and compile time: goal 4 asks >= 0.7."""
    seconds = args.hop_seconds or (25 if args.tiny else 60)
    extra = ["train.total_updates=1000000", "train.compile=auto",
             f"budget.time_limit={seconds // 60}:{seconds % 60:02d}", "budget.margin_seconds=5",
             "logging.log_every=50"]  # fmt: skip
    if device == "cpu":  # auto compiles on CUDA only; the CPU run checks the same code
        extra += ["train.compile=default", "train.compile_background=true"]
    if args.hop_background != "auto":
        extra.append(f"train.compile_background={args.hop_background}")
    hops = [("cold", "never", "runs", extra), ("warm", "auto", "runs", extra)]
    if args.hop_background != "false":
        # compile asked explicitly: `auto` would not compile in a hop under 10 minutes outside the background
        baseline = [*extra, "train.compile=default", "train.compile_background=false"]
        hops.append(("cold_in_process", "never", "runs-in-process", baseline))
    out: dict[str, Any] = {"limit_s": seconds}
    before = {"runs": 0, "runs-in-process": 0}
    for (
        folder
    ) in before:  # cold means cold, whatever an earlier call left in --workdir (the e2e part's cache)
        shutil.rmtree(root / folder / ".compile-cache", ignore_errors=True)
        shutil.rmtree(root / folder / "hop", ignore_errors=True)
    for hop, resume, folder, settings in hops:
        start = time.perf_counter()
        argv = train_args(root, "hop", device, args.tiny, settings)
        argv = [a if a != "checkpoint.resume=never" else f"checkpoint.resume={resume}" for a in argv]
        argv = [a if not a.startswith("run.out_dir=") else f"run.out_dir={root / folder}" for a in argv]
        done = hpctrain(argv, env, seconds + 600)
        wall = time.perf_counter() - start
        if done.returncode not in (0, 75):
            raise SystemExit(f"hop failed ({done.returncode}): {done.stderr[-3000:]}")
        run = root / folder / "hop"
        summary = json.loads((run / "summary.json").read_text())
        timing = summary.get("seconds", {})
        compile_s = float(timing.get("compile", 0.0))
        training = float(timing.get("data", 0.0)) + float(timing.get("step", 0.0))
        updates = int(summary.get("step") or 0) - before[folder]
        made = summary.get("compile") or {}
        switched = before[folder] + int((made.get("background") or {}).get("eager_updates", 0))
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
        # log windows of this hop after the switch to compiled networks (the first one holds the switch)
        after = [r["updates_per_s"] for r in rows if "updates_per_s" in r and r["step"] > switched + 50]
        compiled_rate = statistics.median(after) if after else None
        ideal = compiled_rate * (training + compile_s) if compiled_rate else None
        before[folder] += updates
        out[hop] = {
            "wall_s": wall,
            "exit": done.returncode,
            "updates": updates,
            "compile_s": compile_s,
            "training_s": training,
            "compiled_updates_per_s": compiled_rate,
            "updates_ratio": updates / ideal if ideal else None,
            "stopped_before_deadline": done.returncode == 75 and wall < seconds + 30,
            "compile": made,  # graphs, the caches' hits and misses (warm: all hits), the background helper
        }
        print(f"hop {hop}: {json.dumps(out[hop])}", flush=True)
    if "cold_in_process" in out and out["cold_in_process"]["updates"]:
        out["background_gain_ratio"] = out["cold"]["updates"] / out["cold_in_process"]["updates"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="auto: cuda when a GPU is visible, else the CPU check (cpu, --tiny)",
    )
    parser.add_argument("--tiny", action="store_true", help="small sizes: the code paths in seconds")
    parser.add_argument("--only", choices=["step", "e2e", "loader", "hop", "quality"], action="append")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--updates", type=int, default=3, help="updates per timed round (step)")
    parser.add_argument("--critic-steps", type=int, default=5)
    parser.add_argument("--cap", type=int, default=2000)
    parser.add_argument(
        "--hop-background",
        choices=["auto", "true", "false"],
        default="auto",
        help="train.compile_background in the hop part (auto: on CUDA; false: compile in the training process)",
    )
    parser.add_argument(
        "--hop-seconds", type=int, default=None, help="the hop's time limit (default 60; tiny 25)"
    )
    parser.add_argument("--workdir", default=None, help="data and runs here (default: a temporary folder)")
    parser.add_argument(
        "--out", default=None, help="the figures so far, written to this file after each part"
    )
    parser.add_argument("--merge", nargs="+", metavar="FILE", help="join the --out files of separate calls")
    args = parser.parse_args()
    check_args(args)
    if args.merge:
        merge(args.merge, args.out)
        return
    global torch  # the module's functions use it: imported after the flags are checked (seconds on 2 cores)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda: no CUDA device visible (use --device cpu --tiny)", file=sys.stderr)
        raise SystemExit(2)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
        if args.device == "cpu" and not args.tiny:
            print("no CUDA device visible: the CPU check of the same code (--device cpu --tiny)", flush=True)
            args.tiny = True
    device = torch.device(args.device)
    parts = args.only or ["step", "e2e", "loader", "hop", "quality"]
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                              "torch": torch.__version__, "tiny": args.tiny, "part_seconds": {}}  # fmt: skip
    # the runs' compile caches are the bench's to choose (cold or warm), not an inherited folder's
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])
    out = Path(args.out) if args.out else None

    def run(part: str, measure: Any) -> None:
        start = time.perf_counter()
        value = measure()
        if value is not None:  # the data part makes files, no figures
            result[part] = value
        result["part_seconds"][part] = round(time.perf_counter() - start, 1)
        if out is not None:  # kept as each part ends: a run stopped at a time limit keeps the parts before
            out.parent.mkdir(parents=True, exist_ok=True)
            out.with_suffix(".tmp").write_text(json.dumps(result))
            os.replace(out.with_suffix(".tmp"), out)

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.workdir or tmp)
        root.mkdir(parents=True, exist_ok=True)
        if "step" in parts:
            run("step", lambda: bench_step(device, args))
        if {"e2e", "loader", "hop"} & set(parts):
            run("data", lambda: make_data(root, args.tiny, env))
        if "hop" in parts:  # before e2e: its cold hop starts from an empty cache, which e2e then finds warm
            run("hop", lambda: bench_hop(root, args.device, args, env))
        if "e2e" in parts:
            run("e2e", lambda: bench_e2e(root, args.device, args, env))
        if "loader" in parts:
            run("loader", lambda: bench_loader(root, args))
        if "quality" in parts:
            run("quality", lambda: bench_quality(root, args.device, args, env))
    across_parts(result)
    if out is not None:
        out.write_text(json.dumps(result))
    print(json.dumps(result))


def refuse(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def check_args(args: argparse.Namespace) -> None:
    """Every flag a user can get wrong: one line, exit 2, before a minute of data and compiling is spent."""
    for flag in ("repeats", "updates", "critic_steps", "cap"):
        if getattr(args, flag) < 1:
            refuse(f"--{flag.replace('_', '-')} must be at least 1, not {getattr(args, flag)}")
    if args.hop_seconds is not None and args.hop_seconds < 15:  # the hop's stop margin is 5 s
        refuse(f"--hop-seconds must be at least 15, not {args.hop_seconds}")
    if args.workdir is not None and Path(args.workdir).exists() and not Path(args.workdir).is_dir():
        refuse(f"--workdir {args.workdir} is not a folder")
    if args.out is not None and Path(args.out).is_dir():
        refuse(f"--out {args.out} is a folder: name the JSON file to write")


def across_parts(result: dict[str, Any]) -> None:
    """Figures that take two parts: the loader's events/s over what the compiled run consumed (goal 5)."""
    consumed = result.get("e2e", {}).get("compile_auto", {}).get("events_per_s")
    if consumed and "loader" in result:
        result["loader_over_consumed_ratio"] = result["loader"]["events_per_s"] / consumed


def merge(files: list[str], out: str | None) -> None:
    """One JSON of the parts that separate calls wrote with --out (bench/gpu_lease.sh), on one machine."""
    result: dict[str, Any] = {"part_seconds": {}}
    for name in files:
        try:
            part = json.loads(Path(name).read_text())
        except (OSError, ValueError) as e:
            part = f"{e}"
        if not isinstance(part, dict) or not {"device", "torch", "part_seconds"} <= part.keys():
            why = part if isinstance(part, str) else f"a JSON {type(part).__name__}, not an object"
            why = "not its keys device, torch, part_seconds" if isinstance(part, dict) else why
            print(f"error: --merge {name}: not a figures file of bench/gpu.py ({why})", file=sys.stderr)
            raise SystemExit(2)
        for key in ("device", "torch", "tiny"):
            if key in result and part.get(key) != result[key]:
                print(f"error: --merge {name}: {key} {part.get(key)!r}, not {result[key]!r} as in {files[0]}",
                      file=sys.stderr)  # fmt: skip
                raise SystemExit(2)
            result[key] = part.get(key)
        result["part_seconds"].update(part.get("part_seconds", {}))
        result.update({k: v for k, v in part.items() if k in ("step", "e2e", "loader", "hop", "quality")})
    across_parts(result)
    if out is not None:
        try:
            Path(out).write_text(json.dumps(result))
        except OSError as e:
            print(f"error: --out {out}: {e.strerror or e}", file=sys.stderr)
            raise SystemExit(2) from None
    print(json.dumps(result))


if __name__ == "__main__":
    main()
