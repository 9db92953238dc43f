"""Error text: a value quoted in an error is cut short, every error is one line, secrets are masked.

A config can hold a 20,000-element list or a megabyte string; an error naming it must still be one short line a
terminal and a SLURM log show whole. `quote` is how every error shows a value the user gave; `error_line` is
what the command line prints for any error, whoever raised it (the last guard: secrets masked, one line, capped).
"""

from __future__ import annotations

from typing import Any

from hpctrain.config.secrets import mask_secrets

# The longest quoted value an error shows, in characters (then an ellipsis and the whole value's size).
QUOTE_LIMIT = 80
# The longest error line (a guard: the messages themselves are built shorter).
LINE_LIMIT = 1000


def _brief(value: Any, budget: int) -> str:
    """repr(value), built only as far as about `budget` characters however large the value is."""
    if isinstance(value, str):
        return repr(value[: budget + 1])
    if isinstance(value, (list, tuple, dict)):
        items = value.items() if isinstance(value, dict) else value
        parts: list[str] = []
        used = 0
        for item in items:
            if used > budget:
                parts.append("...")
                break
            if isinstance(value, dict):
                key, sub = item
                part = f"{_brief(key, budget - used)}: {_brief(sub, budget - used)}"
            else:
                part = _brief(item, budget - used)
            parts.append(part)
            used += len(part) + 2
        ends = "{}" if isinstance(value, dict) else "()" if isinstance(value, tuple) else "[]"
        return ends[0] + ", ".join(parts) + ends[1]
    try:
        return repr(value)[: budget + 1]
    except ValueError:  # an integer past Python's 4300-digit limit for text
        return f"<a {value.bit_length()}-bit number>" if isinstance(value, int) else "<unprintable>"


def _size(value: Any) -> str:
    if isinstance(value, str):
        return f"{len(value)} chars"
    if isinstance(value, dict):
        return f"{len(value)} keys"
    if isinstance(value, (list, tuple)):
        return f"{len(value)} items"
    return "cut"


def quote(value: Any, limit: int = QUOTE_LIMIT) -> str:
    """The value as an error shows it: its repr, or its first `limit` characters, an ellipsis and its size
    (`'aaaa...' (20000 chars)`, `[0, 1, 2, ...] (20000 items)`)."""
    text = _brief(value, limit)
    if len(text) <= limit:
        return text
    return f"{text[: limit - 3]}... ({_size(value)})"


def cut(text: str, limit: int = QUOTE_LIMIT) -> str:
    """Text (not a value: no quotes added) cut to `limit` characters, with an ellipsis and its length."""
    return text if len(text) <= limit else f"{text[: limit - 3]}... ({len(text)} chars)"


def one_line(text: str, limit: int = LINE_LIMIT) -> str:
    """The text on one line (line breaks become spaces) of at most about `limit` characters."""
    text = " ".join(part.strip() for part in text.splitlines() if part.strip())
    return cut(text, limit)


def error_line(error: BaseException | str) -> str:
    """What any error prints: its text with secrets masked, on one line, capped."""
    return one_line(mask_secrets(str(error)))
