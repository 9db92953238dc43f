"""`hpctrain sample` and `hpctrain evaluate` for the muon models: the options each takes and what it does with
the checkpoint the command found (the registry routes a muon model's checkpoint here, see spec.py extras)."""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from hpctrain.errors import UserError
from hpctrain.fsutil import atomic_write_text
from hpctrain.workloads.muons.sampling import Found


def sample_args(parser: argparse.ArgumentParser) -> None:
    """The options of `hpctrain sample` for a muon model."""
    g = parser.add_argument_group("muon models")
    source = g.add_mutually_exclusive_group(required=True)
    source.add_argument("--primaries", help="muon file/folder/glob (any layout) whose primaries to use")
    source.add_argument("--n-events", type=int, help="draw this many primaries from the synthetic truth")
    g.add_argument("--out", required=True, help="output Parquet file (the current layout)")
    g.add_argument("--seed", type=int, default=0, help="seed of the primaries and the generation")
    g.add_argument("--batch-size", type=int, default=4096, help="events generated at once (default 4096)")
    g.add_argument("--device", default=None, help="cpu, cuda or mps (default: cuda when available)")


def usable_device(name: str | None) -> str | None:
    """--device, refused in one line when this machine has no such device (cuda, mps)."""
    import torch

    if name is None or name == "cpu":
        return name
    kind = name.split(":")[0]
    mps = getattr(torch.backends, "mps", None)
    present = {"cuda": torch.cuda.is_available(), "mps": mps is not None and mps.is_available()}
    if kind not in present:
        raise UserError(f"--device {name}: choose cpu, cuda or mps")
    if not present[kind]:
        raise UserError(f"--device {name}: this machine (or this torch build) has no {kind} device; use cpu")
    return name


def sample(args: argparse.Namespace, found: Found) -> int:
    """Generate muon bundles with a muon_wgan model; writes the current Parquet layout."""
    if args.n_events is not None and args.n_events < 1:
        raise UserError(f"--n-events must be at least 1, not {args.n_events}")
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be at least 1, not {args.batch_size}")
    if args.seed < 0:
        raise UserError(f"--seed must be non-negative, not {args.seed}")

    import torch

    from hpctrain.workloads.muons import layouts, sampling

    start = time.perf_counter()
    model = sampling.load_model(args.model, usable_device(args.device), found)
    if args.primaries:
        primaries, ids = sampling.read_primaries(args.primaries)
    else:
        primaries, ids = sampling.truth_primaries(args.n_events, args.seed), None
    torch.manual_seed(args.seed)
    events = sampling.generate_events(model, primaries, ids, args.batch_size)
    layouts.write_events(args.out, events, "parquet")
    print(
        f"wrote {len(events)} events, {len(events.muons)} muons to {args.out} (model {model.checkpoint}, "
        f"update {model.step}, device {model.device}, {time.perf_counter() - start:.1f} s)"
    )
    return 0


def evaluate_args(parser: argparse.ArgumentParser) -> None:
    """The options of `hpctrain evaluate` for a muon model."""
    g = parser.add_argument_group("muon models")
    g.add_argument("--n-events", type=int, default=10_000, help="truth events to compare (default 10000)")
    g.add_argument("--seed", type=int, default=12345, help="seed of the truth sample and the generation")
    g.add_argument("--batch-size", type=int, default=4096, help="events generated at once")
    g.add_argument("--device", default=None, help="cpu, cuda or mps (default: cuda when available)")
    g.add_argument("--out", help="where to write the JSON (default <run folder>/evaluate.json)")


def evaluate(args: argparse.Namespace, found: Found) -> int:
    """A muon model's bundles against fresh samples of the synthetic truth: 1-D Wasserstein distances and KS
    statistics of multiplicity, muon energy and lateral distance, overall and per primary-energy bin. Writes
    evaluate.json in the run folder and appends the figures to metrics.jsonl."""
    if args.n_events < 1:
        raise UserError(f"--n-events must be at least 1, not {args.n_events}")
    if args.seed < 0:
        raise UserError(f"--seed must be non-negative, not {args.seed}")

    from hpctrain.workloads.muons import evaluate, sampling

    model = sampling.load_model(args.model, usable_device(args.device), found)
    result = evaluate.evaluate_model(model, args.n_events, args.seed, args.batch_size)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out, json.dumps(evaluate.clean(result), indent=1) + "\n")
    elif model.run_dir is not None:
        out = evaluate.write_outputs(model.run_dir, result)
    else:
        raise UserError(f"{args.model}: not inside a run folder; pass --out FILE for the JSON")
    m = result["metrics"]

    def fmt(v: float) -> str:
        return f"{v:.4f}" if math.isfinite(v) else "n/a"

    info = result["info"]
    print(f"evaluated {model.checkpoint} (update {info['step']}) on {info['events']} truth events")
    for name in ("multiplicity", "energy", "lateral_distance"):
        if f"w1_{name}" in m:
            print(f"  {name:<17} W1 {fmt(m[f'w1_{name}'])}  KS {fmt(m[f'ks_{name}'])}")
    print(f"  conditional W1 (mean over features and energy bins): {fmt(m['conditional_w1'])}")
    print(f"wrote {out}")
    return 0
