"""A fresh start never overwrites an earlier run's history (issue 29 item 4): with no checkpoint left and no
chain.json that names one (missing, empty, unreadable), whatever history the folder holds is moved aside into
`old-<time>/` (as checkpoint.resume=never does) and said in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.commands.train import run
from hpctrain.config.loading import ConfigRequest, load_config
from hpctrain.errors import EXIT_OK
from hpctrain.runtime.env import ClusterEnv
from hpctrain.workloads.registry import config_model, fill_default_types
from tests.conftest import read_jsonl


def cfg_for(out: Path, *overrides: str):
    base = [
        "run.name=t",
        f"run.out_dir={out}",
        "train.eval_every=0",
        "train.threads=1",
        "train.total_updates=3",
    ]
    return load_config(
        ConfigRequest(None, None, [*base, *overrides], None), config_model(), prepare=fill_default_types
    )


def kept_copies(run_dir: Path, data: bytes) -> list[Path]:
    return [p for p in run_dir.rglob("*") if p.is_file() and p.read_bytes() == data]


HISTORY = {
    "metrics.jsonl": b'{"step": 7, "loss": 0.5}\n',
    "summary.json": b'{"status": "finished", "last_update": 7}\n',
    "training.log": b"==== an earlier hop ====\nupdate 7 | loss 0.5\n",
    "chain.json": b"[]\n",  # valid, but no hop in it
}


@pytest.mark.parametrize("name", sorted(HISTORY))
def test_each_history_file_alone_is_moved_aside_not_overwritten(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "t"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / name).write_bytes(HISTORY[name])
    assert run(cfg_for(tmp_path), ClusterEnv()) == EXIT_OK
    (aside,) = run_dir.glob("old-*")
    assert (aside / name).read_bytes() == HISTORY[name]
    moved = [line for line in capsys.readouterr().out.splitlines() if "the previous run was moved to" in line]
    assert len(moved) == 1 and "no checkpoint of it is left" in moved[0] and str(aside) in moved[0]
    # The new run is whole beside it: its own records from update 1.
    assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl") if "loss" in r][-1] == 3


@pytest.mark.parametrize(
    "chain", [b"", b"{not json", b'{"hops": 3}'], ids=["empty", "garbage", "wrong-shape"]
)
def test_a_damaged_chain_with_history_and_no_checkpoint_loses_nothing(tmp_path: Path, chain: bytes) -> None:
    run_dir = tmp_path / "t"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "chain.json").write_bytes(chain)
    (run_dir / "metrics.jsonl").write_bytes(HISTORY["metrics.jsonl"])
    assert run(cfg_for(tmp_path), ClusterEnv()) == EXIT_OK
    assert kept_copies(run_dir, chain) if chain else list(run_dir.rglob("chain.json.bad-*"))
    (aside,) = run_dir.glob("old-*")
    assert (aside / "metrics.jsonl").read_bytes() == HISTORY["metrics.jsonl"]


def test_a_finished_run_whose_checkpoints_and_chain_are_gone_keeps_its_records(tmp_path: Path) -> None:
    assert run(cfg_for(tmp_path, "train.total_updates=4"), ClusterEnv()) == EXIT_OK
    run_dir = tmp_path / "t"
    for path in (run_dir / "checkpoints").iterdir():
        path.unlink()
    (run_dir / "chain.json").unlink()
    old = {n: (run_dir / n).read_bytes() for n in ("metrics.jsonl", "summary.json", "training.log")}
    assert run(cfg_for(tmp_path, "train.total_updates=2"), ClusterEnv()) == EXIT_OK
    (aside,) = run_dir.glob("old-*")
    assert {n: (aside / n).read_bytes() for n in old} == old
    assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl") if "loss" in r] == [
        2
    ]  # the new run's own


def test_a_bad_files_list_alone_is_not_a_run_to_move_aside(tmp_path: Path) -> None:
    """bad_files.txt is written by a start's own data index before it decides how to resume: alone it is no
    earlier run (a fresh start in an empty folder that skips a bad file must not move its own list away)."""
    run_dir = tmp_path / "t"
    run_dir.mkdir()
    (run_dir / "bad_files.txt").write_text("gone.parquet\t404\n")
    assert run(cfg_for(tmp_path), ClusterEnv()) == EXIT_OK
    assert not list(run_dir.glob("old-*"))
    assert (run_dir / "bad_files.txt").read_text() == "gone.parquet\t404\n"
