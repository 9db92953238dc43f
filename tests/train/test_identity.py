"""A run folder continues only its own run: other identity keys are refused with the diff, accepted changes are
recorded, allowed ones are listed; on the real CLI, as a user meets them after `make run`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hpctrain.commands.train import run
from hpctrain.config.loading import ConfigRequest, load_config
from hpctrain.errors import EXIT_OK, UserError
from hpctrain.runtime.env import ClusterEnv
from hpctrain.train import checkpointer
from hpctrain.train.checkpoint import load_verified
from hpctrain.workloads.registry import config_model, fill_default_types
from tests.conftest import clean_env, hpctrain, read_jsonl

SHORT = ["train.total_updates=40", "train.threads=1"]  # the default job (logs/debug), shorter


def files(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def latest_state(run_dir: Path) -> dict:
    name = (run_dir / "checkpoints" / "latest").read_text().strip()
    state = load_verified(run_dir / "checkpoints" / name)
    assert state is not None
    return state


def test_identity_change_is_refused_then_accepted_and_recorded(tmp_path: Path) -> None:
    assert hpctrain("train", *SHORT, cwd=tmp_path).code == EXIT_OK
    run_dir = tmp_path / "logs" / "debug"
    before = files(run_dir)

    # Another learning rate (and batch) without a name is another run, in its own folder: the debug run is
    # left alone.
    apart = hpctrain("train", *SHORT, "data.batch_size=64", cwd=tmp_path, env=clean_env(LR="2e-5"))
    assert apart.code == EXIT_OK, apart.err
    assert apart.out.startswith(
        "run folder logs/debug-lr0.00002-batch_size64 (automatic run.name: debug + optim.lr=2e-05, "
        "data.batch_size=64)\n"
    )
    assert files(run_dir) == before
    # Named, it is the mistake: another learning rate (and batch) continuing the debug run.
    refused = hpctrain(
        "train", *SHORT, "run.name=debug", "data.batch_size=64", cwd=tmp_path, env=clean_env(LR="2e-5")
    )
    assert refused.code == 2
    assert all(line.startswith("note: ") for line in refused.err.splitlines()[:-1]), refused.err
    assert refused.err.splitlines()[-1] + "\n" == (
        "error: logs/debug was trained with a different configuration: optim.lr 0.001 -> 2e-05, "
        "data.batch_size 32 -> 64; start a new run with run.name=debug-2, or accept the change with "
        "checkpoint.accept_changes=[optim.lr,data.batch_size]\n"
    )
    assert files(run_dir) == before  # nothing written: config.yaml, chain.json, checkpoints, metrics

    # A deliberate change: a new learning rate for the rest of the run.
    accepted = hpctrain(
        "train",
        "train.total_updates=60",
        "train.threads=1",
        "run.name=debug",
        "checkpoint.accept_changes=[optim.lr]",
        cwd=tmp_path,
        env=clean_env(LR="2e-5"),
    )
    assert accepted.code == EXIT_OK, accepted.err
    assert "accepted changes (checkpoint.accept_changes): optim.lr 0.001 -> 2e-05" in accepted.err
    hops = json.loads((run_dir / "chain.json").read_text())
    assert [h["accepted_changes"] for h in hops] == [{}, {"optim.lr": [0.001, 2e-05]}]
    assert hops[1]["allowed_changes"] == {"train.total_updates": [40, 60]}
    assert hops[0]["config_hash"] != hops[1]["config_hash"]
    assert [h["world_size"] for h in hops] == [1, 1]
    state = latest_state(run_dir)
    assert state["config_changes"] == [
        {"step": 40, "accepted": {"optim.lr": [0.001, 2e-05]}, "allowed": {"train.total_updates": [40, 60]}}
    ]
    logged = read_jsonl(run_dir / "metrics.jsonl")
    assert [(r["step"], r["hop"]) for r in logged if "loss" in r] == [(20, 0), (40, 0), (60, 1)]  # its hop
    times = [r["time"] for r in logged]  # when each was logged
    assert times == sorted(times) and hops[0]["start"] <= times[0] and times[-1] <= hops[1]["end"]
    records = [r for r in logged if "hop_start" in r]
    assert [(r["step"], r["hop"]) for r in records] == [(20, 0), (60, 1)]
    assert records[1]["hop_start"]["accepted_changes"] == {"optim.lr": [0.001, 2e-05]}
    assert records[1]["lr"] == pytest.approx(2e-5)

    status = hpctrain("status", str(run_dir), cwd=tmp_path)
    assert "  -- changed at update 40: optim.lr 0.001 -> 2e-05 (accepted); train.total_updates 40 -> 60 " in (
        status.out
    )
    assert hpctrain("report", str(run_dir), cwd=tmp_path).code == EXIT_OK
    assert "optim.lr 0.001 -&gt; 2e-05 (accepted)" in (run_dir / "report" / "index.html").read_text()

    # The checkpoint now holds the accepted rate: the first command is another run again.
    again = hpctrain("train", "train.total_updates=60", "train.threads=1", cwd=tmp_path)
    assert again.code == 2 and "optim.lr 2e-05 -> 0.001" in again.err


def test_allowed_changes_pass_with_one_line_and_the_length_never_shrinks(tmp_path: Path) -> None:
    assert hpctrain("train", *SHORT, cwd=tmp_path).code == EXIT_OK
    done = hpctrain(
        "train",
        "train.total_updates=60",
        "train.threads=2",
        "logging.log_every=5",
        "slurm.time=01:00:00",
        "data.num_workers=2",
        cwd=tmp_path,
    )
    assert done.code == EXIT_OK, done.err
    lines = [line for line in done.err.splitlines() if "changed since the checkpoint" in line]
    assert len(lines) == 1, done.err
    assert lines[0].endswith(
        "changed since the checkpoint (may change between hops): train.total_updates 40 -> 60, "
        "train.threads 1 -> 2, logging.log_every 20 -> 5, slurm.time 00:10:00 -> 01:00:00, data.num_workers 0 -> 2"
    )
    assert "accepted" not in done.err and "warn" not in done.err.lower()
    hops = json.loads((tmp_path / "logs" / "debug" / "chain.json").read_text())
    assert hops[0]["config_hash"] == hops[1]["config_hash"]  # the same run

    # Shorter than done (a shorter run that has not got there yet is refused too: tests/config/test_identity.py).
    below = hpctrain("train", "train.total_updates=50", cwd=tmp_path)
    assert below.code == 2
    assert "train.total_updates=50 is below update 60, which logs/debug has reached" in below.err


def make_cfg(out: Path, *overrides: str):
    request = ConfigRequest(None, None, ["run.name=old", f"run.out_dir={out}", *SHORT, *overrides], None)
    return load_config(request, config_model(), environ={}, prepare=fill_default_types)


@pytest.mark.parametrize("has_config", [True, False])
def test_checkpoints_of_an_older_version_keep_working(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, has_config: bool
) -> None:
    original = checkpointer.snapshot

    def old_state(*args: object) -> dict:
        # What an older hpctrain wrote: no change history, a config without the newer keys (or none at all).
        state = original(*args)  # type: ignore[arg-type]
        del state["config_changes"]
        del state["config"]["checkpoint"]["accept_changes"]
        if not has_config:
            del state["config"]
        return state

    with monkeypatch.context() as patch:
        patch.setattr(checkpointer, "snapshot", old_state)
        assert run(make_cfg(tmp_path), ClusterEnv()) == EXIT_OK
    if has_config:
        with pytest.raises(UserError, match=re.escape("optim.lr 0.001 -> 0.002")):
            run(make_cfg(tmp_path, "optim.lr=2e-3"), ClusterEnv())
    assert run(make_cfg(tmp_path, "train.total_updates=50"), ClusterEnv()) == EXIT_OK
    hops = json.loads((tmp_path / "old" / "chain.json").read_text())
    expected = {"train.total_updates": [40, 50]} if has_config else {}
    assert [h["last_update"] for h in hops] == [40, 50] and hops[1]["allowed_changes"] == expected


def test_another_best_metric_may_come_and_best_pt_is_chosen_afresh(tmp_path: Path) -> None:
    """checkpoint.best_metric and best_mode watch the run (issue 43): a hop may change them, and then the best so
    far, of the other measure, is no yardstick: best.pt is chosen afresh from the next evaluation."""
    every = "train.eval_every=20"
    assert hpctrain("train", *SHORT, every, cwd=tmp_path).code == EXIT_OK
    run_dir = tmp_path / "logs" / "debug"
    assert "best_metric: val_loss" in (run_dir / "config.yaml").read_text()  # auto: the regression's val_loss
    done = hpctrain(
        "train", "train.total_updates=60", "train.threads=1", every, "checkpoint.best_metric=val_mae",
        "checkpoint.best_mode=max", cwd=tmp_path,
    )  # fmt: skip
    assert done.code == EXIT_OK, done.err
    assert "checkpoint.best_metric val_loss -> val_mae, checkpoint.best_mode min -> max" in done.err
    assert "checkpoint.best_metric and checkpoint.best_mode changed: the best so far" in done.err
    # the old best (a small val_loss) would beat every val_mae under max only by chance; afresh, update 60's is it
    mae = {r["step"]: r["val_mae"] for r in read_jsonl(run_dir / "metrics.jsonl") if "val_mae" in r}
    assert sorted(mae) == [20, 40, 60]
    assert json.loads((run_dir / "summary.json").read_text())["best"] == mae[60]
    assert json.loads((run_dir / "checkpoints" / "best.json").read_text())["step"] == 60
