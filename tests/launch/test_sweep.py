"""`hpctrain submit --sweep`: the plan, the array script, the refusals, and the element a task runs; without a
cluster (a stand-in sbatch records what it was given) and without torch. On a real cluster:
tests/integration/test_slurm_sweep.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.config.schema import SlurmConfig
from hpctrain.launch import sbatch
from hpctrain.launch.sweep import grid, split_values
from tests.conftest import ROOT, clean_env, hpctrain

GRID = ["--sweep", "optim.lr=1e-5,2e-5", "--sweep", "model.hidden=[64],[128,128]"]
NAMES = [
    "debug-lr0.00001-hidden64",
    "debug-lr0.00001-hidden128_128",
    "debug-lr0.00002-hidden64",
    "debug-lr0.00002-hidden128_128",
]


def fake_sbatch(tmp_path: Path, answer: str = 'echo "4242;cluster"', rc: int = 0) -> dict[str, str]:
    """An environment whose `sbatch` records its arguments in sbatch.args and answers like sbatch."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "sbatch"
    script.write_text(f'#!/bin/bash\nprintf "%s\\n" "$@" > {tmp_path}/sbatch.args\n{answer}\nexit {rc}\n')
    script.chmod(0o755)
    return clean_env(
        PATH=f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    )


def test_values_split_at_top_level_commas_and_the_grid_varies_the_last_key_fastest() -> None:
    assert split_values("1e-5,2e-5") == ["1e-5", "2e-5"]
    assert split_values("[64,64],[128],'a,b'") == ["[64,64]", "[128]", "'a,b'"]
    assert grid({"a": ["1", "2"], "b": ["x", "y"]}) == [
        ["a=1", "b=x"],
        ["a=1", "b=y"],
        ["a=2", "b=x"],
        ["a=2", "b=y"],
    ]


