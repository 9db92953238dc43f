"""`hpctrain data generate [--kind muons|fields] ...` and `hpctrain data inspect PATH [--events N]`.

Each kind is a workload whose verbs hold `data` (a `registry.DataVerbs`: `generate_args(parser)`,
`generate(args) -> int` and `inspect(args) -> int`).
"""

from __future__ import annotations

from hpctrain.commands.common import ArgParser
from hpctrain.errors import UserError
from hpctrain.workloads.registry import DataVerbs, with_data_verbs

DEFAULT_KIND = "muons"


def _verbs(kind: str, action: str) -> DataVerbs:
    offered = with_data_verbs()
    if kind not in offered:
        raise UserError(f"--kind {kind!r} has no `data {action}` (choose from {', '.join(offered)})")
    return offered[kind]


def main(argv: list[str]) -> int:
    top = ArgParser(prog="hpctrain data", description="Generate or inspect data sets.", add_help=False)
    top.add_argument("action", nargs="?", choices=["generate", "inspect"], help="generate | inspect")
    top.add_argument("--kind", default=DEFAULT_KIND, help=f"workload whose data (default {DEFAULT_KIND})")
    top.add_argument("-h", "--help", action="store_true")
    known, _ = top.parse_known_args(argv)
    if known.action is None:
        if known.help:
            print(
                "usage: hpctrain data {generate,inspect} [--kind KIND] ...  (`hpctrain data ACTION --help`)"
            )
            return 0
        raise UserError("hpctrain data: choose an action: generate or inspect")
    parser = ArgParser(prog=f"hpctrain data {known.action}")
    parser.add_argument("action", choices=[known.action])
    parser.add_argument("--kind", default=DEFAULT_KIND, help=f"workload whose data (default {DEFAULT_KIND})")
    if known.action == "generate":
        _verbs(known.kind, "generate").generate_args(parser)
        args = parser.parse_args(argv)
        return _verbs(args.kind, "generate").generate(args)
    parser.add_argument("path", help="a file, folder or glob")
    parser.add_argument("--events", type=int, default=5, help="events to print from each file (default 5)")
    args = parser.parse_args(argv)
    return _verbs(args.kind, "inspect").inspect(args)
