"""A run folder that is not safely ours, links planted in it, a full disk or quota, a heartbeat from the future,
the `latest` pointer given as checkpoint.resume, a torn metrics line: each is one line (or a warning), never a
traceback, and never a write through a link or into someone else's folder."""

from __future__ import annotations

import json
import logging
import os
import resource
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from hpctrain.commands.train import run
from hpctrain.errors import EXIT_OK, RunError, UserError
from hpctrain.fsutil import HOST, temp_name
from hpctrain.runtime.env import ClusterEnv
from hpctrain.track.metrics_file import MetricsFile
from hpctrain.train import runlock
from hpctrain.train.checkpoint import CheckpointStore, read_checkpoint
from tests.train.test_run_folder import cfg_for

as_root = pytest.mark.skipif(os.getuid() != 0, reason="chown to another uid needs root")


def test_a_folder_others_may_write_or_of_another_user_is_refused(tmp_path: Path) -> None:
    run_dir = tmp_path / "t"
    run_dir.mkdir()
    run_dir.chmod(0o775)
    with pytest.raises(UserError) as info:
        run(cfg_for(tmp_path, "train.total_updates=2"), ClusterEnv())
    assert f"run folder {run_dir} is writable by its group" in str(info.value)
    assert f"`chmod go-w {run_dir}`" in str(info.value) and not (run_dir / "run.lock").exists()
    run_dir.chmod(0o755)
    (run_dir / "checkpoints").mkdir(mode=0o777)
    (run_dir / "checkpoints").chmod(0o777)
    with pytest.raises(UserError, match=r"checkpoints folder .* is writable by group and others"):
        run(cfg_for(tmp_path, "train.total_updates=2"), ClusterEnv())


@as_root
def test_a_run_folder_of_another_user_is_refused(tmp_path: Path) -> None:
    run_dir = tmp_path / "t"
    run_dir.mkdir(mode=0o755)
    os.chown(run_dir, 65534, 65534)
    with pytest.raises(UserError, match=r"run folder .*/t belongs to (user \w+ \()?uid 65534\)?, not to you"):
        run(cfg_for(tmp_path, "train.total_updates=2"), ClusterEnv())
    assert list(run_dir.iterdir()) == []
    os.chown(run_dir, 0, 0)
    (run_dir / "checkpoints").mkdir(mode=0o755)
    os.chown(run_dir / "checkpoints", 65534, 65534)
    with pytest.raises(UserError, match=r"checkpoints folder .* belongs to"):
        run(cfg_for(tmp_path, "train.total_updates=2"), ClusterEnv())
    # what refuses the folder also guards the lock (a folder swapped in after the pre-flight checks)
    with pytest.raises(UserError, match="belongs to"):
        runlock.RunLock(run_dir).acquire()


# files hpctrain rewrites whole (a temporary and a rename): a link at the name is replaced, never written through
PLANTED = ("metrics.jsonl", "chain.json", "summary.json", "config.yaml", "checkpoints/step_00000004.pt")


def test_links_planted_in_a_run_folder_are_never_followed(tmp_path: Path) -> None:
    assert run(cfg_for(tmp_path, "train.total_updates=2", "checkpoint.every=1"), ClusterEnv()) == EXIT_OK
    run_dir, victim = tmp_path / "t", tmp_path / "victim.txt"
    victim.write_text("precious\n")
    for name in PLANTED:
        (run_dir / name).unlink(missing_ok=True)
        (run_dir / name).symlink_to(victim)
    temp_name(run_dir / "config.yaml").symlink_to(victim)  # our own temporary's name, planted beforehand
    log = run_dir / "training.log"
    log.unlink()
    log.symlink_to(victim)
    with pytest.raises(UserError, match=r"training.log is a symbolic link .* never writes through one"):
        run(cfg_for(tmp_path, "train.total_updates=4", "checkpoint.every=1"), ClusterEnv())
    log.unlink()
    assert run(cfg_for(tmp_path, "train.total_updates=4", "checkpoint.every=1"), ClusterEnv()) == EXIT_OK
    assert victim.read_text() == "precious\n"
    for name in PLANTED:
        assert not (run_dir / name).is_symlink() and (run_dir / name).is_file(), name


@contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    """Writes past `limit` bytes fail with EFBIG (SIGXFSZ ignored), as at a quota; restored afterwards."""
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, old_limit[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)


def test_a_full_disk_at_start_up_and_in_a_save_is_one_line(tmp_path: Path, capsys) -> None:
    # (capsys: the output is kept in memory, not in a file the limit applies to)
    with file_size_limit(200), pytest.raises(UserError) as info:
        run(cfg_for(tmp_path, "train.total_updates=2"), ClusterEnv())
    text = str(info.value)
    assert text.startswith(f"cannot write {tmp_path / 't'}/") and "File too large" in text, text
    assert "\n" not in text and not list((tmp_path / "t").glob(".*.tmp-*"))
    # in a save: the run's own one line (exit 1), the last complete checkpoint kept
    with (
        file_size_limit(20_000),
        pytest.raises(RunError, match=r"cannot write the checkpoint of update 1 into"),
    ):
        run(cfg_for(tmp_path, "train.total_updates=2", "checkpoint.every=1"), ClusterEnv())
    assert run(cfg_for(tmp_path, "train.total_updates=2", "checkpoint.every=1"), ClusterEnv()) == EXIT_OK


