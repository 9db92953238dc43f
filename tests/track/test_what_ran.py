"""The record of what ran in each hop (track/what_ran.py, train/what_ran.py): the config's git tree (commit, dirty,
the diff's hash, the diff when small), versions and hosts, in chain.json, summary.json and `hpctrain status`; a
hop that resumes under another commit says so in one line."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from hpctrain.commands.status import collect, render
from hpctrain.commands.train import run
from hpctrain.config.loading import ConfigRequest
from hpctrain.runtime.env import ClusterEnv
from hpctrain.track.what_ran import DIFF_KEPT, describe, differences, git_state
from hpctrain.workloads.registry import resolve
from tests.conftest import ROOT


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "project"
    (repo / "configs").mkdir(parents=True)
    shutil.copy(ROOT / "configs" / "debug.yaml", repo / "configs")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "first")
    return repo


def test_git_state_says_commit_dirt_and_keeps_only_a_small_diff(repo: Path, tmp_path: Path) -> None:
    clean = git_state(repo / "configs")
    assert clean is not None and clean["commit"] == _git(repo, "rev-parse", "HEAD") and not clean["dirty"]
    config = repo / "configs" / "debug.yaml"
    config.write_text(config.read_text() + "# a local edit\n")
    small = git_state(repo)
    assert small is not None and small["dirty"] and "+# a local edit" in small["diff"]
    assert len(small["diff_sha256"]) == 64
    config.write_text(config.read_text() + "#" * (DIFF_KEPT + 10) + "\n")
    big = git_state(repo)
    assert big is not None and big["diff"] is None and big["diff_chars"] > DIFF_KEPT
    assert big["diff_sha256"] != small["diff_sha256"]
    (tmp_path / "plain").mkdir()
    assert git_state(tmp_path / "plain") is None


def test_each_hop_records_what_ran_and_a_new_commit_is_said_in_one_line(
    repo: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = str(repo / "configs" / "debug.yaml")
    overrides = [
        f"run.out_dir={tmp_path / 'logs'}",
        "run.name=w",
        "train.eval_every=0",
        "logging.log_every=5",
    ]

    def hop(updates: int) -> None:
        request = ConfigRequest(config, None, [*overrides, f"train.total_updates={updates}"], None)
        cfg = resolve(request)[0]
        assert run(cfg, ClusterEnv(), config_file=config) == 0

    hop(10)
    first = _git(repo, "rev-parse", "HEAD")
    (repo / "notes.txt").write_text("x\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "second")
    with caplog.at_level(logging.WARNING):
        hop(20)
    said = [r.getMessage() for r in caplog.records if "other software" in r.getMessage()]
    assert said == [
        f"this hop runs under other software than hop #1: git {first[:12]} -> {_git(repo, 'rev-parse', 'HEAD')[:12]}"
    ]
    run_dir = tmp_path / "logs" / "w"
    hops = json.loads((run_dir / "chain.json").read_text())
    for record in (hops[0]["ran"], hops[1]["ran"], json.loads((run_dir / "summary.json").read_text())["ran"]):
        assert record["torch"] == torch.__version__ and record["hosts"] and record["python"]
        assert record["config_file"] == config and record["git"]["top"] == str(repo)
    assert hops[0]["ran"]["git"]["commit"] == first != hops[1]["ran"]["git"]["commit"]
    shown = render(collect(run_dir))
    assert f"ran (hop #2): {describe(hops[1]['ran'])}" in shown
    changed = [line for line in shown.splitlines() if line.startswith("  -- changed at update 10:")]
    assert len(changed) == 1 and f"git {first[:12]} -> " in changed[0], shown


def test_differences_name_versions_and_commits_and_nothing_else() -> None:
    before = {
        "hpctrain": "0.1.0",
        "python": "3.11.7",
        "torch": "2.12.0",
        "cuda": "12.4",
        "git": None,
        "hosts": ["a"],
    }
    after = {
        **before,
        "torch": "2.13.0",
        "cuda": "12.6",
        "hosts": ["b"],
        "git": {"commit": "f" * 40, "dirty": False},
    }
    assert differences(before, after) == "torch 2.12.0 -> 2.13.0; CUDA 12.4 -> 12.6; git none -> ffffffffffff"
    assert differences(before, {**before, "hosts": ["c"]}) == "" and differences(None, after) == ""
