"""Reading YAML: the config file and values typed as text, with YAML 1.1's surprises taken out and bounds on size.

A config may be read on a login node that many people share, so hostile YAML must cost little: a file is refused
past `MAX_BYTES`; a document past `MAX_NODES` values or `MAX_CHARS` characters counted with every alias expanded
(a few hundred bytes of nested anchors, "billion laughs", otherwise expand to billions), deeper than `MAX_DEPTH`,
or with an alias inside its own anchor (a loop). Composing counts as it goes, so a refusal costs about as much as
reading the text.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

import yaml

from hpctrain.config.messages import cut
from hpctrain.errors import UserError

# A config file is settings and lists of files: 4 MiB is ~40,000 paths, far past any real one.
MAX_BYTES = 4 * 1024 * 1024
# Values of a document counted with every alias expanded: what the checks after reading walk through.
MAX_NODES = 200_000
MAX_DEPTH = 100
# Characters of its text values, aliases expanded: what is printed and saved with the run.
MAX_CHARS = 4 * MAX_BYTES


class _Loader(yaml.SafeLoader):  # type: ignore[misc]  # (PyYAML ships no type hints)
    """YAML 1.1 without base-60 numbers (`time: 1:00:00` stays the text SLURM means, not the integer 3600) and
    with YAML 1.2's booleans (true/false only: `on_spike: off` is text), and
    composing that counts values with aliases expanded and refuses past the bounds."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        # Values and characters composed so far, an alias counting as everything under its anchor.
        self._expanded = [0, 0]
        self._sizes: dict[int, tuple[int, int]] = {}  # id(node) -> its (values, characters), once complete
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        alias = self.check_event(yaml.AliasEvent)
        values, chars = self._expanded
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _TooBig(f"nests deeper than {MAX_DEPTH} levels")
        node = super().compose_node(parent, index)
        self._depth -= 1
        if alias:
            size = self._sizes.get(id(node))
            if size is None:  # its anchor is still open: the alias is inside what it names
                raise _TooBig("has an alias inside its own anchor (a loop)")
            self._expanded[0] += size[0]
            self._expanded[1] += size[1]
        else:
            self._expanded[0] += 1
            self._expanded[1] += len(node.value) if isinstance(node.value, str) else 0
            self._sizes[id(node)] = (self._expanded[0] - values, self._expanded[1] - chars)
        if self._expanded[0] > MAX_NODES:
            raise _TooBig(
                f"expands to more than {MAX_NODES:,} values through its aliases (*name repeating &name)"
                if alias
                else f"holds more than {MAX_NODES:,} values"
            )
        if self._expanded[1] > MAX_CHARS:  # only aliases get here: a file's own text is at most MAX_BYTES
            raise _TooBig(
                f"expands to more than {MAX_CHARS // 2**20} MiB of text through its aliases (*name repeating &name)"
            )
        return node


class _TooBig(Exception):
    """A document past the bounds (the text says how)."""


_Loader.yaml_implicit_resolvers = {
    first: [
        (tag, regexp)
        for tag, regexp in resolvers
        if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:bool")
    ]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
# Booleans as YAML 1.2 writes them: `on_spike: off` stays the text "off" (YAML 1.1 read off/on/yes/no/y/n as
# booleans: the documented value was refused as False); a boolean field still reads yes/no/on/off (pydantic).
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"),
)
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def load_yaml(text: str, what: str) -> Any:
    """One YAML document, bounded; a document past the bounds is a UserError naming `what`. Malformed YAML
    raises yaml.YAMLError (the caller decides whether that is an error or plain text)."""
    loader = _Loader(text)
    try:
        return loader.get_single_data()
    except _TooBig as exc:
        raise UserError(f"{what} {exc}: refused") from None
    except RecursionError:
        raise UserError(f"{what} nests too deeply: refused") from None
    except ValueError as exc:  # a number past Python's 4300 digits, a date that does not exist
        if "integer string conversion" in str(exc):
            raise UserError(f"{what} holds a number of more than 4300 digits: refused") from None
        raise UserError(f"{what}: {cut(str(exc).splitlines()[0], 120)}") from None
    finally:
        loader.dispose()


def _near(file: Path) -> str:
    """`; did you mean configs/muons_quick.yaml?`: the YAML files of the nearest existing folder closest to the
    name typed (configs/muon_quick.yaml, config/muons.yaml), or those of ./configs; "" when none is close."""
    folder = file.parent
    while not folder.is_dir() and folder != folder.parent:
        folder = folder.parent
    candidates = [p for d in (folder, Path("configs")) if d.is_dir() for p in d.iterdir()]
    names = {str(p): p for p in candidates if p.suffix in (".yaml", ".yml") and p.is_file()}
    near = difflib.get_close_matches(str(file), list(names), n=1, cutoff=0.6)
    return f"; did you mean {near[0]}?" if near else ""


def read_yaml(path: str) -> dict[str, Any]:
    """The mapping of sections a config file holds; every problem with it a one-line UserError naming it."""
    file = Path(path)
    if file.is_dir():
        raise UserError(f"config file {path!r} is a folder; name a YAML file in it (e.g. {path}/debug.yaml)")
    if not file.is_file():
        raise UserError(f"config file {path!r} not found{_near(file)}")
    what = f"config file {path!r}"
    try:
        with file.open("rb") as stream:
            raw = stream.read(MAX_BYTES + 1)
        if len(raw) > MAX_BYTES:
            raise UserError(
                f"{what} is larger than {MAX_BYTES // 2**20} MiB ({file.stat().st_size:,} bytes): refused; "
                "a config holds settings (list many data files with a glob or a folder)"
            )
        text = raw.decode("utf-8")
        data = load_yaml(text, what)
    except UnicodeDecodeError as exc:
        raise UserError(f"{what} is not UTF-8 text (byte {exc.start}): is it a YAML file?") from None
    except OSError as exc:
        raise UserError(f"{what} cannot be read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise UserError(_malformed(what, text, exc)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"{what}: the top level must be a mapping of sections")
    return data


# An unquoted value with ${...} in it: inside [...] or {...} the braces are YAML syntax, not text.
_UNQUOTED_VAR = re.compile(r"""(?<![^\s,\[{:])([^\s,\[\]{}'"]*\$\{[^\s,\]'"]*)""")


def _malformed(what: str, text: str, exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    line = text.splitlines()[mark.line] if mark and mark.line < len(text.splitlines()) else ""
    if "${" in line:  # `paths: [${DATA_DIR}/train]`: say how to write it
        fixed = _UNQUOTED_VAR.sub(lambda m: f"'{m[1]}'", line.strip())
        if fixed != line.strip():
            return (
                f"{what}: malformed YAML{where}: a ${{VAR}} inside [...] or {{...}} is read as YAML syntax; "
                f"quote it: {cut(fixed, 120)}"
            )
    return f"{what}: malformed YAML{where}: {cut(problem, 120)}"


def parse_value(text: str, what: str = "the value") -> Any:
    """YAML scalars (`0`, `true`, `[1, 2]`, `null`), and numbers YAML 1.1 misses (`2e-5`); else the string.
    `what` names the value in a refusal (past the bounds)."""
    try:
        value = load_yaml(text, what)
    except yaml.YAMLError:
        return text
    if isinstance(value, str) and re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+", value):
        return float(value)
    return value
