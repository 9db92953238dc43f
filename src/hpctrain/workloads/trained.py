"""A trained model outside the trainer: the networks of one checkpoint of a run, ready to use (`hpctrain.load`,
`hpctrain export`), with the workload's sampler where it has one (the registry extra "sampler").

Which checkpoint: `latest` (the run's latest readable one, as a resume would pick), `best` (best.pt) or
`step_N` (the checkpoint of update N), of a run folder, each verified against its sidecar hash; a checkpoint
file names itself; an export folder (`hpctrain export`, train/exported.py) holds one update, verified against
export.json.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hpctrain.config.loading import validate
from hpctrain.errors import UserError
from hpctrain.runtime.devices import usable_device
from hpctrain.runtime.env import ClusterEnv
from hpctrain.train.checkpoint import Located, locate
from hpctrain.train.exported import check_params
from hpctrain.train.parts import load_weights, params_sha256
from hpctrain.workloads import registry


@dataclass(repr=False)
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

    def __repr__(self) -> str:
        """A few lines (a notebook cell shows this): what it is, where from, which weights; `.config` has the rest."""
        params = sum(p.numel() for m in self.models.values() for p in m.parameters())
        lines = [
            f"Trained {self.model_type} model, update {self.step} of run {self.config.run.name!r}",
            f"  from {self.checkpoint}",
            f"  networks {', '.join(self.models)} ({params:,} parameters) on {self.device}",
            f"  params_sha256 {self.params_sha256[:16]}...",
        ]
        if self.sampler is not None:
            lines.append(
                "  .sampler: sample(n_events, seed), generate(primaries, seed) (help() for the units)"
            )
        return "\n".join(lines)


def load(path: str | Path, which: str = "latest", device: str | torch.device = "cpu") -> Trained:
    """The networks of checkpoint `which` of run folder (or checkpoint file, or export folder) `path`, in eval
    mode on `device`, with the workload's sampler. A device this machine has not is one UserError line."""
    dev = usable_device(device, f"device={str(device)!r}")
    return build(locate(path, which), dev)


def build(found: Located, device: torch.device) -> Trained:
    """The `Trained` of a checkpoint's state (or an export's) that was found and read already."""
    state, file, run_dir = found.state, found.file, found.run_dir
    if not isinstance(state.get("config"), dict):
        raise UserError(f"{file}: holds no configuration, so no workload to build its networks with")
    cfg = validate(registry.config_model(), state["config"])
    if device.type == "cpu":
        cfg.train.device = "cpu"  # what the networks are built for (e.g. no channels_last on a CPU)
    task = registry.task_factory(cfg.model.type)(cfg, ClusterEnv())
    with torch.random.fork_rng(devices=[]):  # building initialises weights: the caller's RNG stays as it was
        models = task.build_modules()
    load_weights(models, state["modules"], file)
    for module in models.values():
        module.to(device).eval()
    digest = params_sha256(models)
    check_params(state, file, digest)
    step = int(state.get("counters", {}).get("step", 0))
    trained = Trained(models, cfg, task.network_settings(), step, file, run_dir, device, digest)
    spec = registry.workload_of(cfg.model.type)
    if spec is not None and spec.verbs.sampler is not None:
        trained.sampler = spec.verbs.sampler(trained)
    return trained
