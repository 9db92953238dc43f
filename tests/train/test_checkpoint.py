"""The commit protocol: atomic files, `latest` moved last, pruning, fallbacks, a SIGKILL during a save."""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from hpctrain.cli import main as cli_main
from hpctrain.errors import RunError, UserError
from hpctrain.train.checkpoint import CheckpointStore, load_verified, locate, strip_prefixes
from tests.conftest import clean_env, hpctrain, save_pause


def fake_state(value: float) -> dict:
    return {
        "format": 1,
        "modules": {"model": {"w": torch.full((3,), value)}},
        "counters": {"step": int(value)},
    }


def test_save_moves_latest_and_prunes(tmp_path: Path):
    store = CheckpointStore(tmp_path, keep_last=2)
    for step in (1, 2, 3):
        store.save(fake_state(step), step)
    assert (tmp_path / "latest").read_text().strip() == "step_00000003.pt"
    assert sorted(p.name for p in tmp_path.glob("step_*.pt")) == ["step_00000002.pt", "step_00000003.pt"]
    state, path = store.load_latest()
    assert path.name == "step_00000003.pt" and state["counters"]["step"] == 3
    store.save(fake_state(4), 4, best=True)
    assert load_verified(tmp_path / "best.pt")["counters"]["step"] == 4


