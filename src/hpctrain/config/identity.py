"""A run folder continues only its own run: which keys may differ from the checkpoint's, and the check on resume.

Every config key is marked where it is defined (config/sections/, the workloads' specs; `json_schema_extra=`):
  identity    another value makes another run (model, data content and order, seed, optimizer, schedule,
              precision, batch size): refused on resume unless named in `checkpoint.accept_changes`
  may_change  where, how fast and how the run is watched (time budget, SLURM, logging, evaluation and
              checkpoint intervals, workers, device, threads): listed in one line at start, then used
  grows       the run's length (train.total_updates, train.epochs): may change when the LR of the updates
              already trained stays what the new length gives (train/length.py decides); otherwise it is refused
              unless named in `checkpoint.accept_changes`, and it never falls below the update reached
A field without its own mark takes the mark of the field that holds its section. Secrets are masked in the
dumped config: they are never compared or shown. Nothing here imports torch (login nodes).
"""

from __future__ import annotations

import json
import typing
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

from hpctrain.config.secrets import mask_tree

IDENTITY, MAY_CHANGE, GROWS = "identity", "may_change", "grows"
SECRET = "secret"
# Recorded as "accepted" already: listing it among the allowed changes too would only repeat it.
_NOT_LISTED = ("checkpoint.accept_changes",)
_SHOWN_CHANGES = 6  # a refusal names this many keys at most, so that it stays one readable line


def _mark(info: FieldInfo) -> str | None:
    extra = info.json_schema_extra
    return extra.get("resume") if isinstance(extra, dict) else None  # type: ignore[return-value]


def _holds_secret(annotation: Any) -> bool:
    return annotation is SecretStr or any(_holds_secret(arg) for arg in typing.get_args(annotation))


def classify(cfg: BaseModel, inherited: str | None = None, prefix: str = "") -> dict[str, str | None]:
    """Dotted key -> identity | may_change | grows | secret (None: unmarked, a defect a test catches)."""
    found: dict[str, str | None] = {}
    for name, info in type(cfg).model_fields.items():
        key = f"{prefix}{name}"
        mark = _mark(info) or inherited
        value = getattr(cfg, name)
        if isinstance(value, BaseModel):
            found.update(classify(value, mark, f"{key}."))
        else:
            found[key] = SECRET if _holds_secret(info.annotation) else mark
    return found


def _lookup(tree: Any, key: str) -> tuple[bool, Any]:
    for part in key.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return False, None
        tree = tree[part]
    return True, tree


def identity_values(cfg: BaseModel) -> dict[str, Any]:
    """The identity keys and their dumped values (tokens in URIs masked: a renewed token is the same run):
    what config_hash hashes and automatic run names are made of."""
    dumped = mask_tree(cfg.model_dump(mode="json"))
    return {key: _lookup(dumped, key)[1] for key, mark in classify(cfg).items() if mark == IDENTITY}


def show(value: Any, limit: int = 40) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass
class Change:
    key: str
    old: Any
    new: Any
    mark: str
    effect: str = ""  # what the change would do (a length's to the LR), said when it is refused

    def __str__(self) -> str:
        shown = f"{self.key} {show(self.old)} -> {show(self.new)}"
        return f"{shown} ({self.effect})" if self.effect else shown


def differences(old: dict[str, Any], cfg: BaseModel) -> list[Change]:
    """Keys whose value differs from the checkpoint's dumped config `old` (keys it lacks are not compared).
    Both masked as checkpoints store them (config/dump.py): a token in a URI is neither compared nor recorded
    (chain.json, the changes said at start), and a checkpoint written before the masking compares alike."""
    old, new = mask_tree(old), mask_tree(cfg.model_dump(mode="json"))
    marks = classify(cfg)
    changes = []
    for key, mark in marks.items():
        parts = key.split(".")
        sections = [".".join(parts[:i]) for i in range(1, len(parts))]
        if mark == SECRET or any(_retyped(old, new, s) and key != f"{s}.type" for s in sections):
            continue  # a section of another `type` differs by its type alone
        known, before = _lookup(old, key)
        after = _lookup(new, key)[1]
        if known and before != after:
            changes.append(Change(key, before, after, mark or IDENTITY))
    return changes


