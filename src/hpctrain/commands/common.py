"""Arguments shared by the verbs that take a configuration (train, config show, submit)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from hpctrain.config.loading import ConfigRequest, Provenance, announce
from hpctrain.errors import UserError


class ArgParser(argparse.ArgumentParser):
    """argparse that raises UserError (exit 2, one line) instead of printing usage and exiting, and takes
    options and positional arguments in any order (`config show --config X key=value` and
    `config show key=value --config X` are the same)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(f"{self.prog}: {message}")

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        if self._subparsers is not None:  # argparse cannot intermix around sub-commands
            return super().parse_args(args, namespace)
        return self.parse_intermixed_args(args, namespace)


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", "-c", help="YAML experiment file (default: the debug preset)")
    parser.add_argument(
        "--preset", help="debug | single_gpu | multi_gpu | multi_node | none (names the run folder too)"
    )
    parser.add_argument("--env-file", default=".env", help="file with paths and secrets (default .env)")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="dotted overrides, e.g. optim.lr=2e-5 (they beat the environment, .env, the preset and the YAML)",
    )


def resolve_from_args(args: argparse.Namespace) -> tuple[Any, Provenance]:
    from hpctrain.workloads.registry import resolve

    return resolve(ConfigRequest(args.config, args.preset, list(args.overrides), args.env_file))


def config_from_args(args: argparse.Namespace, quiet: bool = False) -> Any:
    """The validated config; unless `quiet`, says (rank 0) what came from the environment and what conflicted."""
    cfg, sources = resolve_from_args(args)
    if not quiet:
        announce(sources)
    return cfg
