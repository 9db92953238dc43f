"""Where each value came from, and the notes said at start about the sources a user does not see.

`Provenance` remembers every source that set each dotted key, in the order applied, so that `config show` can
mark each value's source, and `announce` can name every value taken from the environment or `.env`, every
conflict between sources, and every value of the user's config file that a preset replaced.
"""

from __future__ import annotations

import enum
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import SecretStr

from hpctrain.config.messages import cut
from hpctrain.config.secrets import looks_secret, mask_secrets


class Layer(enum.Enum):
    """The layers of a config, in the order applied (a later one wins); the value is how a line names it."""

    CONFIG_FILE = "config file"
    PRESET = "preset"
    DOTENV = ".env"
    ENVIRONMENT = "environment"
    COMMAND_LINE = "command line"


@dataclass(frozen=True)
class Source:
    """Where a value came from: its layer, and the detail within it (the file's name, the preset, the
    variable's name; none for the command line). Said as `config file x.yaml`, `environment HPCTRAIN_OPTIM__LR`,
    `command line`."""

    layer: Layer
    detail: str

    def __str__(self) -> str:
        return f"{self.layer.value} {self.detail}" if self.detail else self.layer.value

    @property
    def implicit(self) -> bool:
        """A layer the user does not see in the command: a value from it is always named at start."""
        return self.layer in (Layer.DOTENV, Layer.ENVIRONMENT)

    @property
    def named(self) -> bool:
        """A layer an automatic run name is based on (values of the others name the run)."""
        return self.layer in (Layer.CONFIG_FILE, Layer.PRESET)


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

    sets: dict[str, list[tuple[Source, Any]]] = field(default_factory=dict)
    raw: dict[Source, str] = field(default_factory=dict)  # the text of variables, as the user wrote it
    naming: str | None = None  # how an automatic run.name was formed (None: run.name was given)
    masked: list[str] = field(default_factory=list)  # secrets given as a mask ('**********'): left unset

    def add(self, key: str, value: Any, source: Source) -> None:
        for dotted, leaf in leaves(key, value):
            self.sets.setdefault(dotted, []).append((source, leaf))

    def source(self, key: str) -> Source | None:
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
            implicit = any(src.implicit for src, _ in [(winner, value), *losers])
            if losers and implicit:
                beaten = ", ".join(f"{src}: {_shown(key, self.raw.get(src, v))}" for src, v in losers)
                items.append(f"{key}={_shown(key, value)} from {winner} (over {beaten})")
        return ["note: where sources disagree the later one wins: " + "; ".join(items)] if items else []

    def from_environment(self) -> str | None:
        """One line naming every value taken from the environment or .env (key, value, variable)."""
        items = []
        for key, sets in self.sets.items():
            src = sets[-1][0]
            if src.implicit:
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
            if len(sets) < 2 or sets[-1][0].layer is not Layer.PRESET:
                continue
            (src, mine), (by, theirs) = sets[-2], sets[-1]
            if src.layer is Layer.CONFIG_FILE and mine != theirs:
                file, preset = str(src), str(by)
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
