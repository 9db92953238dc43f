"""Arguments shared by the verbs that take a configuration (train, config show, submit)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from hpctrain.config.keys import all_keys
from hpctrain.config.loading import ConfigRequest, Provenance
from hpctrain.config.provenance import announce
from hpctrain.config.seed_flags import flag_hint
from hpctrain.errors import UserError
from hpctrain.workloads.registry import config_model, resolve


class ArgParser(argparse.ArgumentParser):
    """argparse that raises UserError (exit 2, one line) instead of printing usage and exiting, and takes
    options and positional arguments in any order (`config show --config X key=value` and
    `config show key=value --config X` are the same)."""

    _argv: Sequence[str] = ()  # the arguments of the last parse (for the hint on a seed script's flag)

    def error(self, message: str) -> None:  # type: ignore[override]
        if message.startswith("unrecognized arguments") and self._takes_overrides():
            hint = flag_hint(self._argv, self._option_string_actions, all_keys(config_model()))
            if hint:
                raise UserError(f"{self.prog}: {hint}")
        raise UserError(f"{self.prog}: {message}")

    def _takes_overrides(self) -> bool:
        return any(action.dest == "overrides" for action in self._actions)

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        self._argv = list(sys.argv[1:] if args is None else args)
        if self._subparsers is not None:  # argparse cannot intermix around sub-commands
            return super().parse_args(args, namespace)
        return _sized(self.parse_intermixed_args(args, namespace))


def _sized(args: argparse.Namespace) -> argparse.Namespace:
    """`--gpus N` and `--nodes N` (the size a preset takes) as the first command-line overrides, so that a
    key=value typed after them still wins: `--preset multi_gpu --gpus 8` is 8 GPUs (and tasks) per node."""
    sizes = [
        f"{key}={value}"
        for key, value in (
            ("slurm.gpus_per_node", getattr(args, "gpus", None)),
            ("slurm.nodes", getattr(args, "nodes", None)),
        )
        if value is not None
    ]
    if sizes:
        args.overrides = [*sizes, *args.overrides]
    return args


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", "-c", help="YAML experiment file (default: the debug preset)")
    parser.add_argument(
        "--preset", help="debug | single_gpu | multi_gpu | multi_node | none (names the run folder too)"
    )
    parser.add_argument(
        "--env-file",
        default=None,
        help="file with paths and secrets (default .env, where there is one; '' for none)",
    )
    parser.add_argument(
        "--gpus",
        type=int,
        metavar="N",
        help="GPUs (and tasks) per node: slurm.gpus_per_node, e.g. with a preset",
    )
    parser.add_argument(
        "--nodes", type=int, metavar="N", help="nodes per job: slurm.nodes, e.g. --preset multi_node"
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="dotted overrides, e.g. optim.lr=2e-5 (they beat the environment, .env, the preset and the YAML)",
    )


def resolve_from_args(args: argparse.Namespace) -> tuple[Any, Provenance]:
    return resolve(config_request(args))


def config_request(args: argparse.Namespace) -> ConfigRequest:
    """What the command line asks for; an --env-file it names must exist (the default .env need not)."""
    named = args.env_file is not None
    return ConfigRequest(
        args.config,
        args.preset,
        list(args.overrides),
        args.env_file if named else ".env",
        env_file_named=named,
    )


def config_from_args(args: argparse.Namespace, quiet: bool = False) -> Any:
    """The validated config; unless `quiet`, says (rank 0) what came from the environment and what conflicted."""
    cfg, sources = resolve_from_args(args)
    if not quiet:
        announce(sources)
    return cfg
