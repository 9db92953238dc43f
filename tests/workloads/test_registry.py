"""The registry checks each workload's verbs when it registers them: a missing task, a verb of the wrong shape or
a workload without verbs.py fails every command at once, naming the workload and the verb."""

from __future__ import annotations

import argparse
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

import hpctrain.workloads as package
from hpctrain.train.checkpoint import Located
from hpctrain.workloads import registry
from hpctrain.workloads.registry import (
    DataVerbs,
    ModelVerb,
    RegistrationError,
    Verbs,
    WorkloadSpec,
    check,
)


class _Cfg(BaseModel):
    type: str = "toy"


def _task(cfg: object, env: object) -> object:
    return (cfg, env)


def _add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n")


def _inspect(args: argparse.Namespace) -> int:
    return 0


def _run(args: argparse.Namespace, found: Located) -> int:
    return 0


SPEC = WorkloadSpec(name="toy", models={"toy": _Cfg}, data=[])


def test_every_registered_workload_has_a_task_per_model_type() -> None:
    for workload in registry.workloads().values():
        assert set(workload.verbs.tasks) == set(workload.models)
    assert registry.offering("sample") == ["muons"]
    assert sorted(registry.with_data_verbs()) == ["fields", "muons"]


def test_a_model_type_without_a_task_fails_registration() -> None:
    with pytest.raises(RegistrationError, match=r"workload 'toy': .*missing \['toy'\], unknown \['other'\]"):
        check(SPEC, Verbs(tasks={"other": _task}))


def test_a_verb_with_the_wrong_parameters_fails_registration() -> None:
    def generate(args: argparse.Namespace, extra: int) -> int:
        return 0

    data = DataVerbs(generate_args=_add_args, generate=generate, inspect=_inspect)
    with pytest.raises(
        RegistrationError, match=r"verb data.generate takes \(args, extra\) -> int; it must take"
    ):
        check(SPEC, Verbs(tasks={"toy": _task}, data=data))


def test_a_verb_with_the_wrong_return_fails_registration() -> None:
    def run(args: argparse.Namespace, found: Located) -> str:
        return ""

    with pytest.raises(RegistrationError, match=r"verb sample.run takes \(args, found\) -> str"):
        check(SPEC, Verbs(tasks={"toy": _task}, sample=ModelVerb(_add_args, run)))
    assert check(SPEC, Verbs(tasks={"toy": _task}, sample=ModelVerb(_add_args, _run))).name == "toy"


@pytest.fixture
def extra_workloads(tmp_path: Path) -> Iterator[Path]:
    """A folder searched for workloads beside hpctrain/workloads/ (as a new workload folder would be)."""
    package.__path__.append(str(tmp_path))
    registry.workloads.cache_clear()
    try:
        yield tmp_path
    finally:
        package.__path__.remove(str(tmp_path))
        for name in [m for m in sys.modules if m.startswith("hpctrain.workloads.broken")]:
            del sys.modules[name]
        registry.workloads.cache_clear()


def _write_workload(root: Path, verbs: str | None) -> None:
    folder = root / "broken"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "spec.py").write_text(
        textwrap.dedent("""
        from typing import Literal
        from pydantic import BaseModel
        from hpctrain.workloads.registry import WorkloadSpec

        class BrokenModel(BaseModel):
            type: Literal["broken"] = "broken"

        WORKLOAD = WorkloadSpec(name="broken", models={"broken": BrokenModel}, data=[])
        """)
    )
    if verbs is not None:
        (folder / "verbs.py").write_text(textwrap.dedent(verbs))


def test_a_workload_folder_with_a_mistyped_verb_fails_at_registration(extra_workloads: Path) -> None:
    _write_workload(
        extra_workloads,
        """
        from hpctrain.workloads.registry import Verbs

        def task(cfg):  # the env is missing
            return None

        VERBS = Verbs(tasks={"broken": task})
        """,
    )
    with pytest.raises(RegistrationError, match=r"workload 'broken': verb tasks\[broken\] takes \(cfg\)"):
        registry.workloads()


def test_a_workload_folder_without_verbs_fails_at_registration(extra_workloads: Path) -> None:
    _write_workload(extra_workloads, None)
    with pytest.raises(RegistrationError, match=r"workload 'broken': no verbs\.py"):
        registry.config_model.__wrapped__()


def test_registering_every_workload_imports_no_torch() -> None:
    """Every command registers the workloads, `submit` on a login node too: verbs.py imports torch only when a
    verb runs."""
    code = "import sys; from hpctrain.workloads.registry import config_model; config_model(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