def test_dry_run_prints_the_plan_and_the_script_writes_nothing_and_never_imports_torch(
    tmp_path: Path,
) -> None:
    code = (
        "import sys; from hpctrain.cli import main; "
        f"rc = main(['submit', '--dry-run', '--max-parallel', '3', *{GRID!r}, 'train.total_updates=50']); "
        "assert 'torch' not in sys.modules, 'submit imported torch'; sys.exit(rc)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=clean_env(), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "sweep of 4 runs (optim.lr: 2 x model.hidden: 2), one job array, at most 3 at once:"
    for index, name in enumerate(NAMES):
        assert lines[1 + index].split()[:2] == [str(index), str(tmp_path / "logs" / name)]
    assert lines[1].endswith("optim.lr=1e-5 model.hidden=[64]")
    assert lines[5].startswith("# sbatch --parsable --array=0-3%3 ") and "--sweep-plan" in lines[5]
    assert lines[5].endswith("(dry run: nothing written, nothing queued)")
    script = "\n".join(lines[6:]) + "\n"
    assert script.startswith("#!/bin/bash\n#SBATCH --job-name=hpctrain-sweep-debug\n")
    assert "#SBATCH --time=00:10:00" in script and "#SBATCH --signal=B:USR1@30" in script  # the debug preset
    assert "#SBATCH --requeue" in script and "#SBATCH --output=logs/slurm/%x-%A_%a.out" in script
    assert not (tmp_path / "logs" / "slurm" / "sweeps").exists()
    assert not any((tmp_path / "logs").glob("debug*"))


def test_a_sweep_file_is_the_same_grid(tmp_path: Path) -> None:
    (tmp_path / "sweep.yaml").write_text("optim.lr: [1.0e-5, 2.0e-5]\nmodel.hidden: [[64], [128, 128]]\n")
    done = hpctrain("submit", "--dry-run", "--sweep-file", "sweep.yaml", cwd=tmp_path)
    assert done.code == 0, done.err
    assert [line.split()[1].rsplit("/", 1)[1] for line in done.out.splitlines()[1:5]] == NAMES


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sweep", "optim.lrr=1,2"], "error: --sweep optim.lrr: unknown key (did you mean optim.lr?)"),
        (["--sweep", "optim.lr="], "error: --sweep optim.lr: no values (an empty list sweeps nothing)"),
        (["--sweep", "optim.lr=1,,2"], "error: --sweep optim.lr: an empty value in '1,,2'"),
        (["--sweep", "optim.lr"], "error: --sweep 'optim.lr': give KEY=V1,V2,..."),
        (
            ["--sweep", "optim.lr=1e-3,-1"],
            "error: sweep element 1 (optim.lr=-1): optim.lr=-1: Input should be greater than or equal to 0",
        ),
        (
            ["--sweep", "optim.lr=1e-5,0.00001"],
            "error: sweep elements 0 (optim.lr=1e-5) and 1 (optim.lr=0.00001) would share the run folder",
        ),
        (
            ["--sweep", "checkpoint.every=5,10"],
            "checkpoint.every may change between hops and does not name runs: sweep keys that define the run",
        ),
        (["--sweep", "run.seed=1,2", "run.name=mine"], "run.name=mine is given: leave it out of a sweep"),
        (
            ["--sweep", "slurm.time=10,20"],
            "error: --sweep slurm.time: the slurm settings are one for the whole",
        ),
        (["--sweep", "optim.lr=1,2", "optim.lr=3"], "error: --sweep optim.lr: also given as an override"),
        (["--sweep", "data.pelican.token=a,b"], "error: --sweep data.pelican.token: a secret is never swept"),
        (
            [
                "--sweep",
                f"run.seed={','.join(map(str, range(11)))}",
                "--sweep",
                f"optim.lr={','.join(map(str, range(1, 101)))}",
            ],
            "error: the sweep has 1100 elements (11 x 100), over 1000: say --yes to queue them all",
        ),
        (
            ["--sweep", "optim.lr=1,2", "--max-parallel", "0"],
            "error: --max-parallel must be at least 1, not 0",
        ),
        (["--sweep-file", "nowhere.yaml"], "error: --sweep-file 'nowhere.yaml' not found"),
        (  # one run's checkpoint folder for every element: each upload would prune the others' checkpoints
            [
                "--sweep",
                "optim.lr=1e-3,2e-3",
                "checkpoint.dir=pelican://fed.example/ns/ckpt?authz=hpctrainTok",
            ],
            "error: sweep elements 0 (optim.lr=1e-3) and 1 (optim.lr=2e-3) would share checkpoint.dir "
            "(pelican://fed.example/ns/ckpt?authz=***)",
        ),
        (  # one name under two run.out_dir: one <mirror_to>/<run name>/ for both
            ["--sweep", "run.out_dir=a,b", "--sweep", "run.seed=1", "checkpoint.mirror_to=m"],
            "would share checkpoint.mirror_to",
        ),
    ],
)
def test_bad_sweeps_are_one_line_exit_2_and_queue_nothing(
    tmp_path: Path, args: list[str], message: str
) -> None:
    done = hpctrain("submit", *args, cwd=tmp_path, env=fake_sbatch(tmp_path))
    assert done.code == 2 and len(done.err.strip().splitlines()) == 1, done.err
    assert message in done.err and done.err.startswith("error: "), done.err
    assert not (tmp_path / "sbatch.args").exists() and not (tmp_path / "logs" / "slurm" / "sweeps").exists()


def test_a_bad_sweep_file_is_one_line(tmp_path: Path) -> None:
    for text, message in (
        ("- optim.lr\n", "the top level must be a mapping of key -> list of values"),
        ("optim.lr: 1e-5\n", "optim.lr: give a list of values"),
        ("optim.lr: []\n", "optim.lr: no values"),
        ("optim.lr: [1, 2\n", "malformed YAML"),
    ):
        (tmp_path / "s.yaml").write_text(text)
        done = hpctrain("submit", "--sweep-file", "s.yaml", cwd=tmp_path, env=fake_sbatch(tmp_path))
        assert done.code == 2 and len(done.err.strip().splitlines()) == 1 and message in done.err, done.err


