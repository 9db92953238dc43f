"""W5: a new run started from another run's final checkpoint trains updates and writes checkpoints of its own, or
says in one line why it has nothing to train; it never "finishes" empty with a warning about a killed run. And a
run resumed from a finished checkpoint with more updates asked for is not finished until its own final save."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpctrain.commands.train import run
from hpctrain.errors import EXIT_OK, UserError
from hpctrain.runtime.env import ClusterEnv
from tests.train.test_extend import make_cfg, stopped_at, summary


def finished_run(out: Path, total: int = 10) -> Path:
    assert run(make_cfg(out, f"train.total_updates={total}", "checkpoint.every=5"), ClusterEnv()) == EXIT_OK
    return out / "r"


def test_restoring_a_finished_run_with_nothing_left_is_one_line_and_changes_nothing(tmp_path: Path) -> None:
    source = finished_run(tmp_path / "a")
    other = tmp_path / "b"
    cfg = make_cfg(other, "train.total_updates=10", f"checkpoint.resume={source}")
    with pytest.raises(UserError) as info:
        run(cfg, ClusterEnv())
    text = str(info.value)
    assert "\n" not in text and "the final checkpoint of a finished run (update 10 of 10" in text
    assert "train.total_updates above 10" in text and "checkpoint.restart=false" in text
    # refused before anything was written: no summary.json claiming a finished (or killed) run
    assert not (other / "r" / "summary.json").exists() and not (other / "r" / "chain.json").exists()


def test_restoring_a_finished_run_with_more_updates_trains_its_own(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = finished_run(tmp_path / "a")
    other = tmp_path / "b"
    cfg = make_cfg(
        other,
        "train.total_updates=15",
        "checkpoint.every=5",
        f"checkpoint.resume={source}",
        "checkpoint.accept_changes=[train.total_updates]",
    )
    with caplog.at_level("WARNING"):
        assert run(cfg, ClusterEnv()) == EXIT_OK
    run_dir = other / "r"
    assert (run_dir / "checkpoints" / "step_00000015.pt").is_file()
    assert summary(run_dir)["status"] == "finished" and summary(run_dir)["step"] == 15
    hops = json.loads((run_dir / "chain.json").read_text())
    assert [(h["first_update"], h["last_update"]) for h in hops] == [(10, 15)]
    assert not [r for r in caplog.records if "killed" in r.getMessage()]


def test_an_extended_run_stopped_half_way_is_not_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Extended from a finished checkpoint, stopped at a save short of the new length: that checkpoint must not
    say "finished" (the next start would claim the run done at that update)."""
    out = tmp_path / "a"
    finished_run(out)
    extend = (
        "train.total_updates=20",
        "checkpoint.every=5",
        "checkpoint.accept_changes=[train.total_updates]",
    )
    stopped_at(out, monkeypatch, 3, *extend)  # the 3rd update of this hop: update 13, saved at the stop
    assert summary(out / "r")["status"] == "stopped"
    assert run(make_cfg(out, *extend), ClusterEnv()) == EXIT_OK
    assert summary(out / "r")["status"] == "finished" and summary(out / "r")["step"] == 20
