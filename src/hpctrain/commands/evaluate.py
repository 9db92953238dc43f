"""`hpctrain evaluate RUN_DIR_OR_CHECKPOINT [options]`: a trained model's quality figures, through its workload
(muon models: generated bundles vs fresh synthetic truth or held-out files: the per-feature table and the
classifier two-sample test).

`hpctrain evaluate --sample FILES --data FILES [--kind WORKLOAD]`: no model; a sample from anywhere judged
against true files by the workload's `evaluate_files` verb (muons: the same tables)."""

from __future__ import annotations

import argparse

from hpctrain.commands.common import ArgParser
from hpctrain.commands.model_verb import run_model_verb
from hpctrain.errors import UserError
from hpctrain.workloads import registry

DESCRIPTION = (
    "Quality figures of a trained model from its workload (muon models: 1-D Wasserstein distances and KS "
    "statistics per feature and bin of primary energy x zenith against the floor and a baseline, and a "
    "classifier two-sample test on per-event features: AUC overall and per primary-energy bin beside its null "
    "band, FPD and KPD; against fresh samples of the synthetic truth or held-out files; writes evaluate.json "
    "in the run folder and appends the figures to metrics.jsonl)."
)
FILES_DESCRIPTION = (
    "Judge a sample that came from anywhere (another generator's files, an older model's, a shuffled copy) "
    "against true files, with no model: the same tables as for a model. The workload is --kind, or the only "
    "one that offers it."
)
FILES_USAGE = "hpctrain evaluate --sample FILE... --data FILE... [--kind WORKLOAD] [options]"


def main(argv: list[str]) -> int:
    if any(arg == "--sample" or arg.startswith("--sample=") for arg in argv):
        return _judge_files(argv)
    files_help = [f"usage: {FILES_USAGE}", "", FILES_DESCRIPTION]
    for name, verb in registry.judging_files().items():
        parser = argparse.ArgumentParser(prog="hpctrain evaluate", add_help=False)
        verb.add_args(parser)
        files_help += ["", f"workload {name}:", parser.format_help().rstrip()]
    return run_model_verb("evaluate", DESCRIPTION, argv, "\n".join(files_help))


def _judge_files(argv: list[str]) -> int:
    offered = registry.judging_files()
    top = ArgParser(prog="hpctrain evaluate", add_help=False)
    top.add_argument("--kind", choices=sorted(offered) or None)
    known, _ = top.parse_known_args(argv)
    kind = known.kind
    if kind is None:
        if len(offered) != 1:
            able = ", ".join(offered) or "none"
            raise UserError(f"hpctrain evaluate --sample: name the workload with --kind (offered by: {able})")
        kind = next(iter(offered))
    parser = ArgParser(prog="hpctrain evaluate", usage=FILES_USAGE, description=FILES_DESCRIPTION)
    parser.add_argument("--kind", choices=sorted(offered), default=kind, help="the workload of the files")
    parser.add_argument("model", nargs="?", help=argparse.SUPPRESS)
    offered[kind].add_args(parser)
    args = parser.parse_args(argv)
    if args.model is not None:
        raise UserError(
            f"hpctrain evaluate: --sample judges files without a model, but {args.model!r} was named too; drop "
            "it, or drop --sample to judge that model's own bundles"
        )
    return offered[kind].judge(args)
