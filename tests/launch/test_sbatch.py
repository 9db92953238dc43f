"""sbatch rendering (golden: the checked-in templates), job checks, --export parsing, chain decisions."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from hpctrain.config.schema import SlurmConfig
from hpctrain.launch import sbatch
from hpctrain.launch.chain import decide
from hpctrain.workloads.registry import config_model, fill_default_types
from tests.conftest import ROOT, clean_env, hpctrain

TEMPLATES = ["single_gpu", "multi_gpu", "multi_node"]


def make_cfg(**slurm: object):
    tree: dict = {"slurm": dict(slurm)}
    fill_default_types(tree)
    return config_model().model_validate(tree)


@pytest.mark.parametrize("name", TEMPLATES)
def test_checked_in_templates_are_the_rendering(name: str) -> None:
    # Golden strings: edit sbatch.TEMPLATES and re-render, never the .sh files by hand.
    assert (ROOT / "slurm" / f"{name}.sh").read_text() == sbatch.render_template(name)


def test_checked_in_sweep_template_is_the_rendering() -> None:
    # slurm/sweep.sh: what `hpctrain submit --sweep` queues a copy of, with the config's slurm settings.
    assert (ROOT / "slurm" / "sweep.sh").read_text() == sbatch.render_sweep_template()
    header = [line for line in sbatch.render_sweep_template().splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --output=logs/slurm/%x-%A_%a.out" in header and not any("--array" in h for h in header)
    assert sbatch.array_range(4, 2) == "0-3%2" and sbatch.array_range(3, 10) == "0-2"


def test_rendered_header() -> None:
    slurm = SlurmConfig(
        partition="gpu",
        account="phys",
        nodes=2,
        gpus_per_node=4,
        time="1-00:00:00",
        signal_lead_seconds=300,
        extra_args=["--exclusive"],
    )
    text = sbatch.render_script(slurm, "hpctrain-x", "A test.", "slurm/x.sh")
    header = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert header == [
        "#SBATCH --job-name=hpctrain-x",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=phys",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=4",
        "#SBATCH --gres=gpu:4",
        "#SBATCH --cpus-per-task=4",
        "#SBATCH --mem=16G",
        "#SBATCH --time=1-00:00:00",
        "#SBATCH --signal=B:USR1@300",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
        "#SBATCH --output=logs/slurm/%x-%j.out",
        "#SBATCH --exclusive",
    ]
    torchrun = SlurmConfig(nodes=2, gpus_per_node=4, launcher="torchrun", resubmit="afterany")
    opts = sbatch.sbatch_options(torchrun, "t")
    assert "--ntasks-per-node=1" in opts and "--cpus-per-task=16" in opts and "--no-requeue" in opts


@pytest.mark.parametrize("script", sorted((ROOT / "slurm").glob("*.sh")), ids=lambda p: p.name)
def test_templates_parse(script: Path) -> None:
    subprocess.run(["bash", "-n", str(script)], check=True)


def test_signal_lead_is_read_from_the_script() -> None:
    assert sbatch.signal_lead_from_script(sbatch.render_template("multi_gpu")) == 120
    assert sbatch.signal_lead_from_script("#SBATCH --signal=USR2@90\n") == 90
    assert sbatch.signal_lead_from_script("#!/bin/bash\n") is None


@pytest.mark.parametrize(
    ("slurm", "message"),
    [
        ({"time": "00:01:00", "signal_lead_seconds": 60}, "is not shorter than the wall time"),
        ({"signal_lead_seconds": 2}, "signal_lead_seconds=2 is too short"),
        ({"gpus_per_node": 4, "tasks_per_node": 2}, "2 tasks per node with 4 GPUs per node"),
    ],
)
def test_job_settings_mistakes(slurm: dict, message: str) -> None:
    cfg = make_cfg(**slurm)
    errors = sbatch.validate_job(cfg, sbatch.shape_from_config(cfg.slurm))
    assert any(message in e for e in errors), errors


def test_requeue_needs_a_requeueable_job_and_torchrun_one_task_per_node() -> None:
    cfg = make_cfg(gpus_per_node=2, launcher="torchrun")
    shape = sbatch.JobShape(
        nodes=2,
        tasks_per_node=2,
        gpus_per_node=2,
        time_seconds=3600,
        signal_lead_seconds=120,
        requeue=False,
        launcher="torchrun",
    )
    errors = sbatch.validate_job(cfg, shape)
    assert any("--requeue" in e for e in errors) and any("torchrun with 2 tasks" in e for e in errors)
    assert sbatch.validate_job(make_cfg(), sbatch.shape_from_config(make_cfg().slurm)) == []


def test_signal_lead_uses_earlier_hops(tmp_path: Path) -> None:
    hops = [{"start": 1.0, "first_update": 0, "last_update": 10, "train_seconds": 50.0}]  # 5 s per update
    (tmp_path / "chain.json").write_text(json.dumps(hops))
    (tmp_path / "summary.json").write_text(json.dumps({"seconds": {"checkpoint": 4.0}}))
    cfg = make_cfg(signal_lead_seconds=10)
    errors = sbatch.validate_job(cfg, sbatch.shape_from_config(cfg.slurm), tmp_path)
    assert (
        errors and "one step (5.0 s)" in errors[0] and "(4.0 s)" in errors[0] and "earlier hops" in errors[0]
    )
    cfg = make_cfg(signal_lead_seconds=20)
    assert sbatch.validate_job(cfg, sbatch.shape_from_config(cfg.slurm), tmp_path) == []


def test_allocation_shape() -> None:
    job = {"NumNodes": "2", "TimeLimit": "00:01:00", "Requeue": "1", "TresPerNode": "gres:gpu:2"}
    env = {"SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "2"}
    shape = sbatch.shape_from_allocation(job, env, 15.0, "srun")
    assert (shape.nodes, shape.tasks_per_node, shape.gpus_per_node, shape.time_seconds) == (2, 2, 2, 60.0)
    assert shape.requeue and shape.processes == 4
    assert sbatch.shape_from_allocation({"TimeLimit": "UNLIMITED"}, {}, None, "srun").time_seconds is None


def test_submit_check_exits_2_naming_the_setting(tmp_path: Path) -> None:
    done = hpctrain("submit", "--check", "slurm.time=00:01:00", "slurm.signal_lead_seconds=90", cwd=tmp_path)
    assert done.code == 2
    assert "slurm.signal_lead_seconds=90 is not shorter than the wall time" in done.err
    done = hpctrain("submit", "--check", "slurm.time=banana", cwd=tmp_path)
    assert done.code == 2 and "slurm.time" in done.err
    done = hpctrain("submit", "--check", "run.name=ok", cwd=tmp_path)
    assert done.code == 0, done.err
    assert (
        f"hpctrain_run_dir={tmp_path / 'logs' / 'ok'}" in done.out and "hpctrain_resubmit=requeue" in done.out
    )


def test_chain_decisions() -> None:
    good = {"first_update": 0, "last_update": 10}
    idle = {"first_update": 10, "last_update": 10}
    assert decide([], "start", 0, 5, 2).action == "run"
    assert decide([good], "next", 75, 5, 2).action == "resubmit"
    assert decide([good], "next", 0, 5, 2).action == "done"
    assert decide([good], "next", 1, 5, 2).action == "stop"
    assert decide([good, idle, idle], "start", 0, 5, 2).action == "stop"
    assert decide([good, idle], "start", 0, 5, 2).action == "run"
    assert decide([good] * 3, "next", 75, 2, 2).action == "stop"  # hop 3 would be resubmit number 3 > 2
    assert decide([good] * 2, "next", 75, 2, 2).action == "resubmit"


def parse_args_in_bash(*args: str) -> list[str]:
    """Source common.sh and run its argument parser; returns LR, BATCH_SIZE and the remaining arguments."""
    script = (
        f'source "{ROOT}/slurm/common.sh"; hpctrain_parse_args "$@" || exit $?; '
        'printf "%s\\n" "LR=${LR:-}" "BATCH_SIZE=${BATCH_SIZE:-}" "${HPCTRAIN_ARGS[@]}"'
    )
    done = subprocess.run(["bash", "-c", script, "x", *args], capture_output=True, text=True, env=clean_env())
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_export_argument_forms() -> None:
    assert parse_args_in_bash("--export=LR=2e-5", "run.name=a") == ["LR=2e-5", "BATCH_SIZE=", "run.name=a"]
    assert parse_args_in_bash("--export=ALL,LR=1e-4,BATCH_SIZE=8", "--config", "c.yaml") == [
        "LR=1e-4",
        "BATCH_SIZE=8",
        "--config",
        "c.yaml",
    ]
    assert parse_args_in_bash("--export", "LR=3e-4") == ["LR=3e-4", "BATCH_SIZE="]
    assert parse_args_in_bash("optim.lr=1", "a=b=c") == ["LR=", "BATCH_SIZE=", "optim.lr=1", "a=b=c"]
    bad = subprocess.run(
        ["bash", "-c", f'source "{ROOT}/slurm/common.sh"; hpctrain_parse_args "$@"', "x", "--export=1X=2"],
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert bad.returncode == 2 and "is not a variable name" in bad.stderr


def test_templates_imply_their_own_preset() -> None:
    """Without --preset a template's job takes its own (so its own run folder); a named one always wins."""
    script = (
        f'hpctrain_default_preset=multi_gpu; source "{ROOT}/slurm/common.sh"; hpctrain_parse_args "$@" || exit $?; '
        'printf "%s\\n" "${HPCTRAIN_ARGS[@]}"'
    )

    def parsed(*args: str) -> list[str]:
        done = subprocess.run(
            ["bash", "-c", script, "x", *args], capture_output=True, text=True, env=clean_env()
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    assert parsed("--export=LR=2e-5", "train.total_updates=300") == [
        "--preset",
        "multi_gpu",
        "train.total_updates=300",
    ]
    assert parsed("--config", "c.yaml", "--preset", "debug") == ["--config", "c.yaml", "--preset", "debug"]
    assert parsed("--preset=none") == ["--preset=none"]
    for name in TEMPLATES:
        assert f"\nhpctrain_default_preset={name}\n" in (ROOT / "slurm" / f"{name}.sh").read_text()


def test_in_job_signal_lead_prefers_the_users_value_and_warns_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """SLURM shows no job's --signal: slurm.signal_lead_seconds when the user gave it, else the script's line."""
    from argparse import Namespace

    from hpctrain.commands.submit import job_signal_lead
    from hpctrain.config.loading import ConfigRequest, resolve_config

    def lead(*overrides: str, script: float | None = 120.0, preset: str | None = None) -> float | None:
        request = ConfigRequest(None, preset, list(overrides), None)
        cfg, sources = resolve_config(request, config_model(), environ={}, prepare=fill_default_types)
        return job_signal_lead(cfg, Namespace(signal_lead=script), sources)

    assert lead("slurm.signal_lead_seconds=15") == 15
    assert "checking with slurm.signal_lead_seconds=15 (from command line)" in capsys.readouterr().err
    assert lead(preset="debug") == 120  # a preset's value is no word from the user: the script's line
    err = capsys.readouterr().err
    assert "the script's #SBATCH --signal line (120 s), which could not be confirmed" in err
    assert len(err.splitlines()) == 1
    assert lead(script=None) is None and capsys.readouterr().err == ""