def test_corrupt_latest_falls_back_to_previous(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    store = CheckpointStore(tmp_path, keep_last=3)
    store.save(fake_state(1), 1)
    store.save(fake_state(2), 2)
    newest = tmp_path / "step_00000002.pt"
    newest.write_bytes(newest.read_bytes()[:100])  # truncated on disk
    with caplog.at_level(logging.WARNING):
        state, path = store.load_latest()
    assert path.name == "step_00000001.pt" and state["counters"]["step"] == 1
    assert "step_00000002.pt" in caplog.text


def test_garbage_without_sidecar_is_skipped(tmp_path: Path):
    store = CheckpointStore(tmp_path, keep_last=3)
    store.save(fake_state(1), 1)
    (tmp_path / "step_00000009.pt").write_bytes(b"not a checkpoint")
    state, _ = store.load_latest()
    assert state["counters"]["step"] == 1


class _Code:
    def __reduce__(self):
        return (os.system, ("true",))


def test_a_checkpoint_holding_objects_is_refused_saying_so(tmp_path: Path, capsys):
    """Code (a pickled call) or any other object than tensors and plain values (a NumPy array): every way a
    checkpoint is read says the file holds objects other than tensors, and never passes on torch's advice to
    load it with weights_only=False (how someone else's file in a shared folder would run its code as ours)."""
    for n, payload in enumerate((_Code(), np.zeros(3))):
        store = CheckpointStore(tmp_path / f"run{n}" / "checkpoints", keep_last=2)
        store.save({**fake_state(1), "x": payload}, 1)  # its sidecar verifies: only the content is wrong
        path = store.path_for(1)
        lines = []
        with pytest.raises(UserError) as named:  # a file named (checkpoint.resume=FILE, sample FILE)
            load_verified(path)
        lines.append(str(named.value))
        with pytest.raises(RunError) as found:  # a run folder's own (a resume)
            store.load_latest()
        lines.append(str(found.value))
        assert cli_main(["export", str(path), "--out", str(tmp_path / f"out{n}")]) == 2  # a verb
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1
        lines.append(err)
        for line in lines:
            assert "holds objects other than tensors" in line and "refuses to load" in line, line
            assert "weights_only" not in line and "trust" not in line, line
        assert not (tmp_path / f"out{n}").exists()


def test_an_export_whose_network_holds_objects_is_refused_saying_so(tmp_path: Path) -> None:
    """An export's network file that holds code, with its hash recorded as if the export wrote it (someone wrote
    objects there on purpose): loading the export names the object and refuses, as a checkpoint's read does."""
    import io

    from hpctrain.train.exported import read_export, write_export

    for n, payload in enumerate((_Code(), np.zeros(3))):
        buffer = io.BytesIO()
        torch.save({"weight": torch.zeros(2), "x": payload}, buffer)
        out = tmp_path / f"export{n}"
        files = {"model.pt": buffer.getvalue(), "config.yaml": b"model: {type: mlp}\n"}
        write_export(out, files, {"networks": {"model": {"file": "model.pt"}}, "step": 1}, lambda meta: "")
        with pytest.raises(UserError) as refused:
            read_export(out)
        line = str(refused.value)
        assert line.startswith(f"{out / 'model.pt'}: it holds ") and "refuses to load" in line, line
        assert "weights_only" not in line and "trust" not in line and "\n" not in line, line
    assert "(numpy." in line  # the object torch named


def test_prefixes_from_ddp_and_compile_are_accepted():
    state = {"module.net.0.weight": 1, "_orig_mod.module.net.0.bias": 2, "net.1.weight": 3}
    assert strip_prefixes(state) == {"net.0.weight": 1, "net.0.bias": 2, "net.1.weight": 3}
    model = torch.nn.Linear(2, 2)
    ddp_like = {f"module.{k}": v for k, v in model.state_dict().items()}
    torch.nn.Linear(2, 2).load_state_dict(strip_prefixes(ddp_like))


def test_sigkill_during_save_never_becomes_latest(tmp_path: Path):
    """Kill the process while its second checkpoint is written but not committed; resume from the first."""
    args = [
        sys.executable,
        "-m",
        "hpctrain",
        "train",
        "run.name=k",
        "run.out_dir=out",
        "train.total_updates=60",
        "checkpoint.every=20",
        "train.eval_every=0",
        "logging.log_every=10",
    ]
    env = clean_env(**save_pause(30))
    proc = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    folder = tmp_path / "out" / "k" / "checkpoints"
    deadline = time.time() + 240
    try:
        # The first save pauses too: let it through by waiting for a temp file, then for step 20 to commit.
        while time.time() < deadline and not list(folder.glob(".step_00000020.pt.tmp-*")):
            time.sleep(0.05)
        assert list(folder.glob(".step_00000020.pt.tmp-*")), "the save never started"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    # Killed while the very first checkpoint was half-written: there is no latest, and no step file.
    assert not (folder / "latest").exists()
    assert not (folder / "step_00000020.pt").exists()
    # A second run commits step 20, then is killed while writing step 40.
    proc = subprocess.Popen(
        args,
        cwd=tmp_path,
        env=clean_env(**save_pause(3)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 240
        while time.time() < deadline and not list(folder.glob(".step_00000040.pt.tmp-*")):
            time.sleep(0.05)
        assert list(folder.glob(".step_00000040.pt.tmp-*"))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (folder / "latest").read_text().strip() == "step_00000020.pt"
    assert load_verified(folder / "step_00000020.pt") is not None
    # The same command resumes from step 20, cleans the half-written file, and finishes.
    done = hpctrain(*args[3:], cwd=tmp_path)
    assert done.code == 0, done.err
    assert "resumed from" in done.out and "step_00000020.pt" in done.out
    assert not list(folder.glob(".*.tmp-*"))
    assert json.loads((tmp_path / "out" / "k" / "summary.json").read_text())["step"] == 60


class Killed(Exception):
    """Stands for a SIGKILL in the middle of a save (nothing after it runs)."""


def test_saving_a_step_again_keeps_it_loadable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from hpctrain.errors import RunError
    from hpctrain.train import checkpoint

    store = CheckpointStore(tmp_path, keep_last=1)
    store.save(fake_state(5), 5)
    store.save(fake_state(5), 5, best=True)  # e.g. the final save after a periodic one at the same step
    state, path = store.load_latest()
    assert path.name == "step_00000005.pt" and state["counters"]["step"] == 5
    # Killed between the new sidecar and the new bytes of the only checkpoint: the old bytes still verify.
    real = checkpoint.atomic_write_bytes

    def killed_at_the_step_file(target: Path, data: bytes) -> None:
        if target.name.startswith("step_"):
            raise Killed
        real(target, data)

    monkeypatch.setattr(checkpoint, "atomic_write_bytes", killed_at_the_step_file)
    again = {**fake_state(5), "modules": {"model": {"w": torch.full((3,), 7.0)}}}
    with pytest.raises(Killed):
        CheckpointStore(tmp_path, keep_last=1).save(again, 5)
    state, _ = CheckpointStore(tmp_path, keep_last=1).load_latest()
    assert state["modules"]["model"]["w"].tolist() == [5.0, 5.0, 5.0]
    monkeypatch.setattr(checkpoint, "atomic_write_bytes", real)
    CheckpointStore(tmp_path, keep_last=1).save(again, 5)
    state, _ = CheckpointStore(tmp_path, keep_last=1).load_latest()
    assert state["modules"]["model"]["w"].tolist() == [7.0, 7.0, 7.0]
    # Its sidecar names only the new bytes now, and without its sidecar it is never loaded.
    assert set(json.loads((tmp_path / "step_00000005.json").read_text())) == {
        "step",
        "sha256",
        "seq",
        "saved",
    }
    (tmp_path / "step_00000005.json").unlink()
    with pytest.raises(RunError, match=r"step_00000005.pt: has no step_00000005.json with its SHA-256"):
        store.load_latest()


def flip_bit(path: Path, at: float = 0.6) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0x10
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("flipped", [False, True])
def test_a_step_file_without_its_sidecar_is_never_loaded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, flipped: bool
):
    """No hash, no load: the previous verified checkpoint is used, and the skipped file named in one line."""
    store = CheckpointStore(tmp_path, keep_last=3)
    store.save(fake_state(1), 1)
    store.save(fake_state(2), 2)
    (tmp_path / "step_00000002.json").unlink()
    if flipped:
        flip_bit(tmp_path / "step_00000002.pt")
    with caplog.at_level(logging.WARNING):
        state, path = store.load_latest()
    assert path.name == "step_00000001.pt" and state["counters"]["step"] == 1
    skipped = [r.getMessage() for r in caplog.records if "step_00000002.pt" in r.getMessage()]
    assert len(skipped) == 1 and "has no step_00000002.json" in skipped[0], caplog.text


def test_a_kill_between_sidecar_and_file_never_leaves_an_unverifiable_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The very first save killed after its sidecar: no step file (a fresh start); a later one: the previous."""
    from hpctrain.train import checkpoint

    real = checkpoint.atomic_write_bytes

    def killed(target: Path, data: bytes) -> None:
        raise Killed

    monkeypatch.setattr(checkpoint, "atomic_write_bytes", killed)
    with pytest.raises(Killed):
        CheckpointStore(tmp_path, keep_last=2).save(fake_state(1), 1)
    assert not list(tmp_path.glob("*.pt")) and CheckpointStore(tmp_path, keep_last=2).load_latest() is None
    monkeypatch.setattr(checkpoint, "atomic_write_bytes", real)
    CheckpointStore(tmp_path, keep_last=2).save(fake_state(1), 1)
    monkeypatch.setattr(checkpoint, "atomic_write_bytes", killed)
    with pytest.raises(Killed):
        CheckpointStore(tmp_path, keep_last=2).save(fake_state(2), 2, best=True)
    state, path = CheckpointStore(tmp_path, keep_last=2).load_latest()
    assert path.name == "step_00000001.pt" and state["counters"]["step"] == 1
    # The next save tidies the sidecars whose files never came.
    monkeypatch.setattr(checkpoint, "atomic_write_bytes", real)
    CheckpointStore(tmp_path, keep_last=2).save(fake_state(3), 3)
    assert sorted(p.name for p in tmp_path.glob("step_*")) == [
        "step_00000001.json",
        "step_00000001.pt",
        "step_00000003.json",
        "step_00000003.pt",
    ]


def test_a_named_file_without_its_sidecar_loads_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """A file the user names (sample FILE, checkpoint.resume=FILE) may have been copied alone: loaded, said."""
    torch.save(fake_state(3), tmp_path / "weights.pt")
    with caplog.at_level(logging.WARNING):
        assert load_verified(tmp_path / "weights.pt")["counters"]["step"] == 3
    assert "has no weights.json: its SHA-256 cannot be checked" in caplog.text
    # a named file that is no checkpoint at all: one reason, and no warning about a hash it never needed
    caplog.clear()
    (tmp_path / "notes.pt").write_text("junk\n")
    with caplog.at_level(logging.WARNING), pytest.raises(UserError) as refused:
        load_verified(tmp_path / "notes.pt")
    assert str(refused.value) == (
        f"{tmp_path / 'notes.pt'}: not a readable hpctrain checkpoint (not a checkpoint: not the zip archive "
        "torch.save writes)"
    )
    assert caplog.text == ""


def test_a_model_verb_on_a_folder_of_damaged_checkpoints_is_a_user_line(tmp_path: Path):
    """`hpctrain sample|evaluate RUN` where every checkpoint is damaged: one line (exit 2, as export), naming
    each file's reason, without training's advice to start afresh (checkpoint.resume means nothing there)."""
    store = CheckpointStore(tmp_path / "checkpoints", keep_last=2)
    store.save(fake_state(1), 1)
    store.save(fake_state(2), 2)
    for file in (tmp_path / "checkpoints").glob("step_*.pt"):
        file.write_bytes(file.read_bytes()[:100])
    with pytest.raises(UserError) as refused:
        locate(tmp_path)
    assert str(refused.value).startswith(f"no checkpoint in {tmp_path / 'checkpoints'} can be used (")
    assert "step_00000002.pt: its SHA-256 does not match" in str(refused.value)
    assert "resume=never" not in str(refused.value)


def test_a_best_save_is_whole_before_the_step_file_and_latest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """best.pt is part of the commit: a kill before `latest` moves resumes from the previous checkpoint (which
    saves best again), and a step file that exists always has its best.pt and best.json beside it."""
    store = CheckpointStore(tmp_path, keep_last=2)
    store.save(fake_state(1), 1)
    renamed: list[str] = []
    real = os.replace

    def replace(src, dst, *args, **kwargs):
        renamed.append(Path(dst).name)
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    store.save(fake_state(2), 2, best=True)
    assert renamed == ["best.json", "best.pt", "step_00000002.json", "step_00000002.pt", "latest"]
    # A best.pt replaced: the sidecar accepts the old bytes too until the new ones are in place.
    renamed.clear()
    store.save(fake_state(3), 3, best=True)
    assert renamed == [
        "best.json",
        "best.pt",
        "best.json",
        "step_00000003.json",
        "step_00000003.pt",
        "latest",
    ]


def full_state(value: float) -> dict:
    return {**fake_state(value), "optimizers": {}, "rng": [], "data": {}}


def test_best_without_its_sidecar_is_never_a_fallback(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    from hpctrain.errors import RunError

    store = CheckpointStore(tmp_path, keep_last=2)
    store.save(full_state(4), 4, best=True)
    for name in ("latest", "step_00000004.pt", "step_00000004.json"):
        (tmp_path / name).unlink()
    # Its hash is there: the last fallback when no step checkpoint can be read (said in a warning).
    (tmp_path / "step_00000002.pt").write_bytes(b"cut short")
    with caplog.at_level(logging.WARNING):
        state, path = store.load_latest()
    assert (
        path.name == "best.pt" and state["counters"]["step"] == 4 and "resuming from best.pt" in caplog.text
    )
    # Without best.json (removed; or cut short by an older hpctrain) it is never used: named among the unusable
    # files ...
    (tmp_path / "best.json").unlink()
    with pytest.raises(RunError, match=r"best.pt: has no best.json with its SHA-256"):
        store.load_latest()
    # ... and alone it is no checkpoint at all: nothing was committed, the run starts (and saves it) again.
    (tmp_path / "step_00000002.pt").unlink()
    assert store.load_latest() is None


def test_transient_read_errors_are_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    from hpctrain.train import checkpoint

    store = CheckpointStore(tmp_path, keep_last=3)
    store.save(fake_state(1), 1)
    store.save(fake_state(2), 2)
    monkeypatch.setattr(checkpoint, "READ_RETRY_DELAYS", (0.01, 0.01))
    real = Path.read_bytes
    failures = {"left": 2}

    def flaky(self: Path) -> bytes:
        if self.name == "step_00000002.pt" and failures["left"]:
            failures["left"] -= 1
            raise OSError(errno.EIO, "Input/output error")
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", flaky)
    with caplog.at_level(logging.WARNING):
        state, path = store.load_latest()
    assert path.name == "step_00000002.pt" and state["counters"]["step"] == 2  # not the older one
    assert caplog.text.count("Input/output error); trying again") == 2
    # An error that persists: the previous checkpoint, with the reason in the warning.
    failures["left"] = 10
    state, path = store.load_latest()
    assert path.name == "step_00000001.pt"
    assert "step_00000002.pt: cannot be read (Input/output error)" in caplog.text
