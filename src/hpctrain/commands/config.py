"""`hpctrain config show [--config ...] [--preset ...] [key=value ...]`: the resolved config, nothing run.

Each value that is not a default carries a trailing `# from ...` comment naming its source (the output stays
valid YAML). `--doc [SECTION]` prints every key instead, with its type, default and description.
"""

from __future__ import annotations

import re

from hpctrain.commands.common import ArgParser, add_config_arguments, announce, resolve_from_args
from hpctrain.config import keys
from hpctrain.config.dump import to_yaml
from hpctrain.config.loading import Provenance
from hpctrain.config.schema import ConfigBase
from hpctrain.errors import UserError

_LINE = re.compile(r"^(?P<indent> *)(?P<key>[^\s:#'\"-][^:]*):(?P<rest>.*)$")


def with_sources(text: str, sources: Provenance) -> str:
    """The YAML text with `# from SOURCE` after each key a source set (lists and their items are left alone)."""
    out: list[str] = []
    path: list[str] = []
    for line in text.splitlines():
        match = _LINE.match(line)
        if match:
            depth = len(match["indent"]) // 2
            path = [*path[:depth], match["key"]]
            source = sources.source(".".join(path))
            if source is not None and not match["rest"].strip().startswith(("|", ">")):
                line = f"{line}  # from {source}"
        out.append(line)
    return "\n".join(out) + "\n"


def _doc(cfg: ConfigBase, section: str, all_types: bool) -> str:
    cls = type(cfg)
    if section and section not in keys.all_keys(cls):
        near = keys.suggest(cls, section)
        hint = f" (did you mean {' or '.join(near)}?)" if near else ""
        raise UserError(f"config show --doc {section}: no such section or key{hint}")
    shown = {} if all_types else {"model": cfg.model.type, "data": cfg.data.type}
    lines = keys.doc_lines(cls, section, shown)
    if not all_types and section.split(".", 1)[0] in ("", "model", "data"):
        lines.append(
            f"# model and data sections of type {cfg.model.type!r} (the configured model.type); "
            "--all-types shows every workload's"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = ArgParser(
        prog="hpctrain config",
        description="Print the resolved configuration (secrets masked), each value's source as a comment.",
    )
    parser.add_argument("action", choices=["show"], help="show: print the resolved config")
    add_config_arguments(parser)
    parser.add_argument(
        "--doc",
        nargs="?",
        const="",
        metavar="SECTION",
        help="print every key (or those under SECTION, e.g. optim) with its type, default and description",
    )
    parser.add_argument(
        "--all-types", action="store_true", help="with --doc: every workload's model/data keys"
    )
    args = parser.parse_args(argv)
    if args.doc is not None and "=" in args.doc:  # `--doc key=value`: an override, not a section
        args.overrides.append(args.doc)
        args.doc = ""
    cfg, sources = resolve_from_args(args)
    if args.doc is not None:
        print(_doc(cfg, args.doc, args.all_types), end="")
        return 0
    announce(sources)
    print(with_sources(to_yaml(cfg), sources), end="")
    return 0
