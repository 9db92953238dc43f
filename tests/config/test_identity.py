"""What may change when a run continues: every key classified, the hash of the identity keys, run names."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.config.dump import config_hash, dump_config
from hpctrain.config.identity import GROWS, IDENTITY, MAY_CHANGE, SECRET, classify, judge
from hpctrain.config.loading import ConfigRequest, load_config
from hpctrain.workloads.registry import config_model, fill_default_types, workloads
from tests.conftest import ROOT, hpctrain


def load(*overrides: str, config: str | None = None, preset: str | None = None):
    request = ConfigRequest(config, preset, list(overrides), None)
    return load_config(request, config_model(), environ={}, prepare=fill_default_types)


def every_workload_config():
    for spec in workloads().values():
        for model_type in spec.models:
            for data in spec.data:
                data_type = data.model_fields["type"].default
                yield f"{model_type}/{data_type}", load(f"model.type={model_type}", f"data.type={data_type}")


def test_every_key_of_every_workload_is_classified():
    for name, cfg in every_workload_config():
        marks = classify(cfg)
        unmarked = [key for key, mark in marks.items() if mark not in (IDENTITY, MAY_CHANGE, GROWS, SECRET)]
        assert not unmarked, f"{name}: keys without a resume mark: {unmarked}"
        assert set(dump_keys(dump_config(cfg))) == set(marks), name  # every dumped leaf, nothing else
    marks = classify(load())
    expected = {
        "optim.lr": IDENTITY,
        "schedule.stages": IDENTITY,
        "run.seed": IDENTITY,
        "data.batch_size": IDENTITY,
        "data.n_train": IDENTITY,  # a workload's data field: data content
        "model.hidden": IDENTITY,
        "train.precision": IDENTITY,
        "train.grad_accum_steps": IDENTITY,
        "train.total_updates": GROWS,
        "train.epochs": GROWS,
        "train.threads": MAY_CHANGE,
        "train.device": MAY_CHANGE,
        "train.eval_every": MAY_CHANGE,
        "checkpoint.every": MAY_CHANGE,
        "data.num_workers": MAY_CHANGE,
        "data.staging.ahead": MAY_CHANGE,
        "slurm.time": MAY_CHANGE,
        "budget.time_limit": MAY_CHANGE,
        "logging.log_every": MAY_CHANGE,
        "run.name": MAY_CHANGE,
        "logging.wandb.api_key": SECRET,
        "data.pelican.token": SECRET,
    }
    assert {key: marks[key] for key in expected} == expected


def dump_keys(tree: dict, prefix: str = ""):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from dump_keys(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


def test_config_hash_is_the_identity_keys_only():
    base = config_hash(load())
    assert config_hash(load("slurm.time=02:00:00", "data.num_workers=3", "train.total_updates=999")) == base
    assert config_hash(load("optim.lr=2e-5")) != base
    assert config_hash(load("data.batch_size=64")) != base


def test_judge_sorts_changes_and_compares_only_what_the_checkpoint_knows():
    old = dump_config(load())
    del old["train"]["eval_batches"]  # a key an older version did not have: not compared
    old["model"]["type"] = "other"  # another model type: only the type is reported, not its fields
    old["model"]["hidden"] = [1]
    cfg = load(  # continuing the same folder (the automatic name would be another: debug-lr0.00002)
        "run.name=debug",
        "optim.lr=2e-5",
        "slurm.time=01:00:00",
        "train.eval_batches=3",
        "checkpoint.accept_changes=optim",
    )
    verdict = judge(old, cfg, old_total=200, new_total=200, old_world=1, new_world=2)
    assert [str(c) for c in verdict.accepted] == ["optim.lr 0.001 -> 2e-05"]
    assert [c.key for c in verdict.allowed] == ["slurm.time", "world_size"]
    assert [c.key for c in verdict.refused] == ["model.type"]
    # Another length is allowed, either way, unless train/length.py found what it does to the LR of the updates
    # so far: then it is refused with that effect, unless accepted.
    shrunk = judge(
        dump_config(load()), load("train.total_updates=150"), old_total=200, new_total=150, **WORLD
    )
    assert [c.key for c in shrunk.allowed] == ["train.total_updates"] and not shrunk.refused
    grown = judge(dump_config(load()), load("train.total_updates=300"), old_total=200, new_total=300, **WORLD)
    assert [c.key for c in grown.allowed] == ["train.total_updates"] and not grown.refused
    moved = judge(
        dump_config(load()),
        load("train.total_updates=300"),
        old_total=200,
        new_total=300,
        length_effect="the LR moves",
        **WORLD,
    )
    assert [str(c) for c in moved.refused] == ["train.total_updates 200 -> 300 (the LR moves)"]
    assert not moved.allowed
    taken = judge(
        dump_config(load()),
        load("train.total_updates=300", "checkpoint.accept_changes=[train.total_updates]"),
        old_total=200,
        new_total=300,
        length_effect="the LR moves",
        **WORLD,
    )
    assert [str(c) for c in taken.accepted] == ["train.total_updates 200 -> 300"] and not taken.refused
    # The same keys, another length (train.epochs over another global batch): named by the key that sets it.
    epochs = dump_config(load("train.epochs=2"))
    same_keys = judge(
        epochs, load("train.epochs=2"), old_total=256, new_total=128, length_effect="x", **WORLD
    )
    assert [str(c) for c in same_keys.refused] == ["train.epochs 256 updates -> 128 updates (x)"]
    # train.epochs set on resume of a run by total_updates: the updates that run are what is said (the ignored
    # train.total_updates value is not: no `train.total_updates 256 -> 200` beside a run to 256)
    by_epochs = load("train.epochs=1")
    same_length = judge(
        dump_config(load("train.total_updates=256")), by_epochs, old_total=256, new_total=256, **WORLD
    )
    assert not same_length.allowed and not same_length.refused
    longer = judge(
        dump_config(load("train.total_updates=256")), by_epochs, old_total=128, new_total=256, **WORLD
    )
    assert [str(c) for c in longer.allowed] == ["train.epochs 128 updates -> 256 updates"]


WORLD = {"old_world": 1, "new_world": 1}


@pytest.mark.parametrize(
    ("config", "preset", "expected"),
    [
        (None, None, "debug"),  # `make run`: unchanged
        (None, "multi_gpu", "multi_gpu"),
        ("configs/debug.yaml", None, "debug"),
        ("configs/fields.yaml", "single_gpu", "fields-single_gpu"),
        ("configs/muons.yaml", "none", "muons"),
    ],
)
def test_default_run_name_from_config_and_preset(config: str | None, preset: str | None, expected: str):
    path = str(ROOT / config) if config else None
    assert load(config=path, preset=preset).run.name == expected
    assert load("run.name=mine", config=path, preset=preset).run.name == "mine"  # an explicit name wins


def test_accept_changes_must_name_config_keys(tmp_path: Path):
    assert load("checkpoint.accept_changes=optim.lr,data").checkpoint.accept_changes == ["optim.lr", "data"]
    done = hpctrain("config", "show", "checkpoint.accept_changes=[optim.lrr]", cwd=tmp_path)
    assert done.code == 2 and done.err.count("\n") == 1
    assert "checkpoint.accept_changes: 'optim.lrr' is not a config key" in done.err
