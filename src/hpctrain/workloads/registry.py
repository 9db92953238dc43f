"""name -> workload. Each folder under workloads/ with a `spec.py` defining WORKLOAD is found automatically.

Specs hold only pydantic configs and dotted paths to the task factories, so building the full config type
(for validation on a login node, in `submit`) never imports torch.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

if TYPE_CHECKING:
    from hpctrain.config.loading import ConfigRequest, Provenance
    from hpctrain.config.schema import ConfigBase
    from hpctrain.runtime.env import ClusterEnv
    from hpctrain.train.task import Task

DEFAULT_WORKLOAD = "regression"


@dataclass(frozen=True)
class WorkloadSpec:
    name: str
    # model.type -> (its pydantic model config, "module:TaskClass")
    models: dict[str, tuple[type[BaseModel], str]]
    data: list[type[BaseModel]]
    # Optional verbs' helpers as dotted paths, looked up by commands: "generate", "generate_args" and "inspect"
    # (`hpctrain data`, given args), "sample"/"sample_args" and "evaluate"/"evaluate_args" (`hpctrain sample` and
    # `evaluate`, given args and the checkpoint found: hpctrain.train.checkpoint.find_checkpoint's tuple),
    # "sampler" (what `hpctrain.load` hands out as `.sampler`: a class given the workloads.trained.Trained).
    extras: dict[str, str] = field(default_factory=dict)


@cache
def workloads() -> dict[str, WorkloadSpec]:
    import hpctrain.workloads as package

    found = {}
    for info in pkgutil.iter_modules(package.__path__):
        if not info.ispkg:
            continue
        try:
            module = importlib.import_module(f"hpctrain.workloads.{info.name}.spec")
        except ModuleNotFoundError as exc:
            if exc.name == f"hpctrain.workloads.{info.name}.spec":
                continue  # a folder without a spec is not a workload
            raise
        spec: WorkloadSpec = module.WORKLOAD
        found[spec.name] = spec
    return found


@cache
def config_model() -> type[BaseModel]:
    """The full configuration type: every workload's model and data configs in discriminated unions."""
    from hpctrain.config.schema import build_config_model

    models = [cls for spec in workloads().values() for cls, _ in spec.models.values()]
    data = [cls for spec in workloads().values() for cls in spec.data]
    return build_config_model(models, data, DEFAULT_WORKLOAD)


def fill_default_types(tree: dict[str, Any]) -> None:
    """`model.type` defaults to the default workload's; `data.type` to the data type of model.type's workload."""
    model = tree.setdefault("model", {})
    data = tree.setdefault("data", {})
    if not isinstance(model, dict) or not isinstance(data, dict):
        return  # validation will name the section
    model.setdefault("type", DEFAULT_WORKLOAD)
    if "type" not in data:
        for spec in workloads().values():
            if model["type"] in spec.models and spec.data:
                data["type"] = spec.data[0].model_fields["type"].default
                break


def _load(path: str) -> Any:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def workload_of(model_type: str) -> WorkloadSpec | None:
    """The workload that registers `model_type` (None: no workload does)."""
    return next((spec for spec in workloads().values() if model_type in spec.models), None)


def offering(name: str) -> list[str]:
    """The workloads whose extras provide `name` (e.g. "sample"), sorted."""
    return sorted(spec.name for spec in workloads().values() if name in spec.extras)


def task_factory(model_type: str) -> Callable[..., Any]:
    for spec in workloads().values():
        if model_type in spec.models:
            return _load(spec.models[model_type][1])  # type: ignore[no-any-return]
    raise ValueError(f"model.type={model_type!r} has no registered workload")


def make_task(cfg: ConfigBase, env: ClusterEnv) -> Task[ConfigBase]:
    """The task of `cfg.model.type`'s workload: what `hpctrain.train.entry.run` is handed (a TaskFactory)."""
    return task_factory(cfg.model.type)(cfg, env)  # type: ignore[no-any-return]


def resolve(request: ConfigRequest) -> tuple[Any, Provenance]:
    """The validated configuration a request names, and where each key came from (the full config type, with
    every workload's model and data sections)."""
    from hpctrain.config.loading import resolve_config

    return resolve_config(request, config_model(), prepare=fill_default_types)  # type: ignore[no-any-return]


def extra(workload: str, name: str) -> Callable[..., Any]:
    spec = workloads().get(workload)
    if spec is None or name not in spec.extras:
        raise ValueError(f"workload {workload!r} has no {name!r}")
    return _load(spec.extras[name])  # type: ignore[no-any-return]


def report_of(model_type: str | None) -> Any:
    """The `WorkloadReport` (track/report/panels.py) of model_type's workload: its "report" extra, or the
    generic report when the workload has none or the type is unknown."""
    from hpctrain.track.report.panels import NO_WORKLOAD

    for spec in workloads().values():
        if model_type in spec.models and "report" in spec.extras:
            return _load(spec.extras["report"])
    return NO_WORKLOAD
