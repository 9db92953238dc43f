"""Muon loader throughput against raw pyarrow decode and the upstream per-row reader, side by side in one run.

    python bench/loader.py [--files 4] [--events-per-file 25000] [--rounds 5] [--passes 8] [--dir DIR]

Every measurement runs in a fresh subprocess (so peak RSS and CPU seconds are its own). The phases run in
ROUNDS: each round measures every phase once, one after the other, so a change in the machine's load hits all
phases of a round alike; each ratio is computed within a round, and the figures given are the median and the
spread (min..max) over the rounds. Each phase also reports its CPU seconds (its own process, threads and
workers), which shows where a figure is bounded by the cores.

Steady state: a phase makes one untimed pass over the files first (the loader two: epoch 0, its workers start;
epoch 1, the last lent buffers are made; the raw decode's own first pass costs ~4x its later ones: pyarrow's
and the allocator's start-up), then `--passes` timed ones; the first pass's time is reported beside. The loaders keep their workers
between epochs (persistent_workers, as a training run of several epochs would set). Phases:

- raw: pyarrow row groups -> flat NumPy muons and counts from the offsets (no shuffle, no checks): the limit;
- loader0 / loader0_ordered / loader1 / loader2: EventStream with 0, 1, 2 DataLoader workers (shuffled), and
  with 0 workers in file order; read as training reads it (the endless stream: the workers go on into the
  next epoch while this one's last batches are used), `--passes` epochs' worth of batches. With 0 workers
  the row groups are decoded an item ahead on one background thread (data.read_ahead: the default where
  CUDA is available; its CPU cost shows in the cpu_ratio figures);
- loader0_sync: 0 workers, shuffled, read_ahead off (the default on CPU, where torch's threads use every
  core): decode, gather and bookkeeping one after the other in one thread;
- upstream: the physicists' reader, cr_muons `ParquetBatchIterableDataset` as on their main branch
  (training/hf_dataloader.py), on their schema: `list<float>` primaries and `list<list<float>>` muons are not
  fixed-size lists, so both take its per-row fallback (each row's `as_py()`: a tensor per primary, an array per
  event, then one concatenation), record batches of the batch size, over the whole first file, once;
- upstream_rewrite: the same class in their later Lightning rewrite (src/datamodules/parquet_dataset.py):
  primaries vectorised, record batches of max(4096, batch size), muons still per row: the faster of the two.

The LAST line printed is one JSON object, medians over the rounds (each with a `*_spread` [min, max]):
ratio_vs_raw (loader, 0 workers, shuffled, over raw decode, in muons/s; goal >= 0.95), sync_ratio_vs_raw
(the same without reading ahead), ordered_ratio_vs_raw,
workers1_ratio_vs_raw, workers2_over_1_ratio (goal >= 1.7), ratio_vs_upstream (loader, 0 workers, over the
upstream reader, in muons/s; goal >= 50), workers2_ratio_vs_upstream (2 workers over the upstream's one core),
ratio_vs_upstream_rewrite, the same per CPU second (cpu_ratio_*: what each costs, less bent by other processes
than wall time) and the load average before and after.
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
from typing import Any

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


def loader(
    files: list[str],
    workers: int,
    batch_size: int,
    passes: int,
    shuffle: bool = True,
    read_ahead: bool = True,
) -> tuple[int, int, float, float, float, float]:
    """Epochs 0 and 1 untimed (workers start; the lent buffers are made, over the first two epochs with two
    workers: ~15 ms of the main process's CPU each), then `passes` epochs: (events, muons, seconds, CPU s, first
    epoch s,
    CPU s of the main process alone: with workers, its share is the part that does not scale with them)."""
    from hpctrain.workloads.muons.events.stream import EventStream
    from hpctrain.workloads.muons.spec import MuonData

    data = MuonData(
        batch_size=batch_size,
        num_workers=workers,
        prefetch_factor=4,
        shuffle=shuffle,
        persistent_workers=workers > 0,
        read_ahead=read_ahead,
    )
    stream = EventStream(files, data, seed=0)
    per_epoch = stream.samples_per_epoch // batch_size
    events = muons = 0
    try:
        batches = iter(stream)  # the endless stream, as training reads it: epochs follow without a pause
        t0 = time.perf_counter()
        for _ in range(per_epoch):
            next(batches)
        first = time.perf_counter() - t0
        for _ in range(per_epoch):
            next(batches)
        start, cpu, main = time.perf_counter(), _tree_cpu(), _own_cpu()
        for _ in range(passes * per_epoch):
            batch = next(batches)
            events += len(batch)
            muons += batch.num_muons
        seconds, cpu, main = time.perf_counter() - start, _tree_cpu() - cpu, _own_cpu() - main
    finally:
        stream.close()
    return events, muons, seconds, cpu, first, main


def _own_cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def upstream(files: list[str], batch_size: int, limit: int) -> tuple[int, int]:
    """The upstream reader's per-row fallback as on cr_muons' main branch (training/hf_dataloader.py,
    ParquetBatchIterableDataset, unshuffled path) over the first file (its first `limit` events, 0 = all):
    record batches of `batch_size`; primaries and muons are variable-size lists, so each row becomes a Python
    list (`as_py`) and then a tensor / an array; counts from the offsets; the muons of a batch concatenated;
    the event index of each muon repeated out."""
    import pyarrow as pa
    import torch

    events = muons = 0
    pf = pq.ParquetFile(files[0])
    for rb in pf.iter_batches(batch_size=batch_size, columns=["primary", "muons"]):
        n = rb.num_rows
        prim_col, mu_col = rb.column(0), rb.column(1)
        assert not pa.types.is_fixed_size_list(
            prim_col.type
        )  # their vectorised branch needs fixed-size lists
        prims = torch.stack([torch.as_tensor(prim_col[i].as_py(), dtype=torch.float32) for i in range(n)])
        counts = torch.as_tensor(np.diff(mu_col.offsets.to_numpy().astype(np.int64)))
        flat = _per_row_muons(mu_col, n)
        torch.repeat_interleave(torch.arange(n), counts)  # their batch_idx
        events += len(prims)
        muons += len(flat)
        if limit and events >= limit:
            break
    return events, muons


def _per_row_muons(mu_col: Any, n: int) -> Any:
    """Their muon fallback: each row's `as_py()`, an array per event, one concatenation, a tensor."""
    import torch

    rows = [mu_col[i].as_py() for i in range(n)]
    arrays = [
        np.asarray(r, dtype=np.float32).reshape(-1, 3) if r else np.zeros((0, 3), np.float32) for r in rows
    ]
    return torch.as_tensor(np.concatenate(arrays), dtype=torch.float32)


