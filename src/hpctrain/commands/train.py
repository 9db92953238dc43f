"""`hpctrain train`: resolve the config, then hand the run's whole life cycle to `hpctrain.train.entry.run`,
with the workload registry's task factory. `--until-done` runs that as a child process instead, started again
after each resumable stop or crash until the run is done (commands/supervise.py; imports no torch itself).

Exit 0 finished, 75 stopped early and resumable (train.requeue_exit_code: e.g. 85 for HTCondor), 2 bad input
(one line), 1 failure. `run` (in-process callers, the submitit job) returns 75 for a stop whatever that setting.
"""

from __future__ import annotations

from hpctrain.commands.common import announce, config_from_args, resolve_from_args
from hpctrain.commands.supervise import add_supervision_arguments, supervise_training, train_parser
from hpctrain.config.schema import ConfigBase
from hpctrain.errors import EXIT_RESUMABLE
from hpctrain.runtime.env import ClusterEnv
from hpctrain.train import entry
from hpctrain.workloads.registry import make_task

__all__ = ["main", "run"]


def run(
    cfg: ConfigBase,
    env: ClusterEnv,
    verbose: bool = False,
    naming: str | None = None,
    config_file: str | None = None,
) -> int:
    """Train the run `cfg` names with its workload's task (what `hpctrain train` does after parsing)."""
    return entry.run(cfg, env, make_task, verbose=verbose, naming=naming, config_file=config_file)


def main(argv: list[str]) -> int:
    parser = train_parser()
    parser.add_argument(
        "--until-done",
        action="store_true",
        help="run the training as a child process and start it again after each time-budget stop (at once) "
        "or crash (with backoff) until the run is done (docs/torchrun.md)",
    )
    add_supervision_arguments(parser)
    args = parser.parse_args(argv)
    if args.until_done:
        return supervise_training(args, config_from_args(args, quiet=True))
    cfg, sources = resolve_from_args(args)
    announce(sources)
    env = ClusterEnv.from_environ()
    code = run(cfg, env, verbose=args.verbose, naming=sources.naming, config_file=args.config)
    # The process's code for a resumable stop is the scheduler's convention (HTCondor's self-checkpointing: 85).
    return cfg.train.requeue_exit_code if code == EXIT_RESUMABLE else code