def test_queueing_writes_the_plan_and_the_script_then_one_sbatch(tmp_path: Path) -> None:
    env = fake_sbatch(tmp_path)
    done = hpctrain("submit", *GRID, "--max-parallel", "2", "train.total_updates=50", cwd=tmp_path, env=env)
    assert done.code == 0, done.err
    folder = next((tmp_path / "logs" / "slurm" / "sweeps").iterdir())
    assert folder.stat().st_mode & 0o777 == 0o700  # the job reads its arguments there: nobody else may write
    plan, script = folder / "plan.json", folder / "sweep.sh"
    assert done.out.splitlines()[-1] == f"job array 4242 (tasks 0-3); plan {plan}"
    assert (tmp_path / "sbatch.args").read_text().splitlines() == [
        "--parsable",
        "--array=0-3%2",
        str(script),
        "--sweep-plan",
        str(plan),
    ]
    slurm = SlurmConfig(nodes=1, gpus_per_node=0, time="00:10:00", signal_lead_seconds=30)  # the debug preset
    assert script.read_text() == sbatch.render_sweep_script(
        slurm, "hpctrain-sweep-debug", str(script), str(plan)
    )
    record = json.loads(plan.read_text())
    assert [e["name"] for e in record["elements"]] == NAMES
    assert record["elements"][3]["args"] == [
        "--env-file",
        "",  # no .env where it was submitted: the job reads none either (not the one of the folder it runs in)
        "train.total_updates=50",
        "optim.lr=2e-5",
        "model.hidden=[128,128]",
    ]
    # What array task 3 runs: the element's arguments as shell words (read by slurm/common.sh).
    words = subprocess.run(
        [sys.executable, "-m", "hpctrain.launch.sweep", "args", str(plan), "3"],
        capture_output=True,
        text=True,
    )
    assert words.returncode == 0 and words.stdout.strip().endswith("optim.lr=2e-5 'model.hidden=[128,128]'")
    missing = subprocess.run(
        [sys.executable, "-m", "hpctrain.launch.sweep", "args", str(plan), "4"],
        capture_output=True,
        text=True,
    )
    assert (
        missing.returncode == 2
        and missing.stderr.strip() == f"error: sweep plan {plan} has elements 0..3, not 4"
    )


def test_the_batch_shell_takes_its_own_elements_arguments(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    args = ["--preset", "debug", "optim.lr=2e-5", "data.paths=[/a b/c's]"]
    plan.write_text(json.dumps({"version": 1, "elements": [{"args": ["x"]}, {"args": args}]}))
    shell = (
        f'source {ROOT}/slurm/common.sh; HPCTRAIN_ORIGINAL_ARGS=(--sweep-plan "$1"); '
        'hpctrain_sweep_element || exit $?; printf "%s\\n" "${HPCTRAIN_ORIGINAL_ARGS[@]}"'
    )
    env = clean_env(
        SLURM_ARRAY_TASK_ID="1", PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    )
    done = subprocess.run(["bash", "-c", shell, "bash", str(plan)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == args
    outside = subprocess.run(
        ["bash", "-c", shell, "bash", str(plan)],
        env=clean_env(PATH=env["PATH"]),
        capture_output=True,
        text=True,
    )
    assert outside.returncode == 2 and "--sweep-plan PLAN runs as a job array task" in outside.stderr


def test_a_failing_or_missing_sbatch_is_one_line(tmp_path: Path) -> None:
    env = fake_sbatch(
        tmp_path, answer='echo "sbatch: error: Batch job submission failed: Invalid partition" >&2', rc=1
    )
    done = hpctrain("submit", *GRID, cwd=tmp_path, env=env)
    assert done.code == 2 and len(done.err.strip().splitlines()) == 1, done.err
    assert done.err.startswith("error: sbatch failed (exit 1): sbatch: error: Batch job submission failed")
    bare = clean_env(PATH=str(Path(sys.executable).parent))  # a login node without SLURM's commands
    missing = hpctrain("submit", *GRID, cwd=tmp_path, env=bare)
    assert missing.code == 2 and "sbatch not found on PATH" in missing.err


def test_a_sweep_never_takes_an_earlier_sweeps_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpctrain.commands.submit import _sweep_folder

    monkeypatch.chdir(tmp_path)
    first = _sweep_folder("debug")
    first.mkdir(parents=True)
    second = _sweep_folder("debug")  # the same second, or a later one
    assert second != first and second.parent == first.parent and second.name.startswith("debug-")
    second.mkdir()
    assert _sweep_folder("debug") not in (first, second)


def test_a_sweep_sharing_a_mirror_keeps_each_run_apart_and_submitit_folders_are_private(
    tmp_path: Path,
) -> None:
    """checkpoint.mirror_to for the whole sweep: accepted (each run mirrors into <mirror_to>/<run name>/). A
    submitit folder the group may write (the job unpickles what is there) is one line, exit 2, nothing queued."""
    done = hpctrain(
        "submit", "--dry-run", "--sweep", "optim.lr=1e-3,2e-3", "checkpoint.mirror_to=m", cwd=tmp_path
    )
    assert done.code == 0, done.err
    submitit = tmp_path / "logs" / "slurm" / "submitit"
    submitit.mkdir(parents=True)
    submitit.chmod(0o775)
    local = hpctrain("submit", "--local", "train.total_updates=2", cwd=tmp_path)
    assert local.code == 2 and len(local.err.strip().splitlines()) == 1, local.err
    assert "submitit's job folder: " in local.err and "writable by its group" in local.err
    assert list(submitit.iterdir()) == []
