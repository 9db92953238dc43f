"""How cost grows: files, ranks, checkpoint size, DDP ranks and logging, each measured side by side in one run.

    python bench/scaling.py [--sections files,ranks,checkpoint,ddp,tracking] [--max-checkpoint-mb 256]

Prints one small table per section, then as its LAST line one JSON object. Sections:

- files: the same 51,200 events split into 1, 4, 16, 64 and 256 Parquet files: index build time and resident
  memory per file (EventStream construction), then one shuffled epoch with 0 workers (events/s).
  `files256_over_1_ratio` = events/s with 256 files over 1 file.
- ranks: 1 and 2 ranks (processes joined by gloo on this machine), each reading its share of one epoch of the
  4-file set; aggregate events/s = all events over the slowest rank's time. `ranks2_over_1_ratio`.
- checkpoint: CheckpointStore.save and load_latest of a state of 1 MB .. --max-checkpoint-mb (default 256 MB,
  so that the section stays near a minute; 1024 for the 1 GB point), against the disk's own rate for the same
  bytes in the same folder (write + fsync), measured right before each save. `checkpoint_save_ratio` = save
  MB/s over the disk's MB/s at the largest size. Loads read from the page cache (the file was just written).
- ddp: one muon_wgan update (critic_steps 2, GP every 2, 64 events per rank, one torch thread per rank) with
  the networks in DistributedDataParallel over gloo, 1 vs 2 ranks. `ddp2_over_1_ratio` = events/s of 2 ranks
  over 1 (2.0 would be perfect scaling).
- tracking: the cost of one logged step (20 scalars) to TensorBoard (SummaryWriter) and to metrics.jsonl,
  in microseconds, and as a share of the 1-rank muon update (`tracking_share`: lower is better).

Each figure is the median of `--repeats` runs with its spread (min..max). The machine's load average is
printed before and after: on a shared machine the 2-process figures are bounded by the free cores.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parent
FILE_COUNTS = (1, 4, 16, 64, 256)
TOTAL_EVENTS = 51_200


def _median(values: list[float]) -> tuple[float, list[float]]:
    return float(np.median(values)), [float(min(values)), float(max(values))]


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _generate(out: Path, files: int, events_per_file: int) -> list[str]:
    cmd = [sys.executable, "-m", "hpctrain", "data", "generate", "--out", str(out), "--files", str(files)]
    cmd += ["--events-per-file", str(events_per_file), "--row-group-size", "8192", "--seed", "3"]
    subprocess.run(cmd, check=True, capture_output=True)
    return sorted(str(p) for p in out.glob("*.parquet"))


def _child(args: list[str]) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, *args], check=True, capture_output=True, text=True).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


# ---- files ---------------------------------------------------------------------------------------------------


def files_child(folder: str) -> dict[str, Any]:
    """Index build and one epoch of the files in `folder`, in this (fresh) process."""
    import hpctrain.workloads.muons.events.stream as stream_mod
    from hpctrain.workloads.muons.spec import MuonData

    files = sorted(str(p) for p in Path(folder).glob("*.parquet"))
    data = MuonData(batch_size=256, num_workers=0)
    # first use: imports and first-call costs are not the index's (a stream over one file, batch size 1)
    stream_mod.EventStream(files[:1], MuonData(batch_size=1, num_workers=0), seed=0).close()
    rss0 = _rss_mb()
    start = time.perf_counter()
    stream = stream_mod.EventStream(files, data, seed=0)
    index_s = time.perf_counter() - start
    rss1 = _rss_mb()
    events = 0
    start = time.perf_counter()
    try:
        for batch, _ in stream.epoch_batches(0, 0):
            events += len(batch)
    finally:
        stream.close()
    seconds = time.perf_counter() - start
    return {
        "files": len(files),
        "index_s": index_s,
        "index_mb": rss1 - rss0,
        "events": events,
        "seconds": seconds,
    }


def section_files(work: Path, repeats: int) -> dict[str, Any]:
    rows = {}
    for n in FILE_COUNTS:
        folder = work / f"files{n}"
        _generate(folder, n, TOTAL_EVENTS // n)
        runs = [_child(["--child", "files", str(folder)]) for _ in range(repeats)]
        rate, rate_spread = _median([r["events"] / r["seconds"] for r in runs])
        index_ms, _ = _median([1000 * r["index_s"] / n for r in runs])
        index_kb, _ = _median([1024 * r["index_mb"] / n for r in runs])
        rows[n] = {
            "events_per_s": rate,
            "spread": rate_spread,
            "index_ms_per_file": index_ms,
            "kb_per_file": index_kb,
        }
        print(
            f"files {n:4d}: {rate:9,.0f} events/s ({rate_spread[0]:,.0f}..{rate_spread[1]:,.0f}), index "
            f"{index_ms:6.2f} ms/file, {index_kb:7.1f} KB/file",
            flush=True,
        )
    ratio = rows[FILE_COUNTS[-1]]["events_per_s"] / rows[1]["events_per_s"]
    return {"files": rows, "files256_over_1_ratio": ratio}


# ---- ranks (gloo) --------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spawn(kind: str, world: int, extra: list[str]) -> list[dict[str, Any]]:
    """`world` processes of this script joined by gloo; each prints one JSON line."""
    port = _free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank))
        env |= {"WORLD_SIZE": str(world), "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, __file__, "--child", kind, *extra]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=900)
        if p.returncode:
            raise RuntimeError(f"{kind} rank failed with exit code {p.returncode}")
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return outs


def _join() -> tuple[int, int]:
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)
    return rank, world


def ranks_child(folder: str) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from hpctrain.workloads.muons.events.stream import EventStream
    from hpctrain.workloads.muons.spec import MuonData

    torch.set_num_threads(1)
    rank, world = _join()
    files = sorted(str(p) for p in Path(folder).glob("*.parquet"))
    stream = EventStream(files, MuonData(batch_size=256, num_workers=0), seed=0, rank=rank, world_size=world)
    dist.barrier()
    start = time.perf_counter()
    events = 0
    for batch, _ in stream.epoch_batches(0, 0):
        events += len(batch)
    seconds = time.perf_counter() - start
    stream.close()
    dist.barrier()
    dist.destroy_process_group()
    return {"events": events, "seconds": seconds}


def section_ranks(work: Path, repeats: int) -> dict[str, Any]:
    folder = work / "ranks"
    _generate(folder, 4, 25_000)
    rates: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(repeats):
        for world in (1, 2):
            outs = _spawn("ranks", world, [str(folder)])
            rates[world].append(sum(o["events"] for o in outs) / max(o["seconds"] for o in outs))
    ratios = [b / a for a, b in zip(rates[1], rates[2], strict=True)]
    result: dict[str, Any] = {}
    for world in (1, 2):
        med, spread = _median(rates[world])
        result[f"ranks{world}_events_per_s"] = med
        print(f"ranks {world}: {med:9,.0f} events/s in all ({spread[0]:,.0f}..{spread[1]:,.0f})", flush=True)
    result["ranks2_over_1_ratio"], result["ranks2_over_1_spread"] = _median(ratios)
    return result


# ---- checkpoint ----------------------------------------------------------------------------------------------


def _disk_write(folder: Path, data: bytes) -> float:
    """Seconds to write `data` to a new file in `folder` and fsync it (the disk's own rate)."""
    path = folder / "disk-probe.bin"
    start = time.perf_counter()
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    seconds = time.perf_counter() - start
    path.unlink()
    return seconds


def section_checkpoint(work: Path, repeats: int, max_mb: int) -> dict[str, Any]:
    import torch

    from hpctrain.train.checkpoint import CheckpointStore

    sizes = [s for s in (1, 16, 64, 256, 1024) if s <= max_mb]
    rows = {}
    for mb in sizes:
        state = {"modules": {"net": {"w": torch.randn(mb * 2**20 // 4)}}, "counters": {"step": 1}}
        raw = io.BytesIO()
        torch.save(state, raw)
        payload = raw.getvalue()
        saves, loads, disks = [], [], []
        for i in range(repeats):
            folder = work / f"ckpt{mb}-{i}"
            folder.mkdir(parents=True)
            disks.append(_disk_write(folder, payload))
            store = CheckpointStore(folder, keep_last=1)
            start = time.perf_counter()
            store.save(state, step=1)
            saves.append(time.perf_counter() - start)
            start = time.perf_counter()
            loaded = store.load_latest()
            loads.append(time.perf_counter() - start)
            assert loaded is not None and torch.equal(
                loaded[0]["modules"]["net"]["w"], state["modules"]["net"]["w"]
            )
            for p in folder.iterdir():
                p.unlink()
            folder.rmdir()
        size = len(payload) / 2**20
        save, save_spread = _median([size / s for s in saves])
        load, _ = _median([size / s for s in loads])
        disk, disk_spread = _median([size / s for s in disks])
        ratio, ratio_spread = _median([d / s for d, s in zip(disks, saves, strict=True)])
        rows[mb] = {"save_mb_s": save, "load_mb_s": load, "disk_mb_s": disk, "save_over_disk": ratio}
        print(
            f"checkpoint {mb:5d} MB: save {save:7.0f} MB/s ({save_spread[0]:.0f}..{save_spread[1]:.0f}) in "
            f"{size / save:6.2f} s, load {load:7.0f} MB/s, disk write+fsync {disk:7.0f} MB/s "
            f"({disk_spread[0]:.0f}..{disk_spread[1]:.0f}); save/disk {ratio:.2f} ({ratio_spread[0]:.2f}.."
            f"{ratio_spread[1]:.2f})",
            flush=True,
        )
    return {"checkpoint": rows, "checkpoint_save_ratio": rows[sizes[-1]]["save_over_disk"]}


# ---- DDP update ----------------------------------------------------------------------------------------------


def ddp_child(events: str, updates: str) -> dict[str, Any]:
    import torch
    from torch.nn.parallel import DistributedDataParallel

    sys.path.insert(0, str(BENCH))
    from muon_step import build, make_batch

    from hpctrain.train.context import Context
    from hpctrain.train.task import MicroBatch

    torch.set_num_threads(1)
    rank, _ = _join()
    cap = 2000
    task, ctx = build(torch.device("cpu"), 2, 10.0, 2, cap)
    wrapped = {k: DistributedDataParallel(m) for k, m in ctx.raw_modules.items()}
    ctx = Context(torch.device("cpu"), wrapped, ctx.raw_modules, ctx.optimizers, "fp32", 10.0)
    batch = make_batch(int(events), cap, seed=rank)
    micro = [MicroBatch(batch, 1.0, len(batch))]
    task.train_step(micro, ctx)  # warm-up
    import torch.distributed as dist

    dist.barrier()
    times = []
    for _ in range(int(updates)):
        start = time.perf_counter()
        out = task.train_step(micro, ctx)
        float(out.loss)
        times.append(time.perf_counter() - start)
    dist.barrier()
    dist.destroy_process_group()
    return {"update_s": float(np.median(times)), "events": len(batch)}


def section_ddp(repeats: int) -> dict[str, Any]:
    per: dict[int, list[float]] = {1: [], 2: []}
    rate: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(repeats):
        for world in (1, 2):
            outs = _spawn("ddp", world, ["64", "3"])
            slowest = max(o["update_s"] for o in outs)
            per[world].append(slowest)
            rate[world].append(sum(o["events"] for o in outs) / slowest)
    result: dict[str, Any] = {}
    for world in (1, 2):
        med, spread = _median(per[world])
        result[f"ddp{world}_update_s"] = med
        print(
            f"ddp {world} rank(s): {1000 * med:7.1f} ms per update ({1000 * spread[0]:.1f}..{1000 * spread[1]:.1f}), "
            f"{np.median(rate[world]):8,.0f} events/s in all",
            flush=True,
        )
    ratios = [b / a for a, b in zip(rate[1], rate[2], strict=True)]
    result["ddp2_over_1_ratio"], result["ddp2_over_1_spread"] = _median(ratios)
    return result


# ---- tracking ------------------------------------------------------------------------------------------------


def section_tracking(work: Path, repeats: int, steps: int = 2000) -> dict[str, Any]:
    from hpctrain.track.metrics_file import MetricsFile
    from hpctrain.track.tensorboard import TensorBoardTracker

    scalars = {f"train/metric_{i}": float(i) for i in range(20)}
    result: dict[str, Any] = {}
    for name in ("tensorboard", "metrics"):
        costs = []
        for i in range(repeats):
            folder = work / f"track-{name}-{i}"
            folder.mkdir(parents=True)
            sink: Any = (
                TensorBoardTracker(folder, "bench", None)
                if name == "tensorboard"
                else MetricsFile(folder / "metrics.jsonl", None)
            )
            start = time.perf_counter()
            for step in range(steps):
                sink.log_scalars(step, scalars)
            sink.close()  # the writes that were queued count too
            costs.append((time.perf_counter() - start) / steps)
        med, spread = _median(costs)
        result[f"{name}_us_per_step"] = 1e6 * med
        print(
            f"tracking {name:11s}: {1e6 * med:7.1f} us per logged step of 20 scalars "
            f"({1e6 * spread[0]:.1f}..{1e6 * spread[1]:.1f})",
            flush=True,
        )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default="files,ranks,checkpoint,ddp,tracking")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-checkpoint-mb", type=int, default=256, help="largest state; 1024 for 1 GB")
    parser.add_argument("--work", help="scratch folder (default: a temporary one under /tmp)")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        child = {"files": files_child, "ranks": ranks_child, "ddp": ddp_child}[kind]
        print(json.dumps(child(*rest)))
        return 0
    sections = args.sections.split(",")
    summary: dict[str, Any] = {"load_before": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="hpctrain-scaling-", dir=args.work) as tmp:
        work = Path(tmp)
        if "files" in sections:
            summary |= section_files(work, args.repeats)
        if "ranks" in sections:
            summary |= section_ranks(work, args.repeats)
        if "checkpoint" in sections:
            summary |= section_checkpoint(work, args.repeats, args.max_checkpoint_mb)
        if "ddp" in sections:
            summary |= section_ddp(args.repeats)
        if "tracking" in sections:
            summary |= section_tracking(work, args.repeats)
            if "ddp1_update_s" in summary:
                worst = max(summary["tensorboard_us_per_step"], summary["metrics_us_per_step"])
                summary["tracking_share"] = worst / 1e6 / summary["ddp1_update_s"]
    summary["load_after"] = [round(x, 2) for x in os.getloadavg()]
    summary["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
