"""`hpctrain tb merge`: modes and filters."""

from __future__ import annotations

import os
from pathlib import Path

from hpctrain.cli import main
from hpctrain.track.tensorboard import TensorBoardTracker


def _runs(root: Path) -> None:
    for name in ("exp_a/20260101-100000", "exp_a/20260105-105330", "exp_b/20260110-080000", "manual"):
        tracker = TensorBoardTracker(root, name, resume_step=None)
        tracker.log_scalars(1, {"loss": 1.0})
        tracker.close()
    (root / "notes").mkdir()  # no event files: not a run
    old = 1_600_000_000  # 2020: "manual" has no timestamp in its name, its folder time counts
    os.utime(root / "manual", (old, old))


def _listing(dst: Path) -> set[str]:
    return {
        p.relative_to(dst).as_posix() for p in dst.rglob("*") if p.name.startswith("20") or p.name == "manual"
    }


def test_symlink_mode_links_every_run(tmp_path: Path, capsys) -> None:
    _runs(tmp_path / "src")
    assert main(["tb", "merge", "--out", str(tmp_path / "all"), "--src-root", str(tmp_path / "src")]) == 0
    assert _listing(tmp_path / "all") == {
        "exp_a/20260101-100000",
        "exp_a/20260105-105330",
        "exp_b/20260110-080000",
        "manual",
    }
    link = tmp_path / "all" / "exp_b" / "20260110-080000"
    assert link.is_symlink() and link.resolve() == (tmp_path / "src" / "exp_b" / "20260110-080000").resolve()
    assert "4 runs" in capsys.readouterr().out
    # Merging again replaces the links instead of failing.
    assert main(["tb", "merge", "--out", str(tmp_path / "all"), "--src-root", str(tmp_path / "src")]) == 0


def test_copy_mode_and_filters(tmp_path: Path) -> None:
    _runs(tmp_path / "src")
    dst = tmp_path / "sel"
    code = main(
        [
            "tb",
            "merge",
            "--dst",
            str(dst),
            "--src-root",
            str(tmp_path / "src"),
            "--mode",
            "copy",
            "--since",
            "20260105-000000",
            "--match",
            "exp_",
        ]
    )
    assert code == 0
    assert _listing(dst) == {"exp_a/20260105-105330", "exp_b/20260110-080000"}
    copied = dst / "exp_a" / "20260105-105330"
    assert not copied.is_symlink() and list(copied.glob("events.out.tfevents.*"))

    dst2 = tmp_path / "glob"
    assert (
        main(["tb", "merge", "--dst", str(dst2), "--src-root", str(tmp_path / "src"), "--glob", "exp_a/*"])
        == 0
    )
    assert _listing(dst2) == {"exp_a/20260101-100000", "exp_a/20260105-105330"}


def test_bad_input_is_one_line_exit_2(tmp_path: Path, capsys) -> None:
    _runs(tmp_path / "src")
    src = str(tmp_path / "src")
    assert main(["tb", "merge", "--dst", str(tmp_path / "d"), "--src-root", src, "--since", "yesterday"]) == 2
    assert "--since" in capsys.readouterr().err
    assert main(["tb", "merge", "--dst", str(tmp_path / "d"), "--src-root", src, "--match", "(["]) == 2
    assert "--match" in capsys.readouterr().err
    assert main(["tb", "merge", "--dst", str(tmp_path / "d"), "--src-root", str(tmp_path / "nope")]) == 2
    assert main(["tb", "merge", "--dst", str(tmp_path / "src" / "x"), "--src-root", src]) == 2
