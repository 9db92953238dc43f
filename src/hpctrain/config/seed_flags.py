"""The seed scripts' command-line flags, answered with the key that does the same here (docs/start-here.md, "Coming
from the seed scripts"): `--lr 2e-5` -> `optim.lr=2e-5`, `-i a b` -> `'data.paths=[a,b]'`, `--export=LR=2e-5`
-> `LR=2e-5 hpctrain ...`. A flag the table lacks is matched by name against every key (`--eval-every 50` ->
`train.eval_every=50`) when one key alone ends so. Used by the command line's parser for the one line it says
instead of "unrecognized arguments"."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hpctrain.config.environ import ENV_ALIASES
from hpctrain.config.messages import cut

# flag (lower case, `-` as `_`, no dashes) -> the key, or the keys for a flag that takes no value
SEED_FLAGS: dict[str, str] = {
    "lr": "optim.lr",
    "learning_rate": "optim.lr",
    "batch_size": "data.batch_size",
    "bs": "data.global_batch_size",  # pcdiff's batch is the global one
    "global_batch_size": "data.global_batch_size",
    "epochs": "train.epochs",
    "num_epochs": "train.epochs",
    "steps": "train.total_updates",
    "max_steps": "train.total_updates",
    "iterations": "train.total_updates",
    "seed": "run.seed",
    "i": "data.paths",
    "infiles": "data.paths",
    "input": "data.paths",
    "max_muons_per_event": "data.max_muons_per_event",
    "tb_logdir": "logging.tensorboard.dir",
    "logdir": "logging.tensorboard.dir",
    "wandb_offline": "logging.wandb.enabled=true logging.wandb.mode=offline",
    "wandb": "logging.wandb.enabled=true",
    "grad_accum_steps": "train.grad_accum_steps",
    "critic_steps": "model.critic_steps",
    "gp_every": "model.gp_every",
    "out_dir": "run.out_dir",
    "output_dir": "run.out_dir",
    "results_dir": "run.out_dir",
    "run_name": "run.name",
    "workers": "data.num_workers",
    "amp": "train.precision=bf16",
}
# Where the same name means something else here (docs/start-here.md says how)
DIFFERS = {"grad_accum_steps": "it adds N batches into one update here, it did not split one"}
LISTS = ("data.paths", "data.val_paths")
_VALUE_FREE = re.compile(r"=")  # keys written with their value already (flags that take none)


def _flag(arg: str) -> tuple[str, str, bool] | None:
    """(the flag as typed, its normalised name, whether `=value` was attached) of a dashed argument."""
    if not arg.startswith("-") or arg in ("-", "--") or arg[1:2].isdigit() or arg[1:2] == ".":
        return None
    typed, sep, _ = arg.partition("=")
    return typed, typed.lstrip("-").lower().replace("-", "_"), bool(sep)


def _values(argv: Sequence[str], at: int) -> list[str]:
    """The arguments after a flag that are its values: not options, not overrides."""
    values = []
    for arg in argv[at + 1 :]:
        if (arg.startswith("-") and not re.match(r"^-\d|^-\.\d", arg)) or "=" in arg:
            break
        values.append(arg)
    return values


def _key_named(name: str, keys: Iterable[str]) -> str | None:
    """The one key whose last part is `name` (`eval_every` -> train.eval_every); None when none or several."""
    found = [k for k in keys if k.rsplit(".", 1)[-1] == name]
    return found[0] if len(found) == 1 else None


def _written(key: str, values: list[str]) -> str:
    """key=value as typed in a shell: a list in brackets, quoted (zsh reads brackets as a pattern)."""
    if _VALUE_FREE.search(key):
        return key
    if key in LISTS and len(values) > 1:
        return f"'{key}=[{','.join(values)}]'"
    return f"{key}={values[0] if values else 'VALUE'}"


def flag_hint(argv: Sequence[str], options: Mapping[str, Any], keys: Iterable[str]) -> str | None:
    """What to write instead of the first argument that is neither an option of the verb nor an override:
    a seed script's flag, an sbatch option, or a dotted override written with dashes."""
    keys = list(keys)
    for i, arg in enumerate(argv):
        parsed = _flag(arg)
        if parsed is None or parsed[0] in options:
            continue
        typed, name, attached = parsed
        values = [arg.partition("=")[2]] if attached else _values(argv, i)
        if name == "export":
            return _export_hint(values[0] if values else "")
        if "." in name:  # `--optim.lr=3e-4`: a dotted override with dashes
            return f"unknown option {cut(typed)}: dotted overrides take no dashes: write {cut(_written(typed.lstrip('-'), values))}"
        key = SEED_FLAGS.get(name) or _key_named(name, keys)
        if key is None:
            return None
        note = f" (note: {DIFFERS[name]}; docs/start-here.md)" if name in DIFFERS else ""
        return f"unknown option {cut(typed)}: hpctrain takes key=value overrides: write {cut(_written(key, values))}{note}"
    return None


def _export_hint(value: str) -> str:
    """`--export=LR=2e-5`: sbatch's option, typed to hpctrain."""
    assignments = [part for part in value.split(",") if "=" in part]
    env = " ".join(assignments) or "LR=2e-5"
    keys = [
        f"{ENV_ALIASES[name]}={v}"
        for name, _, v in (a.partition("=") for a in assignments)
        if name in ENV_ALIASES
    ]
    instead = f", or write {' '.join(keys)}" if keys else ""
    return (
        f"--export is sbatch's option (sbatch --export=ALL,{cut(env)} slurm/...): for hpctrain put the "
        f"variables before the command ({cut(env)} hpctrain ...){instead}"
    )
