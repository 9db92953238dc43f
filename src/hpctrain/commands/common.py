"""Arguments shared by the verbs that take a configuration (train, config show, submit)."""

from __future__ import annotations

import argparse
from typing import Any

from hpctrain.config.loading import ConfigRequest, load_config
from hpctrain.errors import UserError


class ArgParser(argparse.ArgumentParser):
    """argparse that raises UserError (exit 2, one line) instead of printing usage and exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(f"{self.prog}: {message}")


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", "-c", help="YAML experiment file (default: the debug preset)")
    parser.add_argument(
        "--preset", help="debug | single_gpu | multi_gpu | multi_node | none (names the run folder too)"
    )
    parser.add_argument("--env-file", default=".env", help="file with paths and secrets (default .env)")
    parser.add_argument(
        "overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. optim.lr=2e-5"
    )


def config_from_args(args: argparse.Namespace) -> Any:
    from hpctrain.workloads.registry import config_model, fill_default_types

    request = ConfigRequest(args.config, args.preset, list(args.overrides), args.env_file)
    return load_config(request, config_model(), prepare=fill_default_types)
