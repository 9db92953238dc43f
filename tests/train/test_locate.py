"""`locate(path, which)`: the one way resume, sample, evaluate, export and `hpctrain.load` find a checkpoint."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import torch

from hpctrain.train import checkpoint
from hpctrain.train.checkpoint import CheckpointStore, NotLocated, locate


def _state(step: int) -> dict:
    return {
        "format": 1,
        "modules": {"model": {"w": torch.full((3,), float(step))}},
        "counters": {"step": step},
    }


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A run folder with step_1, step_2 (also best) and step_3 (latest)."""
    store = CheckpointStore(tmp_path / "run" / "checkpoints", keep_last=5)
    for step in (1, 2, 3):
        store.save(_state(step), step, best=step == 2)
    return tmp_path / "run"


def test_every_form_finds_its_checkpoint(run: Path) -> None:
    ckpts = run / "checkpoints"
    cases = {
        (run, "latest"): ("step_00000003.pt", 3),
        (ckpts, "latest"): ("step_00000003.pt", 3),
        (run, "best"): ("best.pt", 2),
        (ckpts, "step_1"): ("step_00000001.pt", 1),
        (run, "step_0002"): ("step_00000002.pt", 2),
        (ckpts / "step_00000001.pt", "latest"): ("step_00000001.pt", 1),
        (ckpts / "latest", "latest"): ("step_00000003.pt", 3),  # the pointer: the file it names
    }
    for (path, which), (name, step) in cases.items():
        found = locate(path, which)
        assert (found.file, found.run_dir, found.state["counters"]["step"]) == (ckpts / name, run, step)


@pytest.mark.parametrize(
    ("where", "which", "reason", "line"),
    [
        ("nope", "latest", "missing", "{tmp}/nope: no such run folder or checkpoint file"),
        ("nope", "best", "missing", "{tmp}/nope: no such run folder; which=best needs the run folder"),
        (
            "run/checkpoints/step_00000001.pt",
            "step_2",
            "missing",
            "{tmp}/run/checkpoints/step_00000001.pt: a checkpoint file; which=step_2 needs the run folder",
        ),
        (
            "run",
            "step_7",
            "missing",
            "{tmp}/run: no step_00000007.pt in {tmp}/run/checkpoints (it holds: step_1, step_2, step_3, best)",
        ),
        ("run", "last", "which", "which='last': choose latest, best or step_N (e.g. step_200)"),
        (
            "empty",
            "latest",
            "empty",
            "{tmp}/empty: no readable checkpoint (expected <run folder>/checkpoints/",
        ),
    ],
)
def test_what_is_not_there_is_one_line(
    run: Path, tmp_path: Path, where: str, which: str, reason: str, line: str
) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(NotLocated) as refused:
        locate(tmp_path / where, which)
    assert refused.value.reason == reason
    assert str(refused.value).startswith(line.format(tmp=tmp_path)), str(refused.value)


def test_a_run_folders_files_are_loaded_only_verified(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ckpts = run / "checkpoints"
    monkeypatch.setattr(checkpoint, "READ_RETRY_DELAYS", (0.0, 0.0))
    # a flipped bit: refused by name, by which= and as the folder's latest (which falls back to step_2)
    data = bytearray((ckpts / "step_00000003.pt").read_bytes())
    data[len(data) // 2] ^= 1
    (ckpts / "step_00000003.pt").write_bytes(bytes(data))
    for path, which in ((ckpts / "step_00000003.pt", "latest"), (run, "step_3")):
        with pytest.raises(
            NotLocated, match=r"step_00000003\.pt: not a readable hpctrain checkpoint \(its SHA-256 "
        ):
            locate(path, which)
    assert locate(run).file.name == "step_00000002.pt"
    # no sidecar: a run folder's file is refused; the same file copied alone loads, with a warning
    (ckpts / "step_00000001.json").unlink()
    (ckpts / "best.json").unlink()
    for path, which, side in (
        (ckpts / "step_00000001.pt", "latest", "step_00000001.json"),
        (run, "step_1", "step_00000001.json"),
        (run, "best", "best.json"),
    ):
        with pytest.raises(NotLocated) as refused:
            locate(path, which)
        assert refused.value.reason == "unusable" and refused.value.why.startswith(
            f"has no {side} with its SHA-256"
        )
    alone = tmp_path / "alone.pt"
    shutil.copy(ckpts / "step_00000001.pt", alone)
    with caplog.at_level(logging.WARNING):
        found = locate(alone)
    assert (found.state["counters"]["step"], found.run_dir) == (1, None)
    assert "alone.json: its SHA-256 cannot be checked" in caplog.text


def test_a_sidecar_or_an_export_named_for_a_checkpoint_says_what_it_is(run: Path, tmp_path: Path) -> None:
    # a sidecar is no checkpoint (it was taken as its own sidecar: "its SHA-256 does not match" itself)
    with pytest.raises(NotLocated) as refused:
        locate(run / "checkpoints" / "step_00000001.json")
    assert refused.value.why == "not a checkpoint: not the zip archive torch.save writes"
    # an export is no checkpoint to resume from (it was "no checkpoint in this folder")
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "export.json").write_text("{}")
    with pytest.raises(NotLocated) as refused:
        locate(tmp_path / "export", exports=False)
    assert refused.value.reason == "unusable" and "an export folder" in str(refused.value)


def test_a_latest_pointer_to_a_missing_file_names_it(tmp_path: Path) -> None:
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest").write_text("step_00000099.pt\n")
    with pytest.raises(NotLocated) as refused:
        locate(tmp_path / "checkpoints" / "latest")
    assert refused.value.why.endswith("names step_00000099.pt, which is not there"), refused.value.why


def test_a_cut_checkpoint_is_said_in_one_sentence(run: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.pt"
    cut.write_bytes((run / "checkpoints" / "step_00000001.pt").read_bytes()[:1000])
    with pytest.raises(NotLocated) as refused:
        locate(cut)
    assert refused.value.why.startswith("unreadable (PytorchStreamReader failed reading zip archive")
    assert "internal miniz error" not in refused.value.why, refused.value.why
