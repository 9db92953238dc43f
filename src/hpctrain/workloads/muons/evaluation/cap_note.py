"""The muon cap on both sides, said wherever the judge's figures are shown (`hpctrain evaluate`, the table at the
end of training, `hpctrain report`): the training REMOVED the true events above data.max_muons_per_event; the
judge CLAMPS the true events above the model's cap to it (their first `cap` muons, quality.clamp_to_cap), as the
generator clamps its sampled multiplicity at the cap. From evaluate.json's "info"; no torch."""

from __future__ import annotations

from typing import Any

from hpctrain.track.report import RunData, Table


def _pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.2f} %" if whole else "n/a"


def cap_statement(info: dict[str, Any]) -> str:
    """One line: the cap, and what it did to the true and the generated events of this evaluation."""
    cap = info.get("muon_cap")
    if not cap:
        return ""
    events = int(info.get("events") or 0)
    true_at = int(info.get("truth_events_clamped_at_cap") or 0)
    generated_at = info.get("generated_events_at_cap")
    trained = info.get("data_max_muons_per_event")
    training = (
        f"the training removed the true events above data.max_muons_per_event={trained}; "
        if trained
        else "the training kept every event (data.max_muons_per_event=0); "
    )
    generated = (
        f"{int(generated_at):,} of the generated events ({_pct(int(generated_at), events)}) have their multiplicity "
        "clamped at it"
        if generated_at is not None
        else "the generated multiplicities are clamped at it"
    )
    return (
        f"muon cap {cap}: {training}here {true_at:,} of the {events:,} true events ({_pct(true_at, events)}) are "
        f"clamped at the cap (their first {cap} muons kept) and {generated}"
    )


def cap_table(data: RunData) -> list[Table]:
    """The statement as the report's table of the muon cap (nothing without an evaluation)."""
    info = data.evaluation.get("info") or {}
    if not info.get("muon_cap"):
        return []
    cap, events = info["muon_cap"], int(info.get("events") or 0)
    true_at = int(info.get("truth_events_clamped_at_cap") or 0)
    generated_at = info.get("generated_events_at_cap")
    trained = info.get("data_max_muons_per_event")
    rows = [
        [
            "training data",
            f"events above {trained} muons removed" if trained else "no cap",
            "see the training log",
        ],
        [
            "true events judged",
            f"clamped at {cap} (first {cap} muons kept)",
            f"{true_at:,} ({_pct(true_at, events)})",
        ],
        [
            "generated events",
            f"multiplicity clamped at {cap}",
            "n/a" if generated_at is None else f"{int(generated_at):,} ({_pct(int(generated_at), events)})",
        ],
    ]
    note = (
        "The muon cap on both sides: the training loader removes the events above data.max_muons_per_event (said "
        "once per split and hop in the training log, with their share of events and muons); the judge clamps the "
        "true events at the model's cap, as the generator clamps its multiplicity, so neither side gets events the "
        "other cannot have."
    )
    return [Table(f"The muon cap ({cap} muons per event)", ["side", "rule", "events at the cap"], rows, note)]
