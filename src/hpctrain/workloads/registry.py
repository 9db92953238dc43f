"""name -> workload. Each folder under workloads/ is one, found automatically, with two files the registry reads:

- `spec.py`: `WORKLOAD`, a `WorkloadSpec`: its name and pydantic configs (one per `model.type`, and its data
  sections). Building the full config type (validation on a login node, in `submit`) imports only these.
- `verbs.py`: `VERBS`, a `Verbs`: the task of each model type and the optional verbs (`hpctrain data`,
  `sample`, `evaluate`, `report`, `hpctrain.load(...).sampler`), each a typed callable. `verbs.py` is imported
  at registration by every command, login nodes included: it imports torch (and other heavy parts) only inside
  the callables, when a verb runs.

Registration checks the pair: a task for every model type and none other, and each callable's parameters and
return as `Verbs` declares them (`VERB_SIGNATURES`). A mistake fails every command at once, naming the workload
and the verb, instead of the one verb that resolves a bad dotted path days later.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from functools import cache
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

import hpctrain.workloads as package
from hpctrain.config.environ import ENV_ALIASES
from hpctrain.config.loading import resolve_config
from hpctrain.config.schema import build_config_model

if TYPE_CHECKING:
    from hpctrain.config.loading import ConfigRequest, Provenance
    from hpctrain.config.schema import ConfigBase
    from hpctrain.runtime.env import ClusterEnv
    from hpctrain.track.report.panels import WorkloadReport
    from hpctrain.train.checkpoint import Located
    from hpctrain.train.task import Task, TaskFactory

DEFAULT_WORKLOAD = "regression"


@dataclass(frozen=True)
class WorkloadSpec:
    name: str
    models: dict[str, type[BaseModel]]  # model.type -> its pydantic model config
    data: list[type[BaseModel]]


@dataclass(frozen=True)
class DataVerbs:
    """`hpctrain data generate --kind <workload>` and `hpctrain data inspect --kind <workload> PATH`."""

    generate_args: Callable[[argparse.ArgumentParser], None]
    generate: Callable[[argparse.Namespace], int]
    inspect: Callable[[argparse.Namespace], int]


def lazy_data_verbs(load: Callable[[], DataVerbs]) -> DataVerbs:
    """DataVerbs whose module (the readers: pyarrow, h5py, torch) `load` imports when one of them runs, not when
    the workload registers."""

    def generate_args(parser: argparse.ArgumentParser) -> None:
        load().generate_args(parser)

    def generate(args: argparse.Namespace) -> int:
        return load().generate(args)

    def inspect(args: argparse.Namespace) -> int:
        return load().inspect(args)

    return DataVerbs(generate_args, generate, inspect)


@dataclass(frozen=True)
class ModelVerb:
    """`hpctrain sample|evaluate MODEL ...` for a checkpoint of one of the workload's model types."""

    add_args: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, Located], int]
    # the flags alone, before the checkpoint (and torch: seconds) loads: a mistyped flag is one line at once
    check: Callable[[argparse.Namespace], None] | None = None


@dataclass(frozen=True)
class FilesVerb:
    """`hpctrain evaluate --sample FILES --data FILES`: a sample from anywhere judged against true files, with
    no model (so no checkpoint names the workload: `--kind`, or the only workload that offers it)."""

    add_args: Callable[[argparse.ArgumentParser], None]
    judge: Callable[[argparse.Namespace], int]


@dataclass(frozen=True)
class Verbs:
    tasks: dict[str, TaskFactory]  # model.type -> (cfg, env) -> its Task; required for every model type
    data: DataVerbs | None = None
    sample: ModelVerb | None = None
    evaluate: ModelVerb | None = None
    evaluate_files: FilesVerb | None = None  # `hpctrain evaluate --sample FILES --data FILES`
    report: Callable[[], WorkloadReport] | None = None  # what `hpctrain report` draws beyond the generic part
    # hpctrain.load(...).sampler, given the workloads.trained.Trained
    sampler: Callable[[Any], Any] | None = None

    def model_verb(self, verb: str) -> ModelVerb | None:
        """The `hpctrain <verb>` (sample or evaluate) the workload offers, or None."""
        return {"sample": self.sample, "evaluate": self.evaluate}.get(verb)


