"""`hpctrain evaluate RUN_DIR_OR_CHECKPOINT`: generated bundles vs fresh synthetic truth (W1 and KS)."""

from __future__ import annotations

import math
from pathlib import Path

from hpctrain.commands.common import ArgParser
from hpctrain.errors import UserError


def main(argv: list[str]) -> int:
    parser = ArgParser(
        prog="hpctrain evaluate",
        description="Compare a muon model's bundles with fresh samples of the synthetic truth: 1-D Wasserstein "
        "distances and KS statistics of multiplicity, muon energy and lateral distance, overall and per "
        "primary-energy bin. Writes evaluate.json in the run folder and appends the figures to metrics.jsonl.",
    )
    parser.add_argument("model", help="run folder (its latest checkpoint) or a checkpoint file")
    parser.add_argument(
        "--n-events", type=int, default=10_000, help="truth events to compare (default 10000)"
    )
    parser.add_argument("--seed", type=int, default=12345, help="seed of the truth sample and the generation")
    parser.add_argument("--batch-size", type=int, default=4096, help="events generated at once")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--out", help="where to write the JSON (default <run folder>/evaluate.json)")
    args = parser.parse_args(argv)
    if args.n_events < 1:
        raise UserError(f"--n-events must be at least 1, not {args.n_events}")
    if args.seed < 0:
        raise UserError(f"--seed must be non-negative, not {args.seed}")

    from hpctrain.workloads.muons import evaluate, sampling

    model = sampling.load_model(args.model, args.device)
    result = evaluate.evaluate_model(model, args.n_events, args.seed, args.batch_size)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        import json

        out.write_text(json.dumps(evaluate.clean(result), indent=1) + "\n")
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
