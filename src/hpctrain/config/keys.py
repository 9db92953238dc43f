"""The dotted keys of a config type: what each key holds, the nearest valid keys to a misspelt one, the docs.

Everything is read from the pydantic models themselves (annotation, default, `description=`), so a new field is
known here without any list to maintain. The model and data sections are unions of the workloads' sections:
a key is known when any member has it.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterator
from typing import Any, Literal, Union

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

_UNIONS = (Union, types.UnionType)


def _members(annotation: Any) -> list[Any]:
    """The alternatives of an annotation: through Optional, unions and Annotated (not into containers)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _members(typing.get_args(annotation)[0])
    if origin in _UNIONS:
        return [m for arg in typing.get_args(annotation) for m in _members(arg)]
    return [annotation]


def _sections(annotation: Any) -> list[type[BaseModel]]:
    return [m for m in _members(annotation) if isinstance(m, type) and issubclass(m, BaseModel)]


def _fields(classes: list[type[BaseModel]], name: str) -> list[FieldInfo]:
    return [cls.model_fields[name] for cls in classes if name in cls.model_fields]


def field_infos(cls: type[BaseModel], dotted: str) -> list[FieldInfo]:
    """Every field a dotted key may name (several inside the model/data unions); [] when unknown."""
    classes = [cls]
    parts = dotted.split(".")
    for part in parts[:-1]:
        classes = [s for info in _fields(classes, part) for s in _sections(info.annotation)]
    return _fields(classes, parts[-1])


def _is_text(member: Any) -> bool:
    if typing.get_origin(member) is Literal:
        return all(isinstance(v, str) for v in typing.get_args(member))
    return member in (str, SecretStr)


def kind(cls: type[BaseModel], dotted: str) -> str | None:
    """ "text" when the key holds a string (str, SecretStr, string literals, optional or not), "bool" for a
    boolean, "list" for a list, None otherwise (numbers, lists, sections, unknown keys): how a value typed on the command line is
    read."""
    members = [
        m for info in field_infos(cls, dotted) for m in _members(info.annotation) if m is not type(None)
    ]
    if not members:
        return None
    if all(_is_text(m) for m in members):
        return "text"
    if all(m is bool for m in members):
        return "bool"
    if all(typing.get_origin(m) is list or m is list for m in members):
        return "list"
    return None


def optional(cls: type[BaseModel], dotted: str) -> bool:
    return any(type(None) in _members(info.annotation) for info in field_infos(cls, dotted))


def walk(cls: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, FieldInfo, type[BaseModel]]]:
    """(dotted key, field, owning section) of every leaf, depth first; union members one after another."""
    for name, info in cls.model_fields.items():
        sections = _sections(info.annotation)
        if sections:
            for section in sections:
                yield from walk(section, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", info, cls


def all_keys(cls: type[BaseModel]) -> list[str]:
    """Every dotted key: leaves and the sections that hold them, each once."""
    keys: dict[str, None] = {}
    for key, _, _ in walk(cls):
        parts = key.split(".")
        for i in range(1, len(parts) + 1):
            keys[".".join(parts[:i])] = None
    return list(keys)


def types_with(cls: type[BaseModel], dotted: str) -> list[str]:
    """The `type`s of the union members of a section (model, data) that have the key below it: `types_with(cfg,
    "model.critic_steps")` -> ["muon_wgan"]; [] for a key outside the unions."""
    section, _, rest = dotted.partition(".")
    info = cls.model_fields.get(section)
    if info is None or not rest:
        return []
    members = _sections(info.annotation)
    if len(members) < 2:
        return []
    return [tag for m in members if (tag := _section_type(m)) is not None and field_infos(m, rest)]


def suggest(cls: type[BaseModel], key: str, limit: int = 3) -> list[str]:
    """The valid keys nearest to a misspelt one: a sibling in the same section (optim.lrr -> optim.lr), else a
    key anywhere with that name (lr -> optim.lr), else the nearest whole key (optimm.lr -> optim.lr)."""
    keys = all_keys(cls)
    parent, _, leaf = key.rpartition(".")
    siblings = {k.rpartition(".")[2]: k for k in keys if k.rpartition(".")[0] == parent}
    found = [siblings[n] for n in difflib.get_close_matches(leaf, list(siblings), n=limit, cutoff=0.6)]
    if not found:
        by_leaf: dict[str, list[str]] = {}
        for k in keys:
            by_leaf.setdefault(k.rpartition(".")[2], []).append(k)
        for near in difflib.get_close_matches(leaf, list(by_leaf), n=limit, cutoff=0.75):
            found += by_leaf[near]
    if not found:
        found = difflib.get_close_matches(key, keys, n=limit, cutoff=0.75)
    return found[:limit]


def _types_in(annotation: Any) -> Iterator[Any]:
    """The classes an annotation may hold: through Optional, unions, Annotated and containers."""
    args = typing.get_args(annotation)
    if not args:
        yield annotation
    for arg in args:
        yield from _types_in(arg)


def secret_keys(cls: type[BaseModel], prefix: str = "") -> set[str]:
    """Dotted keys of every SecretStr field; a union's members (model/data types) share their section's key."""
    found: set[str] = set()
    for name, info in cls.model_fields.items():
        for kind in _types_in(info.annotation):
            if kind is SecretStr:
                found.add(prefix + name)
            elif isinstance(kind, type) and issubclass(kind, BaseModel):
                found |= secret_keys(kind, f"{prefix}{name}.")
    return found


# ----------------------------------------------------------------------------------------------- docs


def type_name(annotation: Any) -> str:
    """A short, readable type: `float`, `str | None`, `adamw | adam | sgd`, `list[str]`."""
    members = _members(annotation)
    if len(members) > 1:
        return " | ".join(type_name(m) for m in members)
    (member,) = members
    origin = typing.get_origin(member)
    if origin is Literal:
        return " | ".join(str(v) for v in typing.get_args(member))
    if origin is not None:
        args = ", ".join(type_name(a) for a in typing.get_args(member))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if member is type(None):
        return "None"
    return getattr(member, "__name__", str(member))


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]
    elif info.default is PydanticUndefined:
        return "required"
    else:
        value = info.default
    if isinstance(value, BaseModel):
        return "{...}"
    if isinstance(value, tuple):
        value = list(value)
    return "null" if value is None else repr(value) if isinstance(value, str) else str(value)


def _section_type(section: type[BaseModel]) -> str | None:
    info = section.model_fields.get("type")
    args = typing.get_args(info.annotation) if info is not None else ()
    return str(args[0]) if len(args) == 1 else None


def doc_lines(cls: type[BaseModel], prefix: str = "", types_shown: dict[str, str] | None = None) -> list[str]:
    """`key (type, default D): description` for every key under `prefix` (all when empty). `types_shown` maps
    a union section (model, data) to the one member type to show; a union section missing from it shows all."""
    types_shown = types_shown or {}
    lines: list[str] = []
    for name, top in cls.model_fields.items():
        sections = _sections(top.annotation)
        if not sections:
            entries = [(name, top, "")]
        else:
            entries = []
            for section in sections:
                member = _section_type(section) if len(sections) > 1 else None
                if member is not None and name in types_shown and member != types_shown[name]:
                    continue
                where = f" [{name}.type={member}]" if member is not None and name not in types_shown else ""
                entries += [(key, info, where) for key, info, _ in walk(section, f"{name}.")]
        for key, info, where in entries:
            if prefix and key != prefix and not key.startswith(prefix + "."):
                continue
            text = info.description or "(no description)"
            lines.append(f"{key} ({type_name(info.annotation)}, default {_default(info)}){where}: {text}")
    return lines
