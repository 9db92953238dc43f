"""The fields workload's verbs, as the registry takes them (`VERBS`, checked at registration): the task, `hpctrain
data` (data_verbs.py), `hpctrain evaluate` (predicted vs true (Omega_m, sigma_8) on held-out maps, written to
<run folder>/evaluate.json) and the report that draws it (scatter per parameter with R^2 and residual spread).

Every command imports this module (registration), login nodes included: torch, the task and the data reader
are imported inside the callables, when a verb runs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctrain.errors import UserError
from hpctrain.fsutil import atomic_write_text
from hpctrain.runtime.env import ClusterEnv
from hpctrain.workloads.fields.spec import FieldsRun
from hpctrain.workloads.registry import DataVerbs, ModelVerb, Verbs, lazy_data_verbs

if TYPE_CHECKING:
    from hpctrain.track.report.panels import WorkloadReport
    from hpctrain.train.checkpoint import Located
    from hpctrain.train.task import Task


def evaluate_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("fields models")
    g.add_argument("--split", choices=("test", "val"), default="test", help="maps to predict (default test)")
    g.add_argument(
        "--max-maps", type=int, default=0, help="at most this many maps (default: all of the split)"
    )
    g.add_argument("--out", help="where to write the JSON (default <run folder>/evaluate.json)")


def check_evaluate(args: argparse.Namespace) -> None:
    """`hpctrain evaluate`'s flags, before the model loads."""
    if args.max_maps < 0:
        raise UserError(f"--max-maps must be 0 (all) or positive, not {args.max_maps}")


def evaluate(args: argparse.Namespace, found: Located) -> int:
    check_evaluate(args)
    from hpctrain.workloads.fields.evaluate import evaluate_run, write_outputs

    result = evaluate_run(args.model, max_maps=args.max_maps, split=args.split, found=found)
    run_dir = found.run_dir  # the run folder of the checkpoint the command found (None: a lone file)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out, json.dumps(result, indent=1) + "\n")
    elif run_dir is not None:
        out = write_outputs(run_dir, result)
    else:
        raise UserError(f"{args.model}: not inside a run folder; pass --out FILE for the JSON")
    info, m = result["info"], result["metrics"]
    print(f"evaluated {info['checkpoint']} (update {info['step']}) on {info['maps']} {info['split']} maps")
    for name in result["predictions"]:
        print(
            f"  {name:<8} R2 {m[f'r2_{name}']:.4f}  RMSE {m[f'rmse_{name}']:.4g}  bias {m[f'bias_{name}']:+.3g}"
        )
    print(f"wrote {out}")
    return 0


def _data_verbs() -> DataVerbs:
    from hpctrain.workloads.fields.data_verbs import DATA_VERBS

    return DATA_VERBS


def field_task(cfg: FieldsRun, env: ClusterEnv) -> Task[Any]:
    from hpctrain.workloads.fields.task import FieldTask

    return FieldTask(cfg, env)


def report() -> WorkloadReport:
    from hpctrain.workloads.fields.report import REPORT

    return REPORT


VERBS = Verbs(
    tasks={"field_cnn": field_task},
    data=lazy_data_verbs(_data_verbs),
    evaluate=ModelVerb(evaluate_args, evaluate, check_evaluate),
    report=report,
)
