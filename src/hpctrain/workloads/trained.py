"""A trained model outside the trainer: the networks of one checkpoint of a run, ready to use (`hpctrain.load`,
`hpctrain export`), with the workload's sampler where it has one (the registry extra "sampler").

Which checkpoint: `latest` (the run's latest readable one, as a resume would pick), `best` (best.pt) or
`step_N` (the checkpoint of update N), of a run folder; a checkpoint file names itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hpctrain.config.loading import validate
from hpctrain.errors import RunError, UserError
from hpctrain.runtime.env import ClusterEnv
from hpctrain.train.checkpoint import find_checkpoint, load_verified, strip_prefixes
from hpctrain.train.parts import params_sha256
from hpctrain.workloads import registry

# (state, checkpoint file, run folder or None): what hpctrain.train.checkpoint.find_checkpoint returns.
Found = tuple[dict[str, Any], Path, Path | None]

_STEP = re.compile(r"^step_0*(\d+)$")


@dataclass
class Trained:
    """The networks of one checkpoint, in eval mode on `device`, and what they came from.

    `models` by name (`model` for one-network workloads; `generator`, `critic`, `multiplicity` for the muon
    ones); `settings` each network's constructor keyword arguments; `sampler` the workload's way to use them
    (muon models: `sampler.sample(n_events, seed)`), None where the workload has none.
    """

    models: dict[str, nn.Module]
    config: Any  # the run's validated configuration (a ConfigBase of its workload)
    settings: dict[str, dict[str, Any]]
    step: int
    checkpoint: Path
    run_dir: Path | None
    device: torch.device
    params_sha256: str
    sampler: Any = None

    @property
    def model_type(self) -> str:
        return str(self.config.model.type)

    @property
    def model(self) -> nn.Module:
        """The network of a one-network workload (regression, fields); the others name theirs in `models`."""
        if len(self.models) != 1:
            raise AttributeError(
                f"a {self.model_type} model has several networks: use .models[{list(self.models)}]"
            )
        return next(iter(self.models.values()))

    def __getitem__(self, name: str) -> nn.Module:
        return self.models[name]


def pick_checkpoint(path: str | Path, which: str = "latest") -> Found:
    """The checkpoint `which` of a run folder (or the checkpoint file `path` names, with which=latest). Every
    failure is a UserError naming what is there: no checkpoint, an unreadable one, an unknown `which`."""
    match = _STEP.match(which)
    if which not in ("latest", "best") and match is None:
        raise UserError(f"which={which!r}: choose latest, best or step_N (e.g. step_200)")
    target = Path(path)
    if which == "latest":
        try:
            return find_checkpoint(target)
        except RunError as exc:  # checkpoints there, none readable: nothing to export either
            raise UserError(str(exc)) from None
    if not target.is_dir():
        kind = "a checkpoint file" if target.is_file() else "no such run folder"
        raise UserError(f"{path}: {kind}; which={which} needs the run folder")
    folder = target / "checkpoints" if (target / "checkpoints").is_dir() else target
    name = "best.pt" if match is None else f"step_{int(match.group(1)):08d}.pt"
    file = folder / name
    if not file.is_file():
        steps = sorted(int(p.stem[5:]) for p in folder.glob("step_*.pt") if p.stem[5:].isdigit())
        held = [f"step_{step}" for step in steps] + (["best"] if (folder / "best.pt").exists() else [])
        raise UserError(f"{path}: no {name} in {folder} (it holds: {', '.join(held) or 'nothing'})")
    state = load_verified(file)
    return state, file, folder.parent if folder.name == "checkpoints" else None


def load(path: str | Path, which: str = "latest", device: str | torch.device = "cpu") -> Trained:
    """The networks of checkpoint `which` of run folder (or checkpoint file) `path`, in eval mode on `device`,
    with the workload's sampler."""
    state, file, run_dir = pick_checkpoint(path, which)
    if not isinstance(state.get("config"), dict):
        raise UserError(f"{file}: holds no configuration, so no workload to build its networks with")
    cfg = validate(registry.config_model(), state["config"])
    dev = torch.device(device)
    if dev.type == "cpu":
        cfg.train.device = "cpu"  # what the networks are built for (e.g. no channels_last on a CPU)
    task = registry.task_factory(cfg.model.type)(cfg, ClusterEnv())
    with torch.random.fork_rng(devices=[]):  # building initialises weights: the caller's RNG stays as it was
        models = task.build_modules()
    for name, module in models.items():
        saved = state["modules"].get(name)
        if saved is None:
            raise UserError(
                f"{file}: holds no weights of network {name!r} (it holds {sorted(state['modules'])})"
            )
        module.load_state_dict(strip_prefixes(saved))
        module.to(dev).eval()
    trained = Trained(
        models,
        cfg,
        task.network_settings(),
        int(state.get("counters", {}).get("step", 0)),
        file,
        run_dir,
        dev,
        params_sha256(models),
    )
    spec = registry.workload_of(cfg.model.type)
    if spec is not None and spec.verbs.sampler is not None:
        trained.sampler = spec.verbs.sampler(trained)
    return trained
