"""W&B for real, offline: two `hpctrain train` hops append to ONE run id; sync fails honestly and fast.

Nothing can escape: WANDB_MODE=offline, every WANDB_*_DIR in tmp, WANDB_BASE_URL on a closed local port.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from hpctrain.track.sync import find_offline_runs, has_exit_record, iter_records, read_history
from tests.conftest import clean_env, hpctrain, read_jsonl

pytestmark = pytest.mark.integration

KEY = "hpctrainTestKey0123456789abcdef0123456789"  # 40 characters like a real key; must never be written
# The Pelican token by both allowed routes: BEARER_TOKEN in .env and a token file (the file wins when read).
DOTENV_TOKEN = "hpctrainDotenvToken0123456789abcdef"
FILE_TOKEN = "hpctrainFileToken0123456789abcdef"
# Tokens inside URIs (issue 45): a mirror's `?authz=`, renewed between the hops, and a password in a URL.
URI_TOKENS = ("hpctrainUriToken0123456789", "hpctrainRenewedToken0123456789", "hpctrainUrlPassword0123456789")
SECRETS = (KEY, DOTENV_TOKEN, FILE_TOKEN, *URI_TOKENS)


def _wandb_env(tmp: Path, **extra: str) -> dict[str, str]:
    dirs = {
        name: str(tmp / "wandb_home" / name.lower())
        for name in (
            "WANDB_DIR",
            "WANDB_CACHE_DIR",
            "WANDB_CONFIG_DIR",
            "WANDB_DATA_DIR",
            "WANDB_ARTIFACT_DIR",
        )
    }
    for folder in dirs.values():
        Path(folder).mkdir(parents=True, exist_ok=True)
    return clean_env(
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        WANDB_BASE_URL="http://127.0.0.1:9",
        HOME=str(tmp / "home"),
        **dirs,
        **extra,
    )


@pytest.fixture(scope="module")
def two_hops(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[str]]:
    """Hop 1 stops at its budget of 40 updates; hop 2 continues the same run folder to 80."""
    tmp = tmp_path_factory.mktemp("wandb")
    # Read by the config loader like on a cluster.
    (tmp / ".env").write_text(f"WANDB_API_KEY={KEY}\nBEARER_TOKEN={DOTENV_TOKEN}\n")
    (tmp / "token").write_text(FILE_TOKEN + "\n")
    env = _wandb_env(tmp)
    outputs = []
    common = [
        "data.type=regression",
        "model.type=regression",
        f"run.out_dir={tmp / 'logs'}",
        "run.name=wb",
        "logging.wandb.enabled=true",
        "logging.log_every=20",
        f"logging.tensorboard.dir={tmp / 'tb'}",
        f"data.pelican.token_file={tmp / 'token'}",
    ]
    for total, token in ((40, URI_TOKENS[0]), (80, URI_TOKENS[1])):
        uris = [
            f"checkpoint.mirror_to=memory:///copies?authz={token}",  # a copy per process: nothing else leaves
            f"data.pelican.federation_url=https://me:{URI_TOKENS[2]}@fed.example",
        ]
        done = hpctrain("train", *common, *uris, f"train.total_updates={total}", cwd=tmp, env=env)
        assert done.code == 0, done.err[-3000:]
        outputs += [done.out, done.err]
    exported = hpctrain("export", str(tmp / "logs" / "wb"), "--out", str(tmp / "export"), cwd=tmp, env=env)
    assert exported.code == 0, exported.err
    outputs += [exported.out, exported.err]
    return tmp, tmp / "logs" / "wb", outputs


def test_two_hops_append_to_one_run(two_hops: tuple[Path, Path, list[str]]) -> None:
    _, run_dir, _ = two_hops
    runs = find_offline_runs(run_dir)
    assert len(runs) == 2
    assert runs[0].run_id == runs[1].run_id
    assert all(has_exit_record(r.file) for r in runs)
    steps = [[row["_step"] for row in read_history(r.file)] for r in runs]
    assert steps == [[20, 40], [60, 80]]
    metrics = {r["step"]: r for r in read_jsonl(run_dir / "metrics.jsonl") if "loss" in r}
    for run in runs:
        for row in read_history(run.file):
            assert row["loss"] == pytest.approx(metrics[row["_step"]]["loss"])
            assert {"lr", "updates_per_s", "samples_per_s", "data_share", "step_share"} <= set(row)
    # The resolved config is the W&B config, secrets masked.
    run_records = [r.run for r in iter_records(runs[1].file) if r.WhichOneof("record_type") == "run"]
    config = {item.key: json.loads(item.value_json) for item in run_records[0].config.update}
    assert config["train"]["total_updates"] == 80
    assert config["logging"]["wandb"]["api_key"] == "**********"
    assert config["data"]["pelican"]["token"] == "**********"
    # and what the hop ran under (versions, hosts, the config's git state): chain.json's record of hop 2
    assert config["ran"] == json.loads((run_dir / "chain.json").read_text())[1]["ran"]


def test_tensorboard_steps_continue_across_hops(two_hops: tuple[Path, Path, list[str]]) -> None:
    tmp, _, _ = two_hops
    (folder,) = (tmp / "tb").iterdir()  # one run folder for both hops
    assert re.fullmatch(r"wb-\d{8}-\d{6}", folder.name)  # named after run.name and the first hop's time
    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/loss")] == [20, 40, 60, 80]
    assert [e.step for e in acc.Scalars("val/loss")] == [40, 80]


def test_no_secret_is_ever_written_or_printed(two_hops: tuple[Path, Path, list[str]]) -> None:
    """Every file of the run folder (config.yaml, checkpoints, metrics, offline W&B records, training.log),
    TensorBoard and W&B's own folders and an export, read as bytes; and what was printed. Tokens inside URIs
    too, the renewed one of the second hop included (the same run: it continued)."""
    tmp, run_dir, outputs = two_hops
    assert not any(secret in text for text in outputs for secret in SECRETS)
    files = [*run_dir.rglob("*"), *(tmp / "tb").rglob("*"), *(tmp / "wandb_home").rglob("*")]
    files += [*(tmp / "export").rglob("*")]
    assert "authz=***" in (run_dir / "config.yaml").read_text()  # there, masked
    checked = [path for path in files if path.is_file()]
    assert any(p.suffix == ".wandb" for p in checked) and any(p.suffix == ".pt" for p in checked)
    for path in checked:
        data = path.read_bytes()
        for secret in SECRETS:
            assert secret.encode() not in data, path
        if path.suffix == ".wandb":
            # W&B keeps no command line at all (its metadata would hold sys.argv, which `sync` uploads).
            assert b"logging.log_every=20" not in data and b"run.name=wb" not in data, path


def test_sync_against_an_unreachable_server_fails_fast(two_hops: tuple[Path, Path, list[str]]) -> None:
    tmp, run_dir, _ = two_hops
    env = _wandb_env(tmp)
    start = time.monotonic()
    done = hpctrain("sync", str(run_dir), cwd=tmp, env=env, timeout=300)
    elapsed = time.monotonic() - start
    assert done.code != 0, done.out
    # its own capped retries gave up (seconds; imports and W&B's service start take tens on a loaded machine),
    # not the 600 s that one `wandb sync` may take
    assert "did not finish within" not in done.out + done.err and elapsed < 180, done.out
    assert "FAILED" in done.out and "1 failed" in done.out
    assert "0 uploaded" in done.out  # stopped at the first hop: the second must not land before it
    assert not (run_dir / "wandb_sync.json").exists()
    assert not any(secret in done.out + done.err for secret in SECRETS)


def test_sync_dry_run_lists_hops_in_order(two_hops: tuple[Path, Path, list[str]]) -> None:
    tmp, run_dir, _ = two_hops
    done = hpctrain("sync", str(run_dir), "--dry-run", cwd=tmp, env=_wandb_env(tmp))
    assert done.code == 0
    listed = [line.split("/")[-1] for line in done.out.splitlines() if line.startswith("would sync")]
    assert listed == [r.folder.name for r in find_offline_runs(run_dir)]


def test_sync_does_not_import_torch() -> None:
    code = "import sys; import hpctrain.commands.sync, hpctrain.track.sync; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_disabled_mode_is_a_stand_in_that_keeps_the_run_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpctrain.config.loading import ConfigRequest, load_config
    from hpctrain.track.wandb_tracker import WandbTracker
    from hpctrain.workloads.registry import config_model

    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = load_config(
        ConfigRequest(
            None,
            None,
            ["data.type=regression", "logging.wandb.enabled=true", "logging.wandb.mode=disabled"],
            None,
        ),
        config_model(),
        environ={},
    )
    tracker = WandbTracker(cfg, tmp_path, resume_step=40, state={"run_id": "abc12345"})
    tracker.log_scalars(41, {"loss": 1.0})
    tracker.log_histograms(41, {})
    tracker.flush()
    tracker.close()
    assert tracker.state_dict() == {"run_id": "abc12345"}
    assert not (tmp_path / "wandb").exists()


def test_sync_skips_what_is_already_uploaded(two_hops: tuple[Path, Path, list[str]]) -> None:
    tmp, run_dir, _ = two_hops
    first, second = find_offline_runs(run_dir)
    marker = first.file.with_suffix(".wandb.synced")  # what wandb itself leaves after a successful upload
    marker.touch()
    try:
        done = hpctrain("sync", str(run_dir), cwd=tmp, env=_wandb_env(tmp), timeout=120)
    finally:
        marker.unlink()
    assert done.code != 0
    assert f"syncing {second.folder}" in done.out and f"syncing {first.folder}" not in done.out
    assert "1 already uploaded" in done.out and "1 failed" in done.out
