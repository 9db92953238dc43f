"""`hpctrain sample` / `hpctrain evaluate` go through the workload registry: a model whose workload has no such
verb is refused in one line (exit 2) that names the workloads offering it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import clean_env, hpctrain


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


# a flag's value every offering workload refuses, and what it says; "muons" and "fields" both offer evaluate
REFUSED = {
    ("evaluate", "--batch-size", "0"): "error: --batch-size must be at least 1, not 0",
    ("evaluate", "--truth", "v3"): "error: unknown truth version 'v3'; choose from v1, v2",
    (
        "evaluate",
        "--truth",
        "v2",
        "--data",
        "x",
    ): "error: --truth v2 with --data: held-out files are their own",
    ("evaluate", "--max-maps", "-1"): "error: --max-maps must be 0 (all) or positive, not -1",  # fields' own
    ("evaluate", "--bogus"): "error: hpctrain evaluate: unrecognized arguments: --bogus",
    ("sample", "--events", "0", "--out", "x.parquet"): "error: --events must be at least 1, not 0",
}


def test_a_mistyped_flag_is_one_line_before_the_checkpoint_and_torch_load(tmp_path: Path) -> None:
    """The flags are checked first, against every workload that offers the verb (the checkpoint's workload is
    known only once torch has loaded it: seconds, more on a busy machine): refused by all, one line, exit 2, no
    run folder read and torch never imported; taken by one, the checkpoint is looked for."""
    probe = "import sys\nfrom hpctrain.cli import main\nprint(main(sys.argv[1:]), 'torch' in sys.modules)"
    missing = str(tmp_path / "no-run")
    for (verb, *flags), said in REFUSED.items():
        done = subprocess.run(
            [sys.executable, "-c", probe, verb, missing, *flags],
            cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.stdout.split() == ["2", "False"], (flags, done.stdout, done.stderr[-2000:])
        assert _one_error_line(done.stderr).startswith(said), (flags, done.stderr)
    # --max-maps is fields'; --events muons': taken by one workload each, so the run folder is looked for
    for verb, flags in (("evaluate", ["--max-maps", "3"]), ("evaluate", ["--events", "5"])):
        done = subprocess.run(
            [sys.executable, "-c", probe, verb, missing, *flags],
            cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        # after its first line; a run that is not there is found so before torch loads
        assert done.stdout.split()[-2:] == ["2", "False"], (flags, done.stdout, done.stderr[-2000:])
        assert f"{missing}: no such run folder or checkpoint file" in _one_error_line(done.stderr), (
            done.stderr
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing made
