"""Automatic run names: a pure function of what a run trains (config/naming.py), on the real loader and CLI."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hpctrain.config.loading import ConfigRequest, resolve_config
from hpctrain.config.naming import MAX_LENGTH, automatic_name
from hpctrain.workloads.registry import config_model, fill_default_types
from tests.conftest import ROOT, clean_env, hpctrain

SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def name(*overrides: str, config: str | None = None, preset: str | None = None, **environ: str) -> str:
    request = ConfigRequest(config, preset, list(overrides), None)
    cfg, _ = resolve_config(request, config_model(), environ, fill_default_types)
    return str(cfg.run.name)


def test_the_seed_sweep_gets_one_folder_per_value_whatever_the_spelling() -> None:
    # The template's preset, then LR from `sbatch slurm/single_gpu.sh --export=LR=...`.
    assert [name(preset="single_gpu", LR=lr) for lr in ("1e-5", "2e-5", "5e-5")] == [
        "single_gpu-lr0.00001",
        "single_gpu-lr0.00002",
        "single_gpu-lr0.00005",
    ]
    same = {
        name("optim.lr=2e-5", preset="single_gpu"),
        name(preset="single_gpu", HPCTRAIN_OPTIM__LR="0.00002"),
        name("optim.lr=2.0e-5", preset="single_gpu", LR="7"),  # the command line wins over LR
    }
    assert same == {"single_gpu-lr0.00002"}
    # floats positional: the folders sort by value (`ls logs/`), lr2e-05 once came after lr0.001
    values = ["2e-3", "2e-5", "3e-4", "1.5e-4", "5e-2"]
    names = [name(f"optim.lr={lr}") for lr in values]
    assert sorted(names) == [names[i] for i in sorted(range(len(values)), key=lambda i: float(values[i]))]
    assert name("optim.lr=1.5e-4") == "debug-lr0.00015"
    assert name("optim.lr=1e-3") == "debug"  # the config's own value adds nothing
    assert name() == "debug" and name(config=str(ROOT / "configs" / "debug.yaml")) == "debug"


@pytest.mark.parametrize(
    "override",
    [
        "run.out_dir=elsewhere",
        "checkpoint.every=7",
        "checkpoint.resume=never",
        "checkpoint.accept_changes=[optim.lr]",
        "slurm.time=02:00:00",
        "slurm.gpus_per_node=8",
        "logging.log_every=1",
        "budget.margin_seconds=60",
        "train.threads=3",
        "train.total_updates=5000",  # grows: raising it continues the run
        "data.num_workers=2",
    ],
)
def test_keys_that_may_change_between_hops_never_enter(override: str) -> None:
    assert name(override, "optim.lr=2e-5") == "debug-lr0.00002"
    assert (
        name(override, "optim.lr=2e-5", RESULTS_DIR="/tmp/r", GPUS="4", TOTAL_UPDATES="9")
        == "debug-lr0.00002"
    )


def test_identity_keys_in_schema_order_and_an_explicit_name_wins() -> None:
    assert name("model.hidden=[128,128]", "run.seed=3", "data.batch_size=64") == (
        "debug-seed3-hidden128_128-batch_size64"
    )
    assert name("train.precision=bf16") == "debug-precision_bf16"
    assert name("model.type=muon_flow") == "debug-model_type_muon_flow-data_type_muons"
    assert name("run.name=mine", "optim.lr=2e-5") == "mine"
    assert name(preset="single_gpu", HPCTRAIN_RUN__NAME="given", LR="1") == "given"
    muons = str(ROOT / "configs" / "muons.yaml")
    assert name("model.hidden=128", config=muons, preset="single_gpu") == "muons-single_gpu-model_hidden128"


def test_long_or_inexact_names_end_in_a_hash_and_stay_distinct() -> None:
    every = ["optim.lr", "optim.eps", "data.paths", "data.val_paths"]
    a = automatic_name("muons", {"data.paths": ["/data/a b/x*.parquet"]}, every)
    b = automatic_name("muons", {"data.paths": ["/data/a_b/x*.parquet"]}, every)
    assert a != b and re.fullmatch(r"muons-paths-[0-9a-f]{8}", a) and SAFE.fullmatch(b)
    assert automatic_name("muons", {"data.paths": ["a_b", "c"]}, every) != "muons-paths_a_b_c"  # = [a, b, c]
    many = {f"optim.k{i}": i * 1.5 for i in range(40)}
    long = automatic_name("single_gpu", many, list(many))
    assert len(long) <= MAX_LENGTH and SAFE.fullmatch(long) and re.search(r"-[0-9a-f]{8}$", long)
    other = automatic_name("single_gpu", {**many, "optim.k39": 0.0}, list(many))
    assert other != long and other[:-9] == long[:-9]  # the same readable part, another hash
    assert "k0" in long  # whole tokens kept, in order, while they fit


def test_the_cli_says_the_folder_first_and_the_same_command_continues_it(tmp_path: Path) -> None:
    args = ("train", "train.total_updates=3", "train.eval_every=0", "train.threads=1")
    first = hpctrain(*args, cwd=tmp_path, env=clean_env(LR="2e-5"))
    assert first.code == 0, first.err
    assert first.out.splitlines()[0] == (
        "run folder logs/debug-lr0.00002 (automatic run.name: debug + optim.lr=2e-05)"
    )
    again = hpctrain(*args, "optim.lr=2e-5", cwd=tmp_path)  # the same run, said another way
    assert again.code == 0, again.err
    assert "run 'debug-lr0.00002' already finished at update 3" in again.out
    other = hpctrain(*args, cwd=tmp_path, env=clean_env(LR="5e-5"))
    assert other.code == 0 and "finished at update 3/3" in other.out, other.err
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["debug-lr0.00002", "debug-lr0.00005"]


@pytest.mark.parametrize(
    ("file_name", "base"),
    [
        ("my run.yaml", "my_run"),
        ("...yaml", "run"),
        (".yaml", "yaml"),
        ("-x.yaml", "x"),
        ("ünï côdé.yaml", "n_c_d"),
        ("a" * 246 + ".yaml", None),
        ("b" * 200 + " c.yaml", None),
    ],
)
def test_config_file_names_that_are_no_folder_name_give_a_sane_one(
    tmp_path: Path, file_name: str, base: str | None
) -> None:
    """U4: the automatic name from a config file's stem is folder-safe and at most MAX_LENGTH characters (a long
    stem cut, with a hash of the whole stem), never a traceback; with overrides too."""
    path = tmp_path / file_name
    path.write_text((ROOT / "configs" / "debug.yaml").read_text())
    for overrides in ((), ("optim.lr=2e-5",)):
        got = name(*overrides, config=str(path))
        assert SAFE.fullmatch(got) and len(got) <= MAX_LENGTH, got
        if base is not None:
            assert got.split("-lr")[0] == base
    long_names = {name(config=str(path))}
    if base is None:  # another long stem with the same start names another folder
        other = tmp_path / (file_name[:100] + "z" + file_name[101:])
        other.write_text(path.read_text())
        long_names.add(name(config=str(other)))
        assert len(long_names) == 2


def test_a_config_file_named_with_a_space_trains_in_a_sane_folder(tmp_path: Path) -> None:
    path = tmp_path / "my run.yaml"
    path.write_text((ROOT / "configs" / "debug.yaml").read_text())
    done = hpctrain("config", "show", "--config", str(path), cwd=tmp_path)
    assert done.code == 0 and "Traceback" not in done.err and "name: my_run" in done.out
