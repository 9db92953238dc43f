"""`hpctrain train`: resolve the config, then hand the run's whole life cycle to `hpctrain.train.entry.run`,
with the workload registry's task factory.

Exit 0 finished, 75 stopped early and resumable, 2 bad input (one line), 1 failure.
"""

from __future__ import annotations

from hpctrain.commands.common import ArgParser, add_config_arguments, announce, resolve_from_args
from hpctrain.config.schema import ConfigBase
from hpctrain.runtime.env import ClusterEnv
from hpctrain.train import entry
from hpctrain.workloads.registry import make_task

__all__ = ["main", "run"]


def run(cfg: ConfigBase, env: ClusterEnv, verbose: bool = False, naming: str | None = None) -> int:
    """Train the run `cfg` names with its workload's task (what `hpctrain train` does after parsing)."""
    return entry.run(cfg, env, make_task, verbose=verbose, naming=naming)


def main(argv: list[str]) -> int:
    parser = ArgParser(
        prog="hpctrain train", description="Train a model (default: the debug regression job)."
    )
    add_config_arguments(parser)
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="print the whole resolved config on a terminal too"
    )
    args = parser.parse_args(argv)
    cfg, sources = resolve_from_args(args)
    announce(sources)
    return run(cfg, ClusterEnv.from_environ(), verbose=args.verbose, naming=sources.naming)
