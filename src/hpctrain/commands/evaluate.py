"""`hpctrain evaluate RUN_DIR_OR_CHECKPOINT [options]`: a trained model's quality figures, through its workload
(muon models: generated bundles vs fresh synthetic truth, W1 and KS)."""

from __future__ import annotations

from hpctrain.commands.model_verb import run_model_verb

DESCRIPTION = (
    "Quality figures of a trained model from its workload (muon models: 1-D Wasserstein distances and KS "
    "statistics of multiplicity, muon energy and lateral distance against fresh samples of the synthetic "
    "truth, overall and per primary-energy bin; writes evaluate.json in the run folder and appends the figures "
    "to metrics.jsonl)."
)


def main(argv: list[str]) -> int:
    return run_model_verb("evaluate", DESCRIPTION, argv)