def test_at_every_failure_of_a_best_save_best_pt_verifies(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep_last=2)
    small = {"modules": {"w": torch.zeros(10)}}
    store.save(small, 1, best=True)
    big = {"modules": {"w": torch.ones(50_000)}}
    for limit in (100, 1_000):  # the sidecar's write fails, then best.pt's
        with file_size_limit(limit), pytest.raises(OSError):
            store.save(big, 2, best=True)
        assert torch.equal(read_checkpoint(tmp_path / "best.pt")["modules"]["w"], small["modules"]["w"]), (
            limit
        )
    store.save(big, 2, best=True)
    assert torch.equal(read_checkpoint(tmp_path / "best.pt")["modules"]["w"], big["modules"]["w"])


def test_a_heartbeat_far_in_the_future_does_not_hold_the_folder(tmp_path: Path, caplog) -> None:
    record = {"pid": 4242, "host": "node-skewed", "job_id": "9", "started": time.time(), "heartbeat": 0.0}
    record["heartbeat"] = time.time() + 60  # a clock a minute ahead: still a live holder
    (tmp_path / "run.lock").write_text(json.dumps(record))
    with pytest.raises(UserError, match="node-skewed"):
        runlock.RunLock(tmp_path, job_id="10").acquire()
    record["heartbeat"] = time.time() + 3600  # an hour ahead: no proof of life
    (tmp_path / "run.lock").write_text(json.dumps(record))
    lock = runlock.RunLock(tmp_path, job_id="10")
    with caplog.at_level(logging.WARNING):
        lock.acquire()
    lock.release()
    assert "s in the future" in caplog.text and "taking over the lock" in caplog.text


def test_the_latest_pointer_as_resume_path(tmp_path: Path) -> None:
    assert run(cfg_for(tmp_path, "train.total_updates=2"), ClusterEnv()) == EXIT_OK
    pointer = tmp_path / "t" / "checkpoints" / "latest"
    cfg = cfg_for(tmp_path / "b", f"checkpoint.resume={pointer}", "train.total_updates=3")
    assert run(cfg, ClusterEnv()) == EXIT_OK
    pointer.write_text("garbage\n")
    with pytest.raises(UserError) as info:
        run(cfg_for(tmp_path / "c", f"checkpoint.resume={pointer}"), ClusterEnv())
    assert "names no step checkpoint" in str(info.value)
    assert "give a checkpoint file (step_N.pt, best.pt), a run folder or its checkpoints folder" in str(
        info.value
    )


def test_a_torn_metrics_line_is_said(tmp_path: Path, caplog) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "loss": 0.5}\n{"step": 3, "lo')
    with caplog.at_level(logging.WARNING):
        MetricsFile(path, resume_step=2).close()
    assert "dropped 1 unreadable line (a write cut by a kill)" in caplog.text
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2]


def test_hosts_named_in_temporaries_are_ours() -> None:
    assert temp_name(Path("/x/a")).name.endswith(f"@{HOST}")


@as_root
def test_a_link_planted_as_the_run_folder_or_on_its_way_is_refused_never_followed(tmp_path: Path) -> None:
    """Another user's symbolic link named like the run in a shared run.out_dir (drwxrwsr-x), or as run.out_dir
    itself, to a folder of ours: refused before anything is written there; the same link made by the user is
    followed."""
    victim, group = tmp_path / "victim", tmp_path / "group"
    victim.mkdir(mode=0o755)
    (victim / "thesis.tex").write_text("precious\n")
    group.mkdir()
    group.chmod(0o2775)  # a group's shared folder: its members may add entries
    link = group / "t"
    link.symlink_to(victim)
    os.lchown(link, 65534, 65534)
    with pytest.raises(
        UserError, match=r"run folder .*/t: .*/t is a symbolic link made by .*65534.* follows one"
    ):
        run(cfg_for(group, "train.total_updates=2"), ClusterEnv())
    with pytest.raises(UserError, match="is a symbolic link made by"):
        runlock.RunLock(link).acquire()  # what guards the start also guards the lock
    (group / "logs").symlink_to(victim)
    os.lchown(group / "logs", 65534, 65534)
    with pytest.raises(UserError, match=r"/group/logs is a symbolic link made by"):
        run(cfg_for(group / "logs", "train.total_updates=2"), ClusterEnv())
    assert [p.name for p in victim.iterdir()] == ["thesis.tex"]
    os.lchown(link, 0, 0)  # the user's own link (a run folder kept on scratch): used
    assert run(cfg_for(group, "train.total_updates=2"), ClusterEnv()) == EXIT_OK
    assert (victim / "checkpoints" / "latest").is_file()


def test_folders_of_a_run_are_made_at_most_0750_whatever_the_umask(tmp_path: Path) -> None:
    """Under umask 000: run.out_dir and the folders above it, the run folder, checkpoints/, the folder a fresh
    start moves the old run into, TensorBoard's folder and the mirror's: 0750, never 0777."""
    out = tmp_path / "a" / "b"
    extra = [f"logging.tensorboard.dir={tmp_path / 'tb'}", f"checkpoint.mirror_to={tmp_path / 'm'}"]
    old = os.umask(0)
    try:
        assert run(cfg_for(out, "train.total_updates=2", *extra), ClusterEnv()) == EXIT_OK
        resumed = cfg_for(out, "train.total_updates=2", "checkpoint.resume=never", *extra)
        assert run(resumed, ClusterEnv()) == EXIT_OK
    finally:
        os.umask(old)
    made = [tmp_path / "a", out, out / "t", out / "t" / "checkpoints", *(out / "t").glob("old-*")]
    made += [tmp_path / "tb", *(tmp_path / "tb").iterdir(), tmp_path / "m", tmp_path / "m" / "t"]
    assert len(made) >= 9  # TensorBoard: a folder per run (the fresh start is another run)
    assert {str(p): oct(p.stat().st_mode & 0o777) for p in made} == {str(p): "0o750" for p in made}