def upstream_rewrite(files: list[str], batch_size: int, limit: int) -> tuple[int, int]:
    """The same class in cr_muons' later Lightning rewrite (src/datamodules/parquet_dataset.py): record batches
    of max(4096, batch_size); primaries of equal length taken as one reshaped array; muons still per row.
    (Its re-batching into `batch_size` and per-batch shuffle come on top and are left out: a lower bound.)"""
    import torch

    events = muons = 0
    pf = pq.ParquetFile(files[0])
    rb_size = min(131072, max(4096, batch_size))
    for rb in pf.iter_batches(batch_size=rb_size, columns=["primary", "muons"]):
        n = rb.num_rows
        prim_col, mu_col = rb.column(0), rb.column(1)
        values = prim_col.values.to_numpy(zero_copy_only=False)
        prims = torch.tensor(values.reshape(n, len(values) // n), dtype=torch.float32)
        torch.as_tensor(np.diff(mu_col.offsets.to_numpy().astype(np.int64)))
        flat = _per_row_muons(mu_col, n)
        events += len(prims)
        muons += len(flat)
        if limit and events >= limit:
            break
    return events, muons


def _tree_cpu() -> float:
    """CPU seconds of this process and its live descendants (DataLoader workers: persistent, so not yet
    reaped into RUSAGE_CHILDREN), read from /proc (elsewhere: this process and its reaped children)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    total = own.ru_utime + own.ru_stime
    if not os.path.isdir("/proc/self/task"):
        return _cpu_s()
    parent: dict[int, int] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        parent[int(name)] = int(fields[1])
        times[int(name)] = (int(fields[11]) + int(fields[12])) / tick
    tree, grew = {os.getpid()}, True
    while grew:
        kids = {p for p, q in parent.items() if q in tree} - tree
        tree |= kids
        grew = bool(kids)
    return total + sum(times[p] for p in tree if p != os.getpid())


def _cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def phase(args: argparse.Namespace) -> None:
    files = sorted(os.path.join(args.dir, f) for f in os.listdir(args.dir) if f.endswith(".parquet"))
    import hpctrain.workloads.muons.events.stream  # noqa: F401  (torch's import time is not decoding time)

    name, passes = args.phase, args.passes
    if name.startswith("loader"):
        workers = int(name.removeprefix("loader")[0])
        events, muons, seconds, cpu, first, main = loader(
            files, workers, args.batch_size, passes, name != "loader0_ordered", name != "loader0_sync"
        )
    else:
        t0 = time.perf_counter()
        if name == "raw":
            raw(files)
        else:  # the upstream readers run once over a file: a first decode warms pyarrow up, as above
            pq.ParquetFile(files[0]).read_row_group(0)
        first = time.perf_counter() - t0
        start, cpu = time.perf_counter(), _cpu_s()
        if name == "raw":
            events = muons = 0
            for _ in range(passes):
                e, m = raw(files)
                events, muons = events + e, muons + m
        elif name == "upstream":
            events, muons = upstream(files, args.batch_size, args.upstream_events)
        else:
            events, muons = upstream_rewrite(files, args.batch_size, args.upstream_events)
        seconds, cpu = time.perf_counter() - start, _cpu_s() - cpu
        main = cpu
    print(
        json.dumps(
            {
                "events": events,
                "muons": muons,
                "seconds": seconds,
                "cpu_s": cpu,
                "first_pass_s": first,
                "main_cpu_share": main / cpu if cpu else 1.0,
                "peak_rss_mb": _peak_mb(),
            }
        )
    )


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _median_spread(values: list[float]) -> tuple[float, list[float]]:
    return float(np.median(values)), [min(values), max(values)]


PHASES = (
    "raw",
    "loader0",
    "loader0_sync",
    "loader0_ordered",
    "loader1",
    "loader2",
    "upstream",
    "upstream_rewrite",
)
RATIOS = {  # name: (ours, baseline, unit)
    "ratio_vs_raw": ("loader0", "raw", "muons_per_s"),
    "sync_ratio_vs_raw": ("loader0_sync", "raw", "muons_per_s"),
    "ordered_ratio_vs_raw": ("loader0_ordered", "raw", "muons_per_s"),
    "workers1_ratio_vs_raw": ("loader1", "raw", "muons_per_s"),
    "workers2_over_1_ratio": ("loader2", "loader1", "muons_per_s"),
    "ratio_vs_upstream": ("loader0", "upstream", "muons_per_s"),
    "workers2_ratio_vs_upstream": ("loader2", "upstream", "muons_per_s"),
    "ratio_vs_upstream_rewrite": ("loader0", "upstream_rewrite", "muons_per_s"),
    # per CPU second (own process, threads, workers): what the loader costs, less bent by a loaded machine
    "cpu_ratio_vs_raw": ("loader0", "raw", "muons_per_cpu_s"),
    "sync_cpu_ratio_vs_raw": ("loader0_sync", "raw", "muons_per_cpu_s"),
    "ordered_cpu_ratio_vs_raw": ("loader0_ordered", "raw", "muons_per_cpu_s"),
    "workers1_cpu_ratio_vs_raw": ("loader1", "raw", "muons_per_cpu_s"),
    "workers2_cpu_ratio_vs_raw": ("loader2", "raw", "muons_per_cpu_s"),
    "cpu_ratio_vs_upstream": ("loader0", "upstream", "muons_per_cpu_s"),
    "cpu_ratio_vs_upstream_rewrite": ("loader0", "upstream_rewrite", "muons_per_cpu_s"),
}


def _generate(args: argparse.Namespace) -> None:
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
    ]
    gen += ["--events-per-file", str(args.events_per_file), "--row-group-size", "8192", "--seed", "1"]
    subprocess.run(gen, check=True)


def _run_phase(args: argparse.Namespace, name: str) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--dir", args.dir, "--phase", name, "--batch-size", str(args.batch_size)]
    cmd += ["--upstream-events", str(args.upstream_events), "--passes", str(args.passes)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    run: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    run["events_per_s"] = run["events"] / run["seconds"]
    run["muons_per_s"] = run["muons"] / run["seconds"]
    run["muons_per_cpu_s"] = run["muons"] / run["cpu_s"]
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--events-per-file", type=int, default=25_000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--upstream-events", type=int, default=0, help="0 = the whole first file")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of every phase; medians are reported")
    parser.add_argument(
        "--passes", type=int, default=8, help="timed passes per phase, after the untimed ones"
    )
    parser.add_argument("--dir", help="existing data folder (default: generate into a temporary one)")
    parser.add_argument("--phase", help=argparse.SUPPRESS)
    args = parser.parse_args()
    for name in ("files", "events_per_file", "batch_size", "rounds", "passes"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, not {getattr(args, name)}")
    if args.dir is not None and not (
        os.path.isdir(args.dir) and any(f.endswith(".parquet") for f in os.listdir(args.dir))
    ):
        parser.error(f"--dir {args.dir}: not a folder of .parquet files (leave it out to generate one)")
    if args.phase:
        phase(args)
        return 0
    tmp = None
    if args.dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="hpctrain-bench-")
        args.dir = tmp.name
        _generate(args)
    load_before = _load()
    rounds: list[dict[str, dict[str, float]]] = []
    try:
        for r in range(args.rounds):
            runs = {name: _run_phase(args, name) for name in PHASES}
            rounds.append(runs)
            line = ", ".join(f"{n} {runs[n]['muons_per_s'] / 1e6:.2f}" for n in PHASES)
            print(f"round {r + 1}: M muons/s {line} (load {_load()[0]})", flush=True)
    finally:
        if tmp is not None:
            tmp.cleanup()
    results = {}
    for name in PHASES:
        runs = [rnd[name] for rnd in rounds]
        med = {k: float(np.median([run[k] for run in runs])) for k in runs[0]}
        results[name] = med
        print(
            f"{name:16s} {med['events_per_s']:11,.0f} events/s {med['muons_per_s']:13,.0f} muons/s "
            f"(median of {len(runs)}; muons/s {min(r['muons_per_s'] for r in runs):,.0f}.."
            f"{max(r['muons_per_s'] for r in runs):,.0f}) peak RSS {med['peak_rss_mb']:6.0f} MB, "
            f"{med['cpu_s']:.2f} CPU s in {med['seconds']:.2f} s ({int(med['events'])} events; first pass "
            f"{med['first_pass_s']:.2f} s)",
            flush=True,
        )
    for name in ("loader1", "loader2"):  # what does not scale with the workers: the main process's part
        print(f"{name}: main process {results[name]['main_cpu_share']:.1%} of the phase's CPU seconds")
    summary: dict[str, object] = {"results": results}
    for key, (ours, base, unit) in RATIOS.items():
        median, spread = _median_spread([rnd[ours][unit] / rnd[base][unit] for rnd in rounds])
        summary[key], summary[key + "_spread"] = median, spread
        print(f"{key:24s} {median:8.3f}  ({spread[0]:.3f}..{spread[1]:.3f})")
    summary |= {
        "rounds": args.rounds,
        "cpus": os.cpu_count(),
        "load_before": load_before,
        "load_after": _load(),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
