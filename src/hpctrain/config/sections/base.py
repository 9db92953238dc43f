"""What every section shares: the `Section` base, the resume marks of a key (IDENTITY, MAY_CHANGE, GROWS), the
largest seed and `sbatch --time` durations."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """Base of every section: unknown keys are errors, values are validated on assignment too."""

    # allow_inf_nan=False: `optim.lr=inf` is a typo to refuse now, not a NaN loss at update 2.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


JsonDict = dict[str, Any]  # what `json_schema_extra=` takes (pydantic exports no name for it)

# What a key means for a run that continues from its checkpoint, as `json_schema_extra=` of its field (a field
# without one takes the mark of the field holding its section; config/identity.py reads them; a test asserts
# that every key of every workload's config has one):
IDENTITY: JsonDict = {"resume": "identity"}  # another run: refused unless in checkpoint.accept_changes
MAY_CHANGE: JsonDict = {"resume": "may_change"}  # where, how fast, how it is watched: listed at start
GROWS: JsonDict = {
    "resume": "grows"
}  # the run's length: changes unless it rewrites the LR trained (train/length.py)


# The largest run.seed: torch.manual_seed takes it as is (seeding.seed_everything) and every int64 reader of a dumped
# config (YAML, JSON, TensorBoard/W&B hparams) keeps it exact; the derived streams (seeding.derive) are below it too.
SEED_MAX = 2**63 - 1

DURATION_FORMS = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"


def parse_duration(text: str) -> float:
    """Seconds in a duration written as `sbatch --time` takes it: "30" (minutes), "30:00" (MM:SS), "1:00:00",
    "2-00" (days-hours), "2-12:00", "2-12:00:00". Minutes and seconds after a colon must be below 60: SLURM
    22.05 quietly carries them over ("1:99" becomes 3 minutes), which hides a typo."""
    text = str(text).strip()
    if not re.fullmatch(r"(\d+-)?\d+(:\d+){0,2}", text):
        raise ValueError(f"{text!r} is not a duration: use {DURATION_FORMS}")
    days, _, rest = text.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if any(p >= 60 for p in parts[1:]):
        raise ValueError(f"{text!r} is not a duration: minutes and seconds after a colon must be below 60")
    if days:  # days-hours[:minutes[:seconds]]
        hours, minutes, seconds = (*parts, 0, 0)[:3]
        hours += 24 * int(days)
    elif len(parts) == 3:
        hours, minutes, seconds = parts
    else:  # minutes[:seconds]
        hours, minutes, seconds = 0, parts[0], (parts[1] if len(parts) == 2 else 0)
    return float((hours * 60 + minutes) * 60 + seconds)
