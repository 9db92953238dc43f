"""`hpctrain sample RUN_DIR_OR_CHECKPOINT (--primaries FILE | --n-events N) --out FILE.parquet [--seed S]`."""

from __future__ import annotations

import time

from hpctrain.commands.common import ArgParser
from hpctrain.errors import UserError


def main(argv: list[str]) -> int:
    parser = ArgParser(
        prog="hpctrain sample",
        description="Generate muon bundles with a trained muon_wgan model; writes the current Parquet layout.",
    )
    parser.add_argument("model", help="run folder (its latest checkpoint) or a checkpoint file")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--primaries", help="muon file/folder/glob (any layout) whose primaries to use")
    source.add_argument("--n-events", type=int, help="draw this many primaries from the synthetic truth")
    parser.add_argument("--out", required=True, help="output Parquet file")
    parser.add_argument("--seed", type=int, default=0, help="seed of the primaries and the generation")
    parser.add_argument(
        "--batch-size", type=int, default=4096, help="events generated at once (default 4096)"
    )
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    args = parser.parse_args(argv)
    if args.n_events is not None and args.n_events < 1:
        raise UserError(f"--n-events must be at least 1, not {args.n_events}")
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be at least 1, not {args.batch_size}")
    if args.seed < 0:
        raise UserError(f"--seed must be non-negative, not {args.seed}")

    import torch

    from hpctrain.workloads.muons import layouts, sampling

    start = time.perf_counter()
    model = sampling.load_model(args.model, args.device)
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
