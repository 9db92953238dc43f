"""`hpctrain train`: resolve the config, then hand the run's whole life cycle to `hpctrain.train.entry.run`.

Exit 0 finished, 75 stopped early and resumable, 2 bad input (one line), 1 failure.
"""

from __future__ import annotations

from hpctrain.commands.common import ArgParser, add_config_arguments, config_from_args
from hpctrain.runtime.env import ClusterEnv
from hpctrain.train.entry import run

__all__ = ["main", "run"]


def main(argv: list[str]) -> int:
    parser = ArgParser(
        prog="hpctrain train", description="Train a model (default: the debug regression job)."
    )
    add_config_arguments(parser)
    args = parser.parse_args(argv)
    cfg = config_from_args(args)
    return run(cfg, ClusterEnv.from_environ())
