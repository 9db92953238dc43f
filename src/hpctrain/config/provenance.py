"""Where each value came from, and the notes said at start about the sources a user does not see.

`Provenance` remembers every source that set each dotted key, in the order applied, so that `config show` can
mark each value's source, and `announce` can name every value taken from the environment or `.env`, every
conflict between sources, and every value of the user's config file that a preset replaced.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import SecretStr

from hpctrain.config.messages import cut
from hpctrain.config.secrets import looks_secret, mask_secrets

# Sources a user does not see in the command: a value from one of them is always named at start.
_IMPLICIT = ("environment ", ".env ")


def _shown(key: str, value: Any) -> str:
    if looks_secret(key) or isinstance(value, SecretStr):
        return "***"
    return cut(value if isinstance(value, str) else json.dumps(value, default=str))


def leaves(key: str, value: Any) -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every leaf under `key` (an empty section is a leaf)."""
    if isinstance(value, dict) and value:
        for child, sub in value.items():
            yield from leaves(f"{key}.{child}", sub)
    else:
        yield key, value


@dataclass
class Provenance:
    """Every source that set each dotted key, in the order applied (the last one won)."""

    sets: dict[str, list[tuple[str, Any]]] = field(default_factory=dict)
    raw: dict[str, str] = field(default_factory=dict)  # the text of variables, as the user wrote it
    naming: str | None = None  # how an automatic run.name was formed (None: run.name was given)
    masked: list[str] = field(default_factory=list)  # secrets given as a mask ('**********'): left unset

    def add(self, key: str, value: Any, source: str) -> None:
        for dotted, leaf in leaves(key, value):
            self.sets.setdefault(dotted, []).append((source, leaf))

    def source(self, key: str) -> str | None:
        """The source whose value a key holds (None: the default)."""
        found = self.sets.get(key)
        return found[-1][0] if found else None

    def conflicts(self) -> list[str]:
        """One line (or none) naming every key that the environment or .env set to a value another source
        contradicts, and which won. The layers a user names in the command itself (config file, preset,
        overrides) replace each other by design: `config show` marks where each value came from."""
        items = []
        for key, sets in self.sets.items():
            winner, value = sets[-1]
            losers = [(src, v) for src, v in sets[:-1] if v != value]
            implicit = any(src.startswith(_IMPLICIT) for src, _ in [(winner, value), *losers])
            if losers and implicit:
                beaten = ", ".join(f"{src}: {_shown(key, self.raw.get(src, v))}" for src, v in losers)
                items.append(f"{key}={_shown(key, value)} from {winner} (over {beaten})")
        return ["note: where sources disagree the later one wins: " + "; ".join(items)] if items else []

    def from_environment(self) -> str | None:
        """One line naming every value taken from the environment or .env (key, value, variable)."""
        items = []
        for key, sets in self.sets.items():
            src = sets[-1][0]
            if src.startswith(_IMPLICIT):
                items.append(f"{key}={_shown(key, self.raw.get(src, sets[-1][1]))} ({src})")
        return "note: taken from the environment or .env: " + ", ".join(items) if items else None

    def masked_secrets(self) -> str | None:
        """One line naming every secret whose given value was a mask, not a secret (treated as unset)."""
        if not self.masked:
            return None
        return (
            f"note: {', '.join(self.masked)}: a masked value ('**********', as a saved config.yaml writes "
            "secrets), not a secret: treated as unset (give the real one in .env or the environment)"
        )

    def preset_changes(self) -> str | None:
        """One line naming every value of the user's config file that a preset replaced (and that nothing later
        set again): the preset wins by design, but never without a word."""
        items = []
        preset = file = ""
        for key, sets in self.sets.items():
            if len(sets) < 2 or not sets[-1][0].startswith("preset "):
                continue
            (src, mine), (preset, theirs) = sets[-2], sets[-1]
            if src.startswith("config file ") and mine != theirs:
                file = src
                items.append(f"{key}: {_shown(key, mine)} -> {_shown(key, theirs)}")
        if not items:
            return None
        return (
            f"note: {preset} changed what {file} set (the preset wins; a key=value on the command line "
            f"beats it): {', '.join(items)}"
        )


def is_rank_zero(environ: dict[str, str] | None = None) -> bool:
    """Whether this process speaks for the job: torchrun's RANK, else srun's SLURM_PROCID, is 0 or absent."""
    environ = dict(os.environ) if environ is None else environ
    rank = environ.get("RANK") or environ.get("SLURM_PROCID") or "0"
    return rank.strip() == "0"


def announce(sources: Provenance) -> None:
    """On stderr, rank 0 only: the config file's values a preset replaced, the values taken from the
    environment or .env, and every conflict resolved."""
    if not is_rank_zero():
        return
    lines = [
        sources.masked_secrets(),
        sources.preset_changes(),
        sources.from_environment(),
        *sources.conflicts(),
    ]
    for text in lines:
        if text:
            print(mask_secrets(text), file=sys.stderr, flush=True)