def _retyped(old: dict[str, Any], new: dict[str, Any], section: str) -> bool:
    had, old_type = _lookup(old, f"{section}.type")
    has, new_type = _lookup(new, f"{section}.type")
    return had and has and old_type != new_type


@dataclass
class Verdict:
    """What changed since the checkpoint, and what the run does about it."""

    accepted: list[Change] = field(default_factory=list)  # identity keys the user accepted
    allowed: list[Change] = field(default_factory=list)  # may_change keys, length grown, world size
    refused: list[Change] = field(default_factory=list)  # identity keys nobody accepted

    def record(self) -> dict[str, dict[str, list[Any]]]:
        """The changes as {"accepted": {key: [old, new]}, "allowed": {...}} (checkpoint and chain.json)."""
        return {
            "accepted": {c.key: [c.old, c.new] for c in self.accepted},
            "allowed": {c.key: [c.old, c.new] for c in self.allowed},
        }


def unknown_keys(cfg: BaseModel, keys: list[str]) -> list[str]:
    """The names in `keys` that are neither a dotted key of `cfg` nor a section holding some."""
    marks = classify(cfg)
    return [k for k in keys if k not in marks and not any(m.startswith(k + ".") for m in marks)]


def _accepts(accept: list[str], key: str) -> bool:
    return any(key == a or key.startswith(a + ".") for a in accept)


def judge(
    old: dict[str, Any],
    cfg: BaseModel,
    *,
    old_total: int | None,
    new_total: int,
    old_world: int | None,
    new_world: int,
    length_effect: str | None = None,
) -> Verdict:
    """Sort the differences from the checkpoint's config into accepted, allowed and refused. A change of length
    (old_total -> new_total updates) is allowed unless `length_effect` says what it would do to the LR of the
    updates already trained (train/length.py): then it needs `checkpoint.accept_changes` like an identity key."""
    accept = list(getattr(getattr(cfg, "checkpoint", None), "accept_changes", []) or [])
    needs_consent = length_effect is not None and old_total != new_total
    changes = [c for c in differences(old, cfg) if c.key not in _NOT_LISTED]
    train = getattr(cfg, "train", None)
    by_epochs = getattr(train, "epochs", None) is not None or _lookup(old, "train.epochs")[1] is not None
    if old_total is not None and by_epochs:
        # train.epochs sets the length (train.total_updates is then ignored): the updates that ran and will run
        # are what changed, not the keys' values (a `train.total_updates 256 -> 200` beside a run to 256).
        changes = [c for c in changes if c.mark != GROWS]
    if old_total is not None and old_total != new_total and not any(c.mark == GROWS for c in changes):
        # The same keys, another length (train.epochs over another global batch): named by the key that sets it.
        key = "train.epochs" if getattr(train, "epochs", None) is not None else "train.total_updates"
        changes.append(Change(key, f"{old_total} updates", f"{new_total} updates", GROWS))
    verdict = Verdict()
    for change in changes:
        if change.mark == MAY_CHANGE or (change.mark == GROWS and not needs_consent):
            verdict.allowed.append(change)
        elif _accepts(accept, change.key):
            verdict.accepted.append(change)
        else:
            if change.mark == GROWS:
                change.effect = length_effect or ""
            verdict.refused.append(change)
    if old_world is not None and old_world != new_world:
        verdict.allowed.append(Change("world_size", old_world, new_world, MAY_CHANGE))
    return verdict


def refusal(where: str, refused: list[Change], remedy: str) -> str:
    """One line: the differing identity keys (checkpoint value -> new value) and the two ways forward."""
    shown = ", ".join(map(str, refused[:_SHOWN_CHANGES]))
    if len(refused) > _SHOWN_CHANGES:
        shown += f" and {len(refused) - _SHOWN_CHANGES} more"
    keys = ",".join(c.key for c in refused)
    return (
        f"{where} was trained with a different configuration: {shown}; {remedy}, or accept the change "
        f"with checkpoint.accept_changes=[{keys}]"
    )
