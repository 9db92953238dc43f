"""What `hpctrain sample` and `hpctrain evaluate` share: find the checkpoint the user names, and hand it to the
verb of the workload its `model.type` belongs to (its verbs' `sample` or `evaluate`, a `registry.ModelVerb`); a
workload that has no such verb is one line, exit 2."""

from __future__ import annotations

import argparse
from typing import Any

from hpctrain.commands.common import ArgParser
from hpctrain.errors import UserError
from hpctrain.workloads import registry
from hpctrain.workloads.registry import ModelVerb

MODEL_HELP = "run folder (its latest checkpoint) or a checkpoint file"


def run_model_verb(verb: str, description: str, argv: list[str], more_help: str = "") -> int:
    """Parse, find the checkpoint, run its workload's verb; `more_help`: what `--help` without a model adds
    (another form of the verb)."""
    top = ArgParser(prog=f"hpctrain {verb}", add_help=False)
    top.add_argument("model", nargs="?")
    top.add_argument("-h", "--help", action="store_true")
    known, _ = top.parse_known_args(argv)
    if known.model is None:
        if known.help:
            print(_overview(verb, description) + (f"\n\n{more_help}" if more_help else ""))
            return 0
        raise UserError(f"hpctrain {verb}: name a run folder or a checkpoint file (`hpctrain {verb} --help`)")

    if not known.help:  # the help of the model's own workload, once it loads
        _check_flags(verb, description, argv)
    # a first line before torch's import (seconds, more on a busy machine): the verb is at work
    print(f"{verb}: reading the checkpoint of {known.model} (torch loads first)", flush=True)
    from hpctrain.train.checkpoint import locate

    found = locate(known.model)
    model_type = _model_type(found.state)
    spec = registry.workload_of(model_type) if model_type is not None else None
    able = ", ".join(registry.offering(verb)) or "none"
    if model_type is None:
        raise UserError(f"{found.file}: holds no configuration, so no workload to {verb} it with")
    handler = spec.verbs.model_verb(verb) if spec is not None else None
    if spec is None or handler is None:
        owner = f"workload {spec.name!r}" if spec is not None else "no registered workload"
        raise UserError(
            f"{found.file}: model.type={model_type!r} ({owner}) has no `hpctrain {verb}`; it is offered for "
            f"models of: {able}"
        )
    parser = _parser(verb, description, handler)
    args = parser.parse_args(argv)
    return handler.run(args, found)


def _check_flags(verb: str, description: str, argv: list[str]) -> None:
    """The flags, before the checkpoint (and torch, seconds more on a busy machine) loads: they pass where some
    workload offering the verb takes them (its parser and its own check), as the checkpoint's workload is known
    only once it loads. Refused by all: the line of a workload that read every flag and refused a value (its
    check), else the first one's."""
    refusals: list[tuple[bool, UserError]] = []
    for name in registry.offering(verb):
        handler = registry.workloads()[name].verbs.model_verb(verb)
        assert handler is not None  # offering() lists only the workloads that have it
        try:
            args = _parser(verb, description, handler).parse_args(argv)
        except UserError as err:
            refusals.append((False, err))
            continue
        try:
            if handler.check is not None:
                handler.check(args)
            return
        except UserError as err:
            refusals.append((True, err))
    if refusals:
        raise next((err for checked, err in refusals if checked), refusals[0][1])


def _model_type(state: dict[str, Any]) -> str | None:
    config = state.get("config")
    model = config.get("model") if isinstance(config, dict) else None
    kind = model.get("type") if isinstance(model, dict) else None
    return str(kind) if kind is not None else None


def _parser(verb: str, description: str, handler: ModelVerb) -> argparse.ArgumentParser:
    parser = ArgParser(prog=f"hpctrain {verb}", description=description)
    parser.add_argument("model", help=MODEL_HELP)
    handler.add_args(parser)
    return parser


def _overview(verb: str, description: str) -> str:
    """`hpctrain VERB --help` without a model: the options of every workload that offers the verb."""
    lines = [f"usage: hpctrain {verb} MODEL [options]", "", description, "", f"MODEL: {MODEL_HELP}."]
    lines.append("The options depend on the workload of the model's model.type:")
    for name in registry.offering(verb):
        parser = argparse.ArgumentParser(prog=f"hpctrain {verb}", add_help=False)
        handler = registry.workloads()[name].verbs.model_verb(verb)
        assert handler is not None  # offering() lists only the workloads that have it
        handler.add_args(parser)
        lines += ["", f"workload {name}:", parser.format_help().rstrip()]
    return "\n".join(lines)
