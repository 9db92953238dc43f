"""`hpctrain data generate --kind muons` and `hpctrain data inspect` for muon files (verbs.py hands them to the
registry; every workload with data verbs has this file, of this shape)."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

from hpctrain.errors import UserError
from hpctrain.fsutil import refuse_replacing
from hpctrain.runtime.seeding import numpy_rng
from hpctrain.workloads.muons.events import layouts
from hpctrain.workloads.muons.events.files import local_files
from hpctrain.workloads.muons.truth import versions as truth_versions
from hpctrain.workloads.registry import DataVerbs

SUFFIX = {"parquet": ".parquet", "parquet-legacy": ".parquet", "parquet-hdf5": ".parquet", "hdf5": ".h5"}


def generate_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="folder for the files (created)")
    parser.add_argument("--files", type=int, default=1, help="number of files (default 1)")
    parser.add_argument(
        "--first-file", type=int, default=0, help="index of the first file (array jobs write disjoint ranges)"
    )
    parser.add_argument("--events-per-file", type=int, default=10_000, help="events per file (default 10000)")
    parser.add_argument(
        "--layout", choices=layouts.LAYOUTS, default="parquet", help="file layout (default parquet)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed; file i uses the stream (seed, i)")
    parser.add_argument("--row-group-size", type=int, default=8192, help="events per Parquet row group")
    parser.add_argument("--prefix", default="muons", help="file name prefix (default muons)")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace files of the same names already in --out"
    )
    parser.add_argument(
        "--truth",
        choices=tuple(truth_versions.TRUTHS),
        default=truth_versions.DEFAULT,
        help="synthetic truth version (default v1; v2 has event-wide structure, docs/muons.md); recorded in "
        "the files",
    )


def synthetic_events(
    n: int, seed: int, file_index: int, version: str = truth_versions.DEFAULT
) -> layouts.Events:
    """n events of truth `version` for file `file_index`; ids are (file_index, event number)."""
    rng = numpy_rng(seed, file_index)
    primaries, muons, counts = truth_versions.get(version).sample(n, rng)
    ids = np.stack([np.full(n, file_index, np.int64), np.arange(n, dtype=np.int64)], axis=1)
    return layouts.Events(primaries.astype(np.float32), muons.astype(np.float32), counts, ids)


def generate(args: argparse.Namespace) -> int:
    for name in ("files", "events_per_file", "row_group_size"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1, not {getattr(args, name)}")
    if args.seed < 0 or args.first_file < 0:
        raise UserError(f"--seed and --first-file must be non-negative, not {args.seed}, {args.first_file}")
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as exc:
        raise UserError(
            f"--out {args.out}: cannot be the folder for the files ({exc.strerror or exc})"
        ) from None
    paths = [
        os.path.join(args.out, f"{args.prefix}-{i:05d}{SUFFIX[args.layout]}")
        for i in range(args.first_file, args.first_file + args.files)
    ]
    if not args.overwrite:
        refuse_replacing([Path(p) for p in paths], args.out)
    start = time.perf_counter()
    events = muons = 0
    for i, path in zip(range(args.first_file, args.first_file + args.files), paths):
        data = synthetic_events(args.events_per_file, args.seed, i, args.truth)
        layouts.write_events(
            path, data, args.layout, args.row_group_size, {truth_versions.TRUTH_KEY: args.truth}
        )
        events += len(data)
        muons += len(data.muons)
    seconds = time.perf_counter() - start
    print(
        f"wrote {args.files} {args.layout} file(s) to {args.out}: {events} events, {muons} muons "
        f"(seed {args.seed}, truth {args.truth}, {seconds:.1f} s)"
    )
    return 0


def _describe(path: str, events: int) -> None:
    try:
        reader = layouts.open_reader(path)
    except layouts.LayoutError as err:
        raise UserError(str(err)) from None
    try:
        print(f"{path}")
        print(
            f"  format {layouts.file_format(path)}, layout {reader.layout}, {len(reader.unit_rows)} unit(s)"
        )
        if isinstance(reader, layouts.ParquetReader):
            schema = str(reader.file.schema_arrow).replace("\n", "\n    ")
            print(f"  schema:\n    {schema}")
        else:
            shapes = ", ".join(f"{k} {reader.file[k].shape} {reader.file[k].dtype}" for k in reader.file)
            print(f"  datasets: {shapes}")
        counts: list[np.ndarray] = []
        shown: list[layouts.Events] = []
        for u in range(len(reader.unit_rows)):
            unit = reader.read_unit(u)  # one unit at a time: bounded memory
            counts.append(unit.counts)
            if sum(len(s) for s in shown) < events:
                shown.append(unit)
        allc = np.concatenate(counts) if counts else np.zeros(0, np.int64)
        print(f"  events {len(allc)}, muons {int(allc.sum())}, empty events {int((allc == 0).sum())}")
        if len(allc):
            q = np.quantile(allc, [0.5, 0.9, 0.99, 0.999])
            print(
                f"  multiplicity: mean {allc.mean():.1f}, median {q[0]:.0f}, q90 {q[1]:.0f}, q99 {q[2]:.0f}, "
                f"q99.9 {q[3]:.0f}, max {int(allc.max())}"
            )
        if events and sum(len(s) for s in shown):
            first = layouts.concat_events(shown)
            off = first.offsets
            print(
                "  first events: ids [major, minor] | primary [E_GeV, zenith_rad, mass_GeV, depth_m] | "
                "muons [E_GeV, x_m, y_m] (x, y: position in the shower plane)"
            )
            for i in range(min(events, len(first))):
                mu = first.muons[off[i] : off[i + 1]]
                head = "; ".join("[" + ", ".join(f"{v:.4g}" for v in row) + "]" for row in mu[:3])
                more = f" ... (+{len(mu) - 3})" if len(mu) > 3 else ""
                prim = ", ".join(f"{v:.4g}" for v in first.primaries[i])
                print(f"    {first.ids[i].tolist()} | [{prim}] | {len(mu)} muons: {head}{more}")
    finally:
        reader.close()


def inspect(args: argparse.Namespace) -> int:
    if args.events < 0:
        raise UserError(f"--events must be non-negative, not {args.events}")
    for path in local_files(args.path):
        _describe(path, args.events)
    return 0


DATA_VERBS = DataVerbs(generate_args, generate, inspect)
