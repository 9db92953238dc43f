"""The loop's cadences (train/cadence.py): when a log line, a save, an evaluation and a check are due, and the
votes all ranks reduce in one call."""

from __future__ import annotations

from pathlib import Path

from hpctrain.commands.train import run
from hpctrain.config.loading import ConfigRequest, load_config
from hpctrain.errors import EXIT_OK
from hpctrain.runtime.budget import Stop
from hpctrain.runtime.env import ClusterEnv
from hpctrain.train.cadence import (
    FIRST_LINE_SECONDS,
    CheckCadence,
    CheckVotes,
    EvalCadence,
    Every,
    LogCadence,
)
from hpctrain.workloads.registry import config_model, fill_default_types
from tests.conftest import read_jsonl


def test_log_lines_come_by_updates_and_by_time() -> None:
    log = LogCadence(every=50, seconds=60.0, total=1000)
    log.start(now=100.0)
    assert not log.due(1, now=100.5)
    # The first line soon after the first update, whatever log_every says...
    assert log.due(2, now=100.0 + FIRST_LINE_SECONDS)
    # ...then every `seconds` after the line before, and every 50 updates in between.
    assert not log.due(3, now=150.0)
    assert log.due(50, now=151.0)
    assert not log.due(51, now=200.0)
    assert log.due(52, now=211.0)
    assert log.due(1000, now=211.5)  # the last update always logs


def test_log_by_updates_only_when_seconds_is_zero() -> None:
    log = LogCadence(every=10, seconds=0.0, total=100)
    log.start(now=0.0)
    assert [s for s in range(1, 31) if log.due(s, now=1e9)] == [10, 20, 30]


def test_checks_come_before_evaluations_and_at_every_due_part() -> None:
    evals = EvalCadence(Every(20), has_val=True, total=100)
    assert evals.due(20) and not evals.due(100) and evals.due_next(19) and evals.due_next(99)
    assert evals.next_checks(5) == [
        99,
        19,
    ]  # the update before each evaluation: whether it fits is asked there
    check = CheckCadence()
    ahead = check.plan(5, every_update=False, upcoming=[100, 10, None, *evals.next_checks(5)])
    assert check.next == 6 and ahead == 1  # no step time agreed yet: the next update
    check.step_seconds = 0.001
    assert check.plan(5, every_update=False, upcoming=[100, 10, None]) == 5  # the log step comes first
    assert check.plan(5, every_update=True, upcoming=[100]) == 1


def test_votes_at_world_size_one_are_the_votes_and_read_by_name() -> None:
    votes = CheckVotes(stop=Stop.SIGNAL, save_due=True, nonfinite=None, step_seconds=0.5)
    agreed = votes.agree()
    assert (
        agreed.stop == "signal"
        and agreed.save_due
        and agreed.step_seconds == 0.5
        and agreed.nonfinite is None
    )


def test_a_hop_stopping_between_log_lines_records_its_last_one(tmp_path: Path) -> None:
    overrides = [
        "run.name=t",
        f"run.out_dir={tmp_path}",
        "train.threads=1",
        "optim.lr=0",
        "train.eval_every=10",
        "train.total_updates=1000",
        "train.early_stopping.patience=2",
        "logging.log_every=500",
    ]
    cfg = load_config(ConfigRequest(None, None, overrides, None), config_model(), prepare=fill_default_types)
    assert run(cfg, ClusterEnv()) == EXIT_OK
    steps = [r["step"] for r in read_jsonl(tmp_path / "t" / "metrics.jsonl") if "loss" in r]
    assert steps[-1] == 30  # stopped early at update 30, long before update 500
