"""`hpctrain config show [--config ...] [--preset ...] [key=value ...]`: the resolved config, nothing run."""

from __future__ import annotations

from hpctrain.commands.common import ArgParser, add_config_arguments, config_from_args
from hpctrain.config.loading import to_yaml


def main(argv: list[str]) -> int:
    parser = ArgParser(
        prog="hpctrain config", description="Print the resolved configuration (secrets masked)."
    )
    parser.add_argument("action", choices=["show"], help="show: print the resolved config")
    add_config_arguments(parser)
    args = parser.parse_args(argv)
    cfg = config_from_args(args)
    print(to_yaml(cfg), end="")
    return 0
