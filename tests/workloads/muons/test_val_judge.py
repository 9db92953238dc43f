"""The judge at every evaluation of a muon generator (evaluation/val_judge.py): a fixed validation subset, the same
figures every time, logged with the evaluation, and no trace in the training's random streams."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from hpctrain.commands.train import run
from hpctrain.errors import EXIT_OK
from hpctrain.runtime.env import ClusterEnv
from hpctrain.train.evaluation import Evaluator
from hpctrain.workloads.muons.data_verbs import synthetic_events
from hpctrain.workloads.muons.evaluation import two_sample, val_judge
from hpctrain.workloads.muons.models import sampling
from hpctrain.workloads.muons.tasks.base import MuonTaskBase
from hpctrain.workloads.muons.tasks.wgan import MuonWGANTask
from tests.conftest import read_jsonl
from tests.workloads.muons.conftest import make_cfg


def seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def test_the_subset_is_fixed_capped_per_energy_bin_and_in_file_order() -> None:
    events = synthetic_events(1500, seed=3, file_index=0)
    subset = val_judge.fixed_subset(events, per_bin=40)
    bins = two_sample.energy_bin(subset.primaries.astype(np.float64))
    # the truth's energies are log-uniform over 1e3-1e9 GeV: every bin holds more than 40, so each keeps 40
    assert np.bincount(bins).tolist() == [40] * 5
    assert np.all(np.diff(subset.ids[:, 1]) > 0)  # file order, each event once
    rows = subset.ids[:, 1]
    assert np.array_equal(subset.counts, events.counts[rows])
    assert np.array_equal(
        subset.muons,
        events.muons[np.concatenate([np.arange(events.offsets[r], events.offsets[r + 1]) for r in rows])],
    )
    again = val_judge.fixed_subset(events, per_bin=40)
    assert np.array_equal(again.ids, subset.ids)  # the same events at every evaluation
    other = val_judge.fixed_subset(events, per_bin=40, seed=val_judge.JUDGE_SEED + 1)
    assert not np.array_equal(other.ids, subset.ids)
    assert len(val_judge.fixed_subset(events, per_bin=10_000)) == len(events)  # fewer than the cap: all


def test_the_judge_gives_the_same_figures_and_leaves_every_random_stream_as_it_was(
    trained_wgan: Path,
) -> None:
    model = sampling.load_model(trained_wgan, "cpu")
    task = MuonWGANTask(model.cfg, ClusterEnv())
    # figures() needs the task alone
    evaluator = Evaluator(task, None, None, model.cfg.train, model.cfg.checkpoint, 0)  # type: ignore[arg-type]
    for module in model.modules.values():
        module.train()
    seed_all(7)
    first = evaluator.figures(model.modules, model.step)
    after = (torch.rand(3), np.random.rand(3), random.random())
    seed_all(7)
    expected = (torch.rand(3), np.random.rand(3), random.random())
    assert (
        torch.equal(after[0], expected[0])
        and np.array_equal(after[1], expected[1])
        and after[2] == expected[2]
    )
    assert all(module.training for module in model.modules.values())  # back in train mode
    assert evaluator.figures(model.modules, model.step) == first
    # 60 validation events: the overall AUC and its band; no energy bin holds MIN_BIN_PAIRS pairs
    assert set(first) == {"val_auc", "val_auc_null_upper", "val_fpd", "val_kpd"}
    assert 0.0 <= first["val_auc"] <= 1.0 and first["val_auc_null_upper"] > 0.5
    # another rank judges nothing itself: under DDP it receives rank 0's figures (here, without a group: none)
    other_rank = MuonWGANTask(model.cfg, ClusterEnv(rank=1, world_size=2))
    judge = Evaluator(other_rank, None, None, model.cfg.train, model.cfg.checkpoint, 0)  # type: ignore[arg-type]
    assert judge.figures(model.modules, model.step) == {}


def test_the_judge_is_logged_at_each_evaluation_and_does_not_change_the_training(
    wgan_data: Path, trained_wgan: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    evals = [r for r in read_jsonl(trained_wgan / "metrics.jsonl") if "val_auc" in r]
    assert [r["step"] for r in evals] == [5, 10] and all("val_multiplicity_nll" in r for r in evals)
    monkeypatch.setattr(MuonTaskBase, "model_figures", lambda self, modules, step: {})
    assert run(make_cfg(wgan_data, tmp_path), ClusterEnv()) == EXIT_OK
    without = json.loads((tmp_path / "t" / "summary.json").read_text())
    judged = json.loads((trained_wgan / "summary.json").read_text())
    assert without["params_sha256"] == judged["params_sha256"]
    assert not any("val_auc" in r for r in read_jsonl(tmp_path / "t" / "metrics.jsonl"))