# Each callable's (parameter names, return annotation as written): what registration checks.
VERB_SIGNATURES: dict[str, tuple[tuple[str, ...], str | None]] = {
    "tasks": (("cfg", "env"), None),
    "generate_args": (("parser",), "None"),
    "generate": (("args",), "int"),
    "inspect": (("args",), "int"),
    "add_args": (("parser",), "None"),
    "run": (("args", "found"), "int"),
    "check": (("args",), "None"),
    "judge": (("args",), "int"),
    "report": ((), "WorkloadReport"),
    "sampler": (("trained",), None),
}


class RegistrationError(TypeError):
    """A workload whose spec and verbs do not fit: found when the registry is first read."""


@dataclass(frozen=True)
class Workload:
    """A registered workload: its spec and its checked verbs."""

    spec: WorkloadSpec
    verbs: Verbs = field(repr=False)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def models(self) -> dict[str, type[BaseModel]]:
        return self.spec.models

    @property
    def data(self) -> list[type[BaseModel]]:
        return self.spec.data


def _check_callable(workload: str, verb: str, fn: Any) -> None:
    names, returns = VERB_SIGNATURES[verb.rpartition(".")[2].split("[")[0]]
    if not callable(fn):
        raise RegistrationError(f"workload {workload!r}: verb {verb} is {fn!r}, not a callable")
    params = [
        p
        for p in inspect.signature(fn).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    got = tuple(p.name for p in params)
    written = inspect.signature(fn).return_annotation
    # postponed annotations (`from __future__ import annotations`) are strings; others are types or None
    ret = None if written is inspect.Signature.empty else getattr(written, "__name__", str(written))
    if len(got) != len(names) or (returns is not None and ret != returns):
        want = f"({', '.join(names)})" + (f" -> {returns}" if returns else "")
        have = f"({', '.join(got)})" + (f" -> {ret}" if ret is not None else "")
        raise RegistrationError(f"workload {workload!r}: verb {verb} takes {have}; it must take {want}")


def check(spec: WorkloadSpec, verbs: Verbs) -> Workload:
    """The workload `spec` and `verbs` make, or a RegistrationError naming what is missing or mistyped."""
    if not isinstance(verbs, Verbs):
        raise RegistrationError(f"workload {spec.name!r}: verbs.VERBS is {type(verbs).__name__}, not a Verbs")
    missing, extra = set(spec.models) - set(verbs.tasks), set(verbs.tasks) - set(spec.models)
    if missing or extra:
        raise RegistrationError(
            f"workload {spec.name!r}: verbs.tasks must name a task for each model type of its spec "
            f"({sorted(spec.models)}); missing {sorted(missing)}, unknown {sorted(extra)}"
        )
    for model_type, factory in verbs.tasks.items():
        _check_callable(spec.name, f"tasks[{model_type}]", factory)
    for part in fields(verbs):
        value = getattr(verbs, part.name)
        if part.name == "tasks" or value is None:
            continue
        if isinstance(value, (DataVerbs, ModelVerb, FilesVerb)):
            for sub in fields(value):
                if getattr(value, sub.name) is None and sub.default is None:  # optional (ModelVerb.check)
                    continue
                _check_callable(spec.name, f"{part.name}.{sub.name}", getattr(value, sub.name))
        else:
            _check_callable(spec.name, part.name, value)
    return Workload(spec, verbs)


@cache
def workloads() -> dict[str, Workload]:
    found = {}
    for info in pkgutil.iter_modules(package.__path__):
        if not info.ispkg:
            continue
        try:
            spec_module = importlib.import_module(f"hpctrain.workloads.{info.name}.spec")
        except ModuleNotFoundError as exc:
            if exc.name == f"hpctrain.workloads.{info.name}.spec":
                continue  # a folder without a spec is not a workload
            raise
        spec: WorkloadSpec = spec_module.WORKLOAD
        try:
            verbs_module = importlib.import_module(f"hpctrain.workloads.{info.name}.verbs")
        except ModuleNotFoundError as exc:
            if exc.name == f"hpctrain.workloads.{info.name}.verbs":
                raise RegistrationError(
                    f"workload {spec.name!r}: no verbs.py (its tasks are named there)"
                ) from None
            raise
        found[spec.name] = check(spec, verbs_module.VERBS)
    return found


@cache
def config_model() -> type[BaseModel]:
    """The full configuration type: every workload's model and data configs in discriminated unions."""
    models = [cls for spec in workloads().values() for cls in spec.models.values()]
    data = [cls for spec in workloads().values() for cls in spec.data]
    return build_config_model(models, data, DEFAULT_WORKLOAD)


def fill_default_types(tree: dict[str, Any]) -> None:
    """`model.type` defaults to the default workload's, or, where no layer names a type and the data section
    holds keys that only one other workload's data has (the cosmology scripts' DATA_TYPE, TRAIN_SAMPLES and
    VAL_SAMPLES: data.kind, n_train, n_val), to that workload's first model type: `sbatch slurm/single_gpu.sh
    --export=DATA_TYPE=2lpt` trains the fields workload. `data.type` defaults to the data type of model.type's
    workload."""
    model = tree.setdefault("model", {})
    data = tree.setdefault("data", {})
    if not isinstance(model, dict) or not isinstance(data, dict):
        return  # validation will name the section
    if "type" not in model and "type" not in data:
        model["type"] = _workload_of_data_keys(set(data)) or DEFAULT_WORKLOAD
    model.setdefault("type", DEFAULT_WORKLOAD)
    if "type" not in data:
        for spec in workloads().values():
            if model["type"] in spec.models and spec.data:
                data["type"] = spec.data[0].model_fields["type"].default
                break


def _workload_of_data_keys(keys: set[str]) -> str | None:
    """The first model type of the one workload whose data sections have all of `keys`, where the default
    workload's lack some and those are the data keys the sbatch scripts' short names set (ENV_ALIASES: DATA_TYPE,
    TRAIN_SAMPLES, VAL_SAMPLES); None otherwise (another key of another workload is refused naming it)."""
    specs = workloads()
    default = specs.get(DEFAULT_WORKLOAD)
    common = set().union(*(section.model_fields for section in default.spec.data)) if default else set()
    aliased = {key.partition(".")[2] for key in ENV_ALIASES.values() if key.startswith("data.")}
    if not keys - common or not keys - common <= aliased:
        return None
    owners = [
        w.spec for w in specs.values() if any(keys <= set(section.model_fields) for section in w.spec.data)
    ]
    return next(iter(owners[0].models)) if len(owners) == 1 and owners[0].models else None


def workload_of(model_type: str) -> Workload | None:
    """The workload that registers `model_type` (None: no workload does)."""
    return next((spec for spec in workloads().values() if model_type in spec.models), None)


def offering(verb: str) -> list[str]:
    """The workloads that offer `hpctrain <verb>` (sample, evaluate) for their models, sorted."""
    return sorted(w.name for w in workloads().values() if w.verbs.model_verb(verb) is not None)


def judging_files() -> dict[str, FilesVerb]:
    """Workload name -> its `hpctrain evaluate --sample --data`, for the workloads that offer it."""
    found = {name: w.verbs.evaluate_files for name, w in sorted(workloads().items())}
    return {name: verb for name, verb in found.items() if verb is not None}


def with_data_verbs() -> dict[str, DataVerbs]:
    """Workload name -> its `hpctrain data` verbs, for the workloads that have them."""
    return {name: w.verbs.data for name, w in sorted(workloads().items()) if w.verbs.data is not None}


def task_factory(model_type: str) -> TaskFactory:
    spec = workload_of(model_type)
    if spec is None:
        raise ValueError(f"model.type={model_type!r} has no registered workload")
    return spec.verbs.tasks[model_type]


def make_task(cfg: ConfigBase, env: ClusterEnv) -> Task[ConfigBase]:
    """The task of `cfg.model.type`'s workload: what `hpctrain.train.entry.run` is handed (a TaskFactory)."""
    return task_factory(cfg.model.type)(cfg, env)


def resolve(request: ConfigRequest) -> tuple[Any, Provenance]:
    """The validated configuration a request names, and where each key came from (the full config type, with
    every workload's model and data sections)."""
    return resolve_config(request, config_model(), prepare=fill_default_types)  # type: ignore[no-any-return]


def report_of(model_type: str | None) -> WorkloadReport:
    """The `WorkloadReport` (track/report/panels.py) of model_type's workload, or the generic report when the
    workload has none or the type is unknown."""
    from hpctrain.track.report.panels import NO_WORKLOAD  # numpy and the report: only where a report is drawn

    spec = workload_of(model_type) if model_type is not None else None
    if spec is None or spec.verbs.report is None:
        return NO_WORKLOAD
    return spec.verbs.report()
