"""`hpctrain data generate --kind fields` and `hpctrain data inspect --kind fields`: the command-line side of
the field generators (generate.py) and the shard reader (dataset.py), which import neither this nor each other's
command line."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from hpctrain.errors import UserError
from hpctrain.fsutil import refuse_replacing
from hpctrain.workloads.fields.dataset import ShardFields
from hpctrain.workloads.fields.generate import KINDS, split_files, write_split
from hpctrain.workloads.registry import DataVerbs


def _pair(text: str) -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not LO,HI") from None
    if not 0 < lo < hi:
        raise argparse.ArgumentTypeError(f"{text!r}: need 0 < LO < HI")
    return lo, hi


def generate_args(parser: argparse.ArgumentParser) -> None:
    """The options of `hpctrain data generate --kind fields`."""
    g = parser.add_argument_group("fields")
    g.add_argument("--out", required=True, help="output folder (gets train/, val/, test/ with meta.json)")
    g.add_argument("--kind-of-field", choices=KINDS, default="gaussian", help="generator (default gaussian)")
    # --maps/--val-maps/--test-maps name what is counted (--n, --n-val, --n-test, the old names, still work)
    g.add_argument("--maps", "--n", dest="n", type=int, default=4096, help="training maps (default 4096)")
    g.add_argument(
        "--val-maps", "--n-val", dest="n_val", type=int, default=512, help="validation maps (default 512)"
    )
    g.add_argument(
        "--test-maps", "--n-test", dest="n_test", type=int, default=512, help="test maps (default 512)"
    )
    g.add_argument("--size", type=int, default=64, help="map side in pixels, even (default 64)")
    g.add_argument("--box-size", type=float, default=1000.0, help="map side in Mpc/h (default 1000)")
    g.add_argument("--seed", type=int, default=2024, help="data seed (default 2024, as data.data_seed)")
    g.add_argument("--omega-m", type=_pair, default=(0.1, 0.5), help="prior box LO,HI (default 0.1,0.5)")
    g.add_argument("--sigma-8", type=_pair, default=(0.6, 1.0), help="prior box LO,HI (default 0.6,1.0)")
    # --layout as for the muon files (--format, its old name, still works)
    g.add_argument(
        "--layout",
        "--format",
        dest="format",
        choices=("hdf5", "npy"),
        default="hdf5",
        help="shard layout (default hdf5)",
    )
    g.add_argument("--shard-size", type=int, default=1024, help="maps per shard (default 1024)")
    g.add_argument(
        "--share",
        type=_share,
        default=(0, 1),
        metavar="K/N",
        help="write only the shards whose number is K modulo N (array task K of N; slurm/generate_data.sh)",
    )
    g.add_argument(
        "--overwrite", action="store_true", help="replace shards and meta.json already in --out/<split>/"
    )


def _share(text: str) -> tuple[int, int]:
    try:
        task, tasks = (int(v) for v in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not K/N") from None
    if not 0 <= task < tasks:
        raise argparse.ArgumentTypeError(f"{text!r}: need 0 <= K < N")
    return task, tasks


def generate(args: argparse.Namespace) -> int:
    """Write the shards of every split; prints one line per split."""
    for name in ("n", "n_val", "n_test", "shard_size", "size", "seed"):
        if getattr(args, name) < (1 if name in ("n", "shard_size", "size") else 0):
            raise UserError(f"--{name.replace('_', '-')}={getattr(args, name)} is out of range")
    if args.size % 2 or args.size < 8:
        raise UserError(f"--size={args.size} must be even and at least 8")
    if args.box_size <= 0:
        raise UserError(f"--box-size={args.box_size} must be positive")
    out = Path(args.out)
    prior = (tuple(args.omega_m), tuple(args.sigma_8))
    splits = [(split, n) for split, n in (("train", args.n), ("val", args.n_val), ("test", args.n_test)) if n]
    if not args.overwrite:  # every split checked before any is written
        planned = [split_files(out, s, n, args.format, args.shard_size, args.share) for s, n in splits]
        refuse_replacing([path for files in planned for path in files], out)
    for split, n in splits:
        start = time.perf_counter()
        meta = write_split(
            out,
            split,
            n,
            kind=args.kind_of_field,
            seed=args.seed,
            size=args.size,
            box_size=args.box_size,
            prior=prior,
            fmt=args.format,
            shard_size=args.shard_size,
            share=args.share,
        )
        seconds = time.perf_counter() - start
        task, tasks = args.share
        mine = [i for i in range(len(meta["shards"])) if i % tasks == task]
        part = f" (share {task}/{tasks}: shards {', '.join(map(str, mine)) or 'none'})" if tasks > 1 else ""
        waiting = "" if meta["complete"] else "; meta.json follows from the task that writes the last shard"
        print(
            f"{split}: {n} {args.kind_of_field} maps {args.size}x{args.size} in {len(meta['shards'])} "
            f"{args.format} shards{part} -> {out / split} ({n / seconds:.0f} maps/s){waiting}",
            flush=True,
        )
    return 0


def inspect(args: argparse.Namespace) -> int:
    """`hpctrain data inspect --kind fields PATH`: what a split folder (or a folder of splits) holds."""
    root = Path(args.path)
    folders = [root] if (root / "meta.json").is_file() else sorted(p.parent for p in root.glob("*/meta.json"))
    if not folders:
        raise UserError(f"{root} holds no meta.json (write one with `hpctrain data generate --kind fields`)")
    for folder in folders:
        data = ShardFields(folder)
        m = data.meta
        print(
            f"{folder}: {len(data)} {m['kind']} maps {m['size']}x{m['size']}, box {m['box_size']} Mpc/h, "
            f"split {m['split']}, seed {m['seed']}, {len(data.shards)} {m['format']} shards, "
            f"prior {m['prior']}"
        )
        count = min(args.events, len(data))
        if count:
            maps, params = data.__getitems__(list(range(count)))
            for i in range(count):
                x = maps[i].numpy()
                print(
                    f"  map {i}: omega_m {params[i, 0]:.4f} sigma_8 {params[i, 1]:.4f} | "
                    f"mean {x.mean():+.3f} std {x.std():.3f} min {x.min():+.3f} max {x.max():+.3f}"
                )
    return 0


DATA_VERBS = DataVerbs(generate_args, generate, inspect)
