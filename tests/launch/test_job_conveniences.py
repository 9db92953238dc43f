"""Job-script conveniences: the `--export` names a script accepts, presets that take their size, and
slurm/generate_data.sh for the fields workload (its share logic run without SLURM, SLURM_ARRAY_* set by hand).
The same scripts under a real SLURM cluster: tests/integration (the lead's run)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from hpctrain.config.environ import ENV_ALIASES, ENV_KEYS
from hpctrain.workloads.fields.dataset import ShardFields
from tests.conftest import ROOT, clean_env, hpctrain


def bash(script: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", script], cwd=cwd, env=env or clean_env(), capture_output=True, text=True, timeout=120
    )


def test_the_script_knows_the_names_the_loader_reads() -> None:
    done = bash('source slurm/common.sh; echo "$HPCTRAIN_EXPORT_NAMES"')
    assert set(done.stdout.split()) == {*ENV_ALIASES, *ENV_KEYS, "DATA_DIR"}


def test_unknown_export_names_are_refused_in_one_line_known_ones_exported() -> None:
    parse = 'source slurm/common.sh; hpctrain_parse_args --export={} x=1; echo "rc=$? GPUS=${{GPUS:-}}"'
    done = bash(parse.format("ALL,GPUS=8,NCCL_DEBUG=INFO"))
    assert "rc=0 GPUS=8" in done.stdout, done.stderr
    bad = bash(parse.format("ALL,TRAIN_SAMPLE=100"))
    assert "rc=2" in bad.stdout and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert "--export TRAIN_SAMPLE: not a name hpctrain reads (known: LR, " in bad.stderr
    assert "TRAIN_SAMPLES" in bad.stderr


def test_cosmology_names_map_to_the_workloads_own_data_keys(tmp_path: Path) -> None:
    env = clean_env(DATA_TYPE="lognormal", TRAIN_SAMPLES="512", GPUS="8")
    done = hpctrain(
        "config", "show", "--config", str(ROOT / "configs" / "fields.yaml"), cwd=tmp_path, env=env
    )
    assert done.code == 0, done.err
    assert "kind: lognormal  # from environment DATA_TYPE" in done.out
    assert "n_train: 512  # from environment TRAIN_SAMPLES" in done.out
    assert "gpus_per_node: 8  # from environment GPUS" in done.out
    refused = hpctrain(
        "config", "show", "--config", str(ROOT / "configs" / "muons.yaml"), cwd=tmp_path, env=env
    )
    assert refused.code == 2 and len(refused.err.strip().splitlines()) == 1, refused.err
    assert "data.kind" in refused.err and "DATA_TYPE" in refused.err


def test_presets_take_their_size(tmp_path: Path) -> None:
    done = hpctrain("submit", "--dry-run", "--preset", "multi_gpu", "--gpus", "8", cwd=tmp_path)
    assert done.code == 0, done.err
    assert "#SBATCH --gpus-per-node=8" in done.out and "#SBATCH --ntasks-per-node=8" in done.out
    shown = hpctrain(
        "config", "show", "--preset", "multi_node", "--nodes", "4", "slurm.nodes=3", cwd=tmp_path
    )
    assert "  nodes: 3  # from command line" in shown.out  # a key typed after the size still wins
    shown = hpctrain("config", "show", "--preset", "multi_node", "--nodes", "4", cwd=tmp_path)
    assert "  nodes: 4  # from command line" in shown.out and "  gpus_per_node: 4" in shown.out


def test_generate_data_sh_writes_disjoint_fields_shares(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "hpctrain").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m hpctrain "$@"\n')
    (bin_dir / "hpctrain").chmod(0o755)
    out = tmp_path / "sharded"
    args = "--kind fields --n 40 --n-val 8 --n-test 0 --shard-size 8 --size 16"
    written = []
    for task in (4, 5, 6):  # an array may start anywhere: --array=4-6
        env = clean_env(
            PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            HPCTRAIN_HOME=str(ROOT),
            SLURM_ARRAY_TASK_ID=str(task),
            SLURM_ARRAY_TASK_COUNT="3",
            SLURM_ARRAY_TASK_MIN="4",
        )
        done = bash(f"bash slurm/generate_data.sh {args} --out {out}", env=env)
        assert done.returncode == 0, done.stderr
        shards = sorted(p.name for p in (out / "train").glob("shard-*.h5"))
        written.append(shards)
        assert (out / "train" / "meta.json").exists() == (task == 6)  # only once the split is whole
    assert written[0] == ["shard-00000.h5", "shard-00003.h5"]
    assert written[1] == ["shard-00000.h5", "shard-00001.h5", "shard-00003.h5", "shard-00004.h5"]
    # task 4 again: a second submission never replaces the data; the same task requeued writes its own again
    for restarts, code in (("0", 2), ("1", 0)):
        env = clean_env(
            PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            HPCTRAIN_HOME=str(ROOT),
            SLURM_ARRAY_TASK_ID="4",
            SLURM_ARRAY_TASK_COUNT="3",
            SLURM_ARRAY_TASK_MIN="4",
            SLURM_RESTART_COUNT=restarts,
        )
        done = bash(f"bash slurm/generate_data.sh {args} --out {out}", env=env)
        assert done.returncode == code, done.stderr
        assert code == 0 or "already holds 5 of the files this would write" in done.stderr
    # the same maps a single `hpctrain data generate` writes
    single = tmp_path / "single"
    done = hpctrain("data", "generate", *args.split(), "--out", str(single), cwd=tmp_path)
    assert done.code == 0, done.err
    for split in ("train", "val"):
        a, b = ShardFields(out / split), ShardFields(single / split)
        assert len(a) == len(b) == (40 if split == "train" else 8)
        for x, y in zip(a.__getitems__(list(range(len(a)))), b.__getitems__(list(range(len(b))))):
            np.testing.assert_array_equal(x.numpy(), y.numpy())


def test_submit_local_says_where_its_output_went(tmp_path: Path) -> None:
    """The local job's output is not on the terminal: the last line names its files (issue 31 item 8)."""
    import shutil

    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    done = hpctrain("submit", "--local", "train.total_updates=4", cwd=tmp_path)
    assert done.code == 0, done.err
    last = done.out.strip().splitlines()[-1]
    assert last.startswith("local job ") and " exited 0; its output: " in last
    out, err = last.split("its output: ", 1)[1].split(" and ")
    assert Path(out).is_file() and Path(err).is_file() and "update 4/4" in Path(out).read_text()
