"""`hpctrain supervise [--run-dir DIR] [options] -- COMMAND ...`: run a training command again and again until its
run is done, without SLURM (launch/supervise.py says when it restarts and when it stops); `hpctrain train
--until-done` (commands/train.py) is the same for one training process.

    hpctrain supervise -- torchrun --standalone --nproc-per-node 2 -m hpctrain train --config configs/muons.yaml

The run folder comes from the `hpctrain train` arguments inside COMMAND (resolved as the training will resolve
them), or from --run-dir for a command that hides them (a wrapper script).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from hpctrain.commands.common import ArgParser, add_config_arguments, config_from_args
from hpctrain.errors import UserError
from hpctrain.launch.supervise import Policy, Supervisor
from hpctrain.runtime.env import ClusterEnv

USAGE = "hpctrain supervise [--run-dir DIR] [--backoff S] [--backoff-max S] [--max-idle N] -- COMMAND ..."


def add_supervision_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("supervision (restarts without SLURM)")
    g.add_argument(
        "--backoff",
        type=float,
        default=Policy.backoff,
        metavar="S",
        help=f"seconds before the restart after a crash, doubled for each crash in a row (default {Policy.backoff:g})",
    )
    g.add_argument(
        "--backoff-max",
        type=float,
        default=Policy.backoff_max,
        metavar="S",
        help=f"the longest pause between restarts (default {Policy.backoff_max:g})",
    )
    g.add_argument(
        "--max-idle",
        type=int,
        default=None,
        metavar="N",
        help="stop after N attempts in a row that completed no update (default slurm.max_hops_without_progress)",
    )


def policy_of(args: argparse.Namespace, cfg: Any | None) -> Policy:
    """The supervision settings from the options; max_idle defaults to the run's slurm.max_hops_without_progress
    (the same rule as a SLURM chain's)."""
    if args.backoff < 0 or args.backoff_max < args.backoff:
        raise UserError(
            f"--backoff {args.backoff:g} --backoff-max {args.backoff_max:g}: need 0 <= backoff <= backoff-max"
        )
    idle = args.max_idle
    if idle is None:
        idle = cfg.slurm.max_hops_without_progress if cfg is not None else Policy.max_idle
    if idle < 1:
        raise UserError(f"--max-idle {idle}: must be at least 1")
    return Policy(max_idle=idle, backoff=args.backoff, backoff_max=args.backoff_max)


def train_parser(prog: str = "hpctrain train") -> ArgParser:
    """The arguments of `hpctrain train` (the verb itself adds --until-done and the supervision options)."""
    parser = ArgParser(prog=prog, description="Train a model (default: the debug regression job).")
    add_config_arguments(parser)
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="print the whole resolved config at start (config.yaml in the run folder has it anyway)",
    )
    return parser


def refuse_restarting_afresh(cfg: Any) -> None:
    if cfg.checkpoint.resume == "never":
        raise UserError(
            "checkpoint.resume=never under hpctrain supervise would start the run afresh at every restart; use "
            "`hpctrain train --until-done`, which gives it to the first start only, or start afresh once by hand"
        )


def supervise_training(args: argparse.Namespace, cfg: Any) -> int:
    """`hpctrain train ... --until-done`: the same training as a child process, restarted until done. A first
    start with checkpoint.resume=never is followed by restarts that continue it (checkpoint.resume=auto)."""
    if ClusterEnv.from_environ().world_size > 1:
        raise UserError(
            "--until-done supervises one training process, not each rank of one: run "
            "`hpctrain supervise -- torchrun ... -m hpctrain train ...` instead"
        )
    command = [sys.executable, "-m", "hpctrain", "train"]
    command += ["--env-file", args.env_file] if args.env_file is not None else []
    command += ["--config", args.config] if args.config else []
    command += ["--preset", args.preset] if args.preset else []
    command += ["--verbose"] if args.verbose else []
    command += list(args.overrides)  # --gpus/--nodes are in here already (common._sized)
    later = ["checkpoint.resume=auto"] if cfg.checkpoint.resume == "never" else []
    return Supervisor(command, cfg.run.dir, policy_of(args, cfg), later).run()


def _train_arguments(command: list[str]) -> list[str] | None:
    """The arguments after `hpctrain train` (or `-m hpctrain train`) in a command; None when it has none."""
    for i, word in enumerate(command[:-1]):
        if os.path.basename(word) == "hpctrain" and command[i + 1] == "train":
            return command[i + 2 :]
    return None


DESCRIPTION = (
    "Run COMMAND (e.g. `torchrun --standalone --nproc-per-node 4 -m hpctrain train ...`) until its run is done: "
    "again at once after a resumable stop (exit 75; torchrun's 1 is read from the run's summary.json), after a "
    "doubling pause after a crash; stop on 0 or 2, after --max-idle attempts in a row without an update, or on "
    "SIGTERM/SIGINT (forwarded to COMMAND). docs/torchrun.md."
)


def main(argv: list[str]) -> int:
    parser = ArgParser(prog="hpctrain supervise", usage=USAGE, description=DESCRIPTION)
    parser.add_argument("--run-dir", help="the run folder (default: from the `hpctrain train` arguments)")
    add_supervision_arguments(parser)
    if "--" not in argv:
        if any(a in ("-h", "--help") for a in argv):
            print(parser.format_help())
            return 0
        raise UserError(f"hpctrain supervise: give the command after `--` ({USAGE})")
    cut = argv.index("--")
    options, command = argv[:cut], argv[cut + 1 :]
    args = parser.parse_args(options)
    if not command:
        raise UserError(f"hpctrain supervise: no command after `--` ({USAGE})")
    cfg = None
    found = _train_arguments(command)
    if found is not None:
        inner = train_parser("hpctrain train (inside the supervised command)")
        cfg = config_from_args(inner.parse_args(found), quiet=True)
        refuse_restarting_afresh(cfg)
    if args.run_dir is not None:
        run_dir = Path(args.run_dir)
    elif cfg is not None:
        run_dir = cfg.run.dir
    else:
        raise UserError(
            "hpctrain supervise: the command runs no `hpctrain train`; name its run folder with --run-dir"
        )
    return Supervisor(command, run_dir, policy_of(args, cfg)).run()
