"""`hpctrain sample` / `hpctrain evaluate` go through the workload registry: a model whose workload has no such
verb is refused in one line (exit 2) that names the workloads offering it."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import hpctrain


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err[-2000:]
    return lines[0]


def test_a_workload_without_sampling_or_evaluation_says_so(tmp_path: Path) -> None:
    run = ["run.name=r", f"run.out_dir={tmp_path / 'logs'}", "train.total_updates=2", "model.hidden=[4]"]
    done = hpctrain("train", *run, cwd=tmp_path)
    assert done.code == 0, done.err[-2000:]
    folder = tmp_path / "logs" / "r"
    for verb in ("sample", "evaluate"):
        refused = hpctrain(verb, str(folder), "--n-events", "5", "--out", str(tmp_path / "x"), cwd=tmp_path)
        assert refused.code == 2, refused.err[-2000:]
        line = _one_error_line(refused.err)
        assert f"model.type='regression' (workload 'regression') has no `hpctrain {verb}`" in line, line
        offered = {"sample": "muons", "evaluate": "fields, muons"}[verb]
        assert f"offered for models of: {offered}" in line, line
        assert not (tmp_path / "x").exists()
    # Without a model: one line; --help lists each offering workload's options.
    bare = hpctrain("sample", cwd=tmp_path)
    assert bare.code == 2 and "name a run folder or a checkpoint file" in _one_error_line(bare.err)
    shown = hpctrain("evaluate", "--help", cwd=tmp_path)
    assert shown.code == 0 and "workload muons:" in shown.out and "--n-events" in shown.out, shown.out
