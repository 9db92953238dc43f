"""`hpctrain tb merge`: modes and filters."""

from __future__ import annotations

import json
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


def _merge(out: Path, src: Path, *extra: str) -> int:
    return main(["tb", "merge", "--out", str(out), "--src-root", str(src), *extra])


def test_merge_never_writes_through_a_planted_link(tmp_path: Path, capsys) -> None:
    """A link planted as the record (`.merged`), as a folder on a run's way, or as a run's own name: the record
    and the run's link replace a link at their name, a link on the way is refused (nothing changed), and the
    file or folder a link points at stays as it was."""
    src, out, victim = tmp_path / "src", tmp_path / "all", tmp_path / "victim"
    _runs(src)
    victim.mkdir()
    (victim / "keys").write_text("precious\n")
    out.mkdir()
    (out / ".merged").symlink_to(victim / "keys")
    (out / "manual").symlink_to(victim)  # at a run's own name: replaced by the run's link
    assert _merge(out, src) == 0
    assert (victim / "keys").read_text() == "precious\n" and sorted(victim.iterdir()) == [victim / "keys"]
    assert (
        not (out / ".merged").is_symlink() and json.loads((out / ".merged").read_text())["mode"] == "symlink"
    )
    assert (out / "manual").resolve() == (src / "manual").resolve()
    capsys.readouterr()
    for mode in ("symlink", "copy"):
        other = tmp_path / f"other-{mode}"
        other.mkdir()
        (other / "exp_a").symlink_to(victim)  # on the way to exp_a/<run>
        assert _merge(other, src, "--mode", mode) == 2
        err = capsys.readouterr().err
        assert (
            "exp_a is a symbolic link: tb merge never writes through one" in err
            and len(err.splitlines()) == 1
        )
        assert sorted(victim.iterdir()) == [victim / "keys"] and sorted(other.iterdir()) == [other / "exp_a"]


def test_copy_mode_copies_no_link_out_of_the_source_tree(tmp_path: Path) -> None:
    """A `.env` linked into a run folder, an event file's name on a link, a run folder that is a link: nothing
    behind a link reaches the merged tree."""
    src, secret = tmp_path / "src", tmp_path / "secret"
    _runs(src)
    secret.mkdir()
    (secret / ".env").write_text("WANDB_API_KEY=hpctrainTestKey\n")
    (secret / "events.out.tfevents.1.host").write_text("not ours")
    run = src / "exp_a" / "20260101-100000"
    (run / ".env").symlink_to(secret / ".env")
    (run / "events.out.tfevents.2.evil").symlink_to(secret / ".env")
    (src / "exp_c").symlink_to(secret)  # a "run" reached through a link: outside the tree
    out = tmp_path / "copy"
    assert _merge(out, src, "--mode", "copy") == 0
    copied = [p for p in out.rglob("*") if p.is_file()]
    assert not any(p.is_symlink() for p in out.rglob("*"))
    assert not any(b"hpctrainTestKey" in p.read_bytes() or p.read_bytes() == b"not ours" for p in copied)
    assert not (out / "exp_c").exists()
    assert sorted(p.name for p in (out / "exp_a" / "20260101-100000").iterdir()) == [
        p.name for p in run.glob("events.out.tfevents.*") if not p.is_symlink()
    ]


def test_merge_never_removes_or_fills_a_folder_it_did_not_make(tmp_path: Path, capsys) -> None:
    """A folder of --out named like a run (a user's notes/ with a thesis in it), or a file there: refused in one
    line, in both modes, nothing changed. What an earlier merge made (its record) is replaced as before: a copy
    by a link, a link by a copy."""
    src, out = tmp_path / "src", tmp_path / "all"
    _runs(src)
    (src / "notes" / "events.out.tfevents.1.host").write_bytes(b"")  # a run named notes
    (out / "notes").mkdir(parents=True)
    (out / "notes" / "thesis.tex").write_text("four years\n")
    (out / "manual").write_text("a file of mine\n")
    for mode in ("symlink", "copy"):
        assert _merge(out, src, "--mode", mode) == 2
        err = capsys.readouterr().err
        assert (
            "is a folder that tb merge did not make" in err or "is a file that tb merge did not make" in err
        )
        assert "nothing was changed" in err and len(err.strip().splitlines()) == 1
    assert (out / "notes" / "thesis.tex").read_text() == "four years\n"
    assert (out / "manual").read_text() == "a file of mine\n"
    assert sorted(p.name for p in out.iterdir()) == ["manual", "notes"]
    fresh = tmp_path / "fresh"
    assert _merge(fresh, src, "--mode", "copy") == 0
    assert _merge(fresh, src) == 0  # its own copies become links
    assert (fresh / "notes").is_symlink() and (fresh / "exp_a" / "20260105-105330").is_symlink()
    assert _merge(fresh, src, "--mode", "copy") == 0  # and its links copies again
    assert not (fresh / "notes").is_symlink() and (fresh / "notes" / "events.out.tfevents.1.host").is_file()
    (fresh / "notes" / "mine.txt").write_text("added by hand\n")
    assert _merge(fresh, src) == 2  # a copy that now holds a file of the user's: kept
    assert "holds files besides the event files" in capsys.readouterr().err
    assert (fresh / "notes" / "mine.txt").read_text() == "added by hand\n"
