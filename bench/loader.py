"""Muon loader throughput against raw pyarrow decode and a per-row Python decode, measured in one run.

    python bench/loader.py [--files 8] [--events-per-file 50000] [--repeat 3] [--dir DIR]

Each measurement runs in a fresh subprocess (so peak RSS is its own), `--repeat` times; the fastest run counts
(the machine is shared: slower runs are interference, not the code). Each phase also reports its CPU seconds
(its own process, threads and workers), which shows where a ratio is bounded by the cores. The LAST line
printed is one JSON object:
ratio_vs_raw (loader, 0 workers, over raw decode; goal >= 0.9), workers2_over_1_ratio (goal >= 1.7),
ratio_vs_per_row (loader, 0 workers, over the per-row decode; goal >= 10).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow.parquet as pq


def _peak_mb() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return (own + children) / 1024.0


def raw(files: list[str]) -> tuple[int, int]:
    """pyarrow row groups -> flat NumPy muons and per-event counts from the offsets: the limit."""
    events = muons = 0
    for path in files:
        pf = pq.ParquetFile(path)
        for i in range(pf.num_row_groups):
            table = pf.read_row_group(i, columns=["primary", "muons"])
            col = table.column("muons").combine_chunks()
            counts = np.diff(col.offsets.to_numpy())
            values = col.flatten().flatten().to_numpy().reshape(-1, 3)
            assert len(values) == counts.sum()
            prim = table.column("primary").combine_chunks().flatten().to_numpy().reshape(-1, 4)
            events += len(prim)
            muons += int(counts.sum())
    return events, muons


def loader(files: list[str], workers: int, batch_size: int, shuffle: bool = True) -> tuple[int, int]:
    from hpctrain.workloads.muons.spec import MuonData
    from hpctrain.workloads.muons.stream import EventStream

    data = MuonData(batch_size=batch_size, num_workers=workers, prefetch_factor=4, shuffle=shuffle)
    stream = EventStream(files, data, seed=0)
    events = muons = 0
    try:
        for batch, _ in stream.epoch_batches(0, 0):
            events += len(batch)
            muons += batch.num_muons
    finally:
        stream.close()
    return events, muons


def per_row(files: list[str], limit: int) -> tuple[int, int]:
    """What the old code did: a Python list per event, then NumPy per event (the first `limit` events)."""
    events = muons = 0
    pf = pq.ParquetFile(files[0])
    for i in range(pf.num_row_groups):
        table = pf.read_row_group(i, columns=["primary", "muons"])
        for prim, mu in zip(table.column("primary").to_pylist(), table.column("muons").to_pylist()):
            np.asarray(prim, dtype=np.float32)
            arr = np.asarray(mu, dtype=np.float32).reshape(-1, 3)
            events += 1
            muons += len(arr)
        if events >= limit:
            break
    return events, muons


def _cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def phase(args: argparse.Namespace) -> None:
    files = sorted(os.path.join(args.dir, f) for f in os.listdir(args.dir) if f.endswith(".parquet"))
    import hpctrain.workloads.muons.stream  # noqa: F401  (torch's import time is not decoding time)

    start, cpu = time.perf_counter(), _cpu_s()
    if args.phase == "raw":
        events, muons = raw(files)
    elif args.phase == "per_row":
        events, muons = per_row(files, args.per_row_events)
    elif args.phase == "loader0_ordered":
        events, muons = loader(files, 0, args.batch_size, shuffle=False)
    else:
        events, muons = loader(files, int(args.phase.removeprefix("loader")), args.batch_size)
    seconds = time.perf_counter() - start
    cpu = _cpu_s() - cpu  # after the loader closed: its workers have been reaped into RUSAGE_CHILDREN
    print(
        json.dumps(
            {"events": events, "muons": muons, "seconds": seconds, "cpu_s": cpu, "peak_rss_mb": _peak_mb()}
        )
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--events-per-file", type=int, default=50_000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--per-row-events", type=int, default=5_000)
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement; the best counts")
    parser.add_argument("--dir", help="existing data folder (default: generate into a temporary one)")
    parser.add_argument("--phase", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:
        phase(args)
        return 0
    tmp = None
    if args.dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="hpctrain-bench-")
        args.dir = tmp.name
        gen = [
            sys.executable,
            "-m",
            "hpctrain",
            "data",
            "generate",
            "--out",
            args.dir,
            "--files",
            str(args.files),
            "--events-per-file",
            str(args.events_per_file),
            "--row-group-size",
            "8192",
            "--seed",
            "1",
        ]
        subprocess.run(gen, check=True)
    results = {}
    try:
        for name in ("raw", "loader0", "loader0_ordered", "loader1", "loader2", "per_row"):
            runs = []
            for _ in range(args.repeat if name != "per_row" else 1):
                cmd = [
                    sys.executable,
                    __file__,
                    "--dir",
                    args.dir,
                    "--phase",
                    name,
                    "--batch-size",
                    str(args.batch_size),
                    "--per-row-events",
                    str(args.per_row_events),
                ]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                runs.append(json.loads(out.strip().splitlines()[-1]))
            best = min(runs, key=lambda r: r["seconds"])
            best["events_per_s"] = best["events"] / best["seconds"]
            best["muons_per_s"] = best["muons"] / best["seconds"]
            results[name] = best
            print(
                f"{name:8s} {best['events_per_s']:12,.0f} events/s {best['muons_per_s']:14,.0f} muons/s "
                f"peak RSS {best['peak_rss_mb']:7.0f} MB ({best['events']} events, {best['seconds']:.2f} s, "
                f"{best['cpu_s']:.2f} CPU s)",
                flush=True,
            )
    finally:
        if tmp is not None:
            tmp.cleanup()
    summary = {
        "results": results,
        "ratio_vs_raw": results["loader0"]["muons_per_s"] / results["raw"]["muons_per_s"],
        "ordered_ratio_vs_raw": results["loader0_ordered"]["muons_per_s"] / results["raw"]["muons_per_s"],
        "workers2_over_1_ratio": results["loader2"]["muons_per_s"] / results["loader1"]["muons_per_s"],
        "ratio_vs_per_row": results["loader0"]["events_per_s"] / results["per_row"]["events_per_s"],
        "cpus": os.cpu_count(),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
