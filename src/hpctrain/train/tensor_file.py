"""Reading the bytes torch.save wrote as tensors and plain values only (torch.load(weights_only=True)): what
a checkpoint and an export's networks are read with, and why a file that holds anything else is refused."""

from __future__ import annotations

import io
import pickle
import re
from typing import Any

import torch

# What torch names when its restricted unpickler meets an object: `Unsupported global: GLOBAL numpy...`, `Trying to
# load unsupported GLOBAL posix.system whose module posix is blocked`.
_REFUSED_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")


class Refused(Exception):
    """The file holds objects other than tensors and plain values; the text says which, in hpctrain's words."""


def objects_refused(exc: BaseException) -> str:
    """Why a file that torch.load(weights_only=True) refused cannot be used: it holds objects other than tensors
    and plain values (code, a library's classes), named when torch names them. torch's own text goes on to say
    how to load it anyway (`weights_only=False`, "if you trust the source"): for a file in a shared folder that
    is how someone else's code would run as ours, so it is never passed on."""
    text = str(exc)
    found = _REFUSED_GLOBAL.search(text)
    if found:
        what = f"objects other than tensors ({found.group(1)})"
    elif "WeightsUnpickler error:" in text:  # a pickle opcode torch does not take: `Unsupported operand 103`
        detail = [
            line.strip() for line in text.split("WeightsUnpickler error:", 1)[1].splitlines() if line.strip()
        ]
        what = f"something other than tensors and plain values ({detail[0][:100] if detail else 'unknown'})"
    else:
        lines = [line for line in text.splitlines() if line.strip() and "weights_only" not in line]
        return f"unreadable ({lines[0][:200] if lines else type(exc).__name__})"
    return f"it holds {what}, which hpctrain refuses to load (an hpctrain checkpoint holds tensors and plain values only)"


def load_tensors(data: bytes) -> Any:
    """The object torch.save wrote into `data`, on the CPU, if it holds tensors and plain values only; Refused
    (its text: objects_refused) if the restricted unpickler met anything else. Other format errors (a cut or
    foreign file) pass through as torch raises them."""
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise Refused(objects_refused(exc)) from None
