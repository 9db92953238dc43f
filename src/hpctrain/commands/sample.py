"""`hpctrain sample RUN_DIR_OR_CHECKPOINT [options]`: generate samples from a trained model, through its
workload (muon models: `--primaries FILE | --n-events N --out FILE.parquet [--seed S]`)."""

from __future__ import annotations

from hpctrain.commands.model_verb import run_model_verb

DESCRIPTION = (
    "Generate samples from a trained model with its workload's sampler (muon models: bundles written in the "
    "current Parquet layout)."
)


def main(argv: list[str]) -> int:
    return run_model_verb("sample", DESCRIPTION, argv)
