"""W1: a copy of the checkpoints that never arrived (checkpoint.mirror_to, a pelican:// checkpoint.dir) is never
called uploaded: the run's last lines, its exit code, summary.json and `hpctrain status` say it failed, and the
wait for it comes before the run's last line. (The Pelican upload refused with 403: tests/integration/
test_pelican_auth.py::test_uploads_without_a_token_are_refused_and_reported.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpctrain.commands.status import collect
from hpctrain.commands.train import run
from hpctrain.errors import EXIT_FAILURE, EXIT_OK
from hpctrain.remote.upload import Uploader
from hpctrain.runtime.env import ClusterEnv
from tests.train.test_extend import make_cfg, summary


def test_an_upload_given_up_on_is_not_sent() -> None:
    def fail() -> None:
        raise OSError("HTTP 503 from the origin")

    up = Uploader("test", retries=2, backoff=0.01)
    up.submit(fail)
    assert up.close(timeout=30) is False
    assert up.error is not None and "3 attempts failed" in up.error and "503" in up.error
    again = Uploader("test", retries=2, backoff=0.01)
    calls: list[int] = []

    def flaky() -> None:
        calls.append(1)
        if len(calls) < 2:
            raise OSError("reset by peer")

    again.submit(flaky)
    assert again.close(timeout=30) is True and again.error is None  # a retry that arrives is sent


def test_a_mirror_that_fails_fails_the_finished_run_and_a_new_start_copies_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the mirror's folder should be")
    dest = blocker / "mirror"
    cfg = make_cfg(tmp_path, "train.total_updates=6", "checkpoint.every=3", f"checkpoint.mirror_to={dest}")
    assert run(cfg, ClusterEnv()) == EXIT_FAILURE
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and str(dest) in errors[0] and "run the same command again" in errors[0]
    run_dir = tmp_path / "r"
    assert summary(run_dir)["status"] == "finished"
    assert list(summary(run_dir)["copy_failures"]) == [str(dest)]
    info = collect(run_dir)
    assert info["status"] == "finished" and f"NOT copied to {dest}" in info["evidence"]
    log = (run_dir / "training.log").read_text()
    assert log.index("mirroring checkpoints to") < log.index("finished at update 6/6") < log.index("error: ")

    blocker.unlink()  # fixed: the same command copies them, trains nothing, and passes
    assert (
        run(make_cfg(tmp_path, "train.total_updates=6", f"checkpoint.mirror_to={dest}"), ClusterEnv())
        == EXIT_OK
    )
    # the mirror keeps a run's copies in <mirror_to>/<run name>/
    assert (dest / "r" / "checkpoints" / "step_00000006.pt").read_bytes() == (
        run_dir / "checkpoints" / "step_00000006.pt"
    ).read_bytes()
    assert summary(run_dir)["copy_failures"] == {}
    assert "NOT copied" not in collect(run_dir)["evidence"]


def test_a_stopped_run_whose_mirror_failed_stays_resumable_and_says_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.train.test_extend import stopped_at

    blocker = tmp_path / "blocker"
    blocker.write_text("")
    stopped_at(tmp_path, monkeypatch, 4, "train.total_updates=20", f"checkpoint.mirror_to={blocker / 'm'}")
    warned = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: ")]
    assert len(warned) == 1 and "the next start copies them again" in warned[0]
    record = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert record["status"] == "stopped" and list(record["copy_failures"]) == [str(blocker / "m")]
