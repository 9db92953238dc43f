"""Every form of checkpoint.resume through the CLI: auto is tested elsewhere; latest, best, step_N (going back
once, bit-exact), a run folder and a file."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import hpctrain

RUN = (
    "train.total_updates=6",
    "checkpoint.every=2",
    "train.eval_every=2",
    "checkpoint.keep_last=5",
    "logging.gpu_every_seconds=0",
)


def sha(out: str) -> str:
    return out.rsplit("params_sha256=", 1)[1].split()[0]


def one_line_error(done, text: str) -> None:  # type: ignore[no-untyped-def]
    assert done.code == 2 and len(done.err.strip().splitlines()) == 1, done.err
    assert text in done.err, done.err


def test_resume_forms(tmp_path: Path) -> None:
    first = hpctrain("train", *RUN, cwd=tmp_path)
    assert first.code == 0, first.err
    checkpoints = tmp_path / "logs" / "debug" / "checkpoints"

    # step_N goes back to that update and, as the run is deterministic, ends where the first run ended
    back = hpctrain("train", *RUN, "checkpoint.resume=step_2", cwd=tmp_path)
    assert back.code == 0, back.err
    assert f"went back to {Path('logs/debug/checkpoints/step_00000002.pt')}" in back.out
    assert "(checkpoint.resume=step_2) at update 2" in back.out
    assert sha(back.out) == sha(first.out)
    # ... once: the same setting on the next hop (a requeue) continues the run
    again = hpctrain("train", *RUN, "checkpoint.resume=step_2", cwd=tmp_path)
    assert again.code == 0 and "already finished at update 6" in again.out, again.out + again.err

    one_line_error(
        hpctrain("train", *RUN, "checkpoint.resume=step_7", cwd=tmp_path),
        "checkpoint.resume=step_7: no step_00000007.pt in",
    )
    best = hpctrain("train", *RUN, "checkpoint.resume=best", cwd=tmp_path)
    assert best.code == 0 and "went back to" in best.out and "best.pt" in best.out, best.out + best.err

    # latest: continue, but never start afresh
    one_line_error(
        hpctrain("train", *RUN, "run.name=other", "checkpoint.resume=latest", cwd=tmp_path),
        "checkpoint.resume=latest: " + str(Path("logs/other/checkpoints")) + " holds no checkpoint",
    )
    latest = hpctrain("train", *RUN, "checkpoint.resume=latest", cwd=tmp_path)
    assert latest.code == 0 and "already finished at update 6" in latest.out, latest.out + latest.err

    # another run's folder (its latest checkpoint) or one of its files starts a new run from it
    # (a finished run's final checkpoint restored whole needs updates left to train: tests/train/test_restart_finished.py)
    folder = hpctrain(
        "train",
        *RUN,
        "run.name=from-folder",
        "checkpoint.resume=logs/debug",
        "train.total_updates=8",
        cwd=tmp_path,
    )
    assert folder.code == 0 and "restored everything from logs/debug at update 6" in folder.out, folder.err
    given = checkpoints / "step_00000004.pt"
    file = hpctrain("train", *RUN, "run.name=from-file", f"checkpoint.resume={given}", cwd=tmp_path)
    assert file.code == 0 and "at update 4" in file.out, file.err
    assert sha(file.out) == sha(first.out)


def test_checkpoints_without_their_sidecar_are_never_loaded(tmp_path: Path) -> None:
    """Issue 29: a step file whose sidecar is gone and with a bit flipped gave other weights, exit 0; best.pt
    without best.json was used by checkpoint.resume=best."""
    reference = hpctrain("train", *RUN, "run.name=ref", cwd=tmp_path)
    assert reference.code == 0, reference.err
    first = hpctrain("train", *RUN, cwd=tmp_path)
    assert first.code == 0, first.err
    checkpoints = tmp_path / "logs" / "debug" / "checkpoints"
    assert (checkpoints / "latest").read_text().strip() == "step_00000006.pt"

    # best.pt without best.json: refused by resume=best (one line naming it), nothing changed
    (checkpoints / "best.json").unlink()
    one_line_error(
        hpctrain("train", *RUN, "checkpoint.resume=best", cwd=tmp_path),
        "checkpoint.resume=best: cannot be used: has no best.json with its SHA-256",
    )
    assert not (tmp_path / "logs" / "debug" / "resume_applied.json").exists()

    # the newest step file without its sidecar, a bit flipped: skipped for update 4 (said in one line), and
    # updates 5-6 done again give the very weights of the run never damaged
    (checkpoints / "step_00000006.json").unlink()
    data = bytearray((checkpoints / "step_00000006.pt").read_bytes())
    data[len(data) * 3 // 5] ^= 0x10
    (checkpoints / "step_00000006.pt").write_bytes(bytes(data))
    again = hpctrain("train", *RUN, cwd=tmp_path)
    assert again.code == 0, again.err
    skipped = [line for line in again.err.splitlines() if "step_00000006.pt" in line]
    assert len(skipped) == 1 and "has no step_00000006.json with its SHA-256" in skipped[0], again.err
    assert f"resumed from {Path('logs/debug/checkpoints/step_00000004.pt')}" in again.out, again.out
    assert sha(again.out) == sha(reference.out) == sha(first.out)


def test_a_rewind_in_a_run_without_checkpoints_says_so(tmp_path: Path) -> None:
    # it was "(it holds: nothing); give one of those, latest or auto"
    one_line_error(
        hpctrain("train", *RUN, "checkpoint.resume=best", cwd=tmp_path),
        "checkpoint.resume=best: no best.pt in "
        + str(Path("logs/debug/checkpoints"))
        + ", which holds no checkpoint (auto starts afresh)",
    )
