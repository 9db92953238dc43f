"""The config says what it did and what to write instead (issue 31 items 6 and 8): a preset over the user's file
names what it changed; a dashed override and an unquoted ${VAR} in a flow list get the fix in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hpctrain.cli import main as cli_main

USER = 'train:\n  device: cpu\n  total_updates: 10\ndata:\n  num_workers: 2\nslurm:\n  time: "01:00:00"\n'


def show(tmp_path: Path, capsys, *args: str) -> tuple[int, str, str]:
    code = cli_main(["config", "show", "--env-file", "", *args])
    out, err = capsys.readouterr()
    return code, out, err


def notes(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("note: preset")]


def test_a_preset_over_the_users_file_names_what_it_changed(tmp_path: Path, capsys) -> None:
    (tmp_path / "mine.yaml").write_text(USER)
    code, out, err = show(tmp_path, capsys, "--config", str(tmp_path / "mine.yaml"), "--preset", "single_gpu")
    assert code == 0
    assert notes(err) == [
        "note: preset single_gpu changed what config file mine.yaml set (the preset wins; a key=value on the "
        "command line beats it): train.device: cpu -> cuda, data.num_workers: 2 -> 4, slurm.time: 01:00:00 -> "
        "04:00:00"
    ]
    cfg = yaml.safe_load(out)  # the precedence is kept: the preset's values
    assert (cfg["train"]["device"], cfg["data"]["num_workers"], cfg["slurm"]["time"]) == (
        "cuda",
        4,
        "04:00:00",
    )
    assert cfg["train"]["total_updates"] == 10  # not in the preset: the user's


def test_no_note_where_the_preset_agrees_or_a_later_layer_decides(tmp_path: Path, capsys) -> None:
    (tmp_path / "mine.yaml").write_text(USER)
    mine = ["--config", str(tmp_path / "mine.yaml")]
    _, _, err = show(
        tmp_path, capsys, *mine, "--preset", "single_gpu", "slurm.time=02:00:00", "train.device=cpu"
    )
    assert notes(err) == [
        "note: preset single_gpu changed what config file mine.yaml set (the preset wins; a key=value on the "
        "command line beats it): data.num_workers: 2 -> 4"
    ]
    (tmp_path / "same.yaml").write_text("train:\n  device: cuda\n")
    _, _, err = show(tmp_path, capsys, "--config", str(tmp_path / "same.yaml"), "--preset", "single_gpu")
    assert notes(err) == []
    _, _, err = show(tmp_path, capsys, "--preset", "single_gpu")  # no file of the user's
    assert notes(err) == []


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--optim.lr=3e-4"], "write optim.lr=3e-4"),
        (["--optim.lr", "3e-4"], "write optim.lr=3e-4"),
        (["train.total_updates=5", "--data.batch_size=8"], "write data.batch_size=8"),
        (["--data.pelican.token=abc123secret"], "write data.pelican.token=***"),
    ],
)
def test_a_dashed_override_gets_the_form_without_dashes(tmp_path: Path, capsys, args, expected) -> None:
    for verb in (["config", "show"], ["train"], ["submit", "--dry-run"]):
        code = cli_main([*verb, *args])
        err = capsys.readouterr().err
        assert code == 2 and len(err.splitlines()) == 1, err
        assert err.startswith(f"error: hpctrain {verb[0]}: unknown option --") and err.rstrip().endswith(
            expected
        )
        assert "abc123secret" not in err


def test_other_unknown_options_keep_argparses_words(tmp_path: Path, capsys) -> None:
    code, _, err = show(tmp_path, capsys, "--bogus")
    assert code == 2 and err == "error: hpctrain config: unrecognized arguments: --bogus\n"


@pytest.mark.parametrize(
    "line, fixed",
    [
        ("paths: [${DATA_DIR}/train]", "paths: ['${DATA_DIR}/train']"),
        ("paths: [${DATA_DIR}/train, /b/${X}]", "paths: ['${DATA_DIR}/train', '/b/${X}']"),
        ("paths: ['${A}/ok', ${B}/not]", "paths: ['${A}/ok', '${B}/not']"),
    ],
)
def test_an_unquoted_variable_in_a_flow_list_says_quote_it(tmp_path: Path, capsys, line, fixed) -> None:
    (tmp_path / "c.yaml").write_text(f"model:\n  type: muon_wgan\ndata:\n  type: muons\n  {line}\n")
    code, _, err = show(tmp_path, capsys, "--config", str(tmp_path / "c.yaml"))
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.rstrip().endswith(f"is read as YAML syntax; quote it: {fixed}"), err
    (tmp_path / "c.yaml").write_text(f"model:\n  type: muon_wgan\ndata:\n  type: muons\n  {fixed}\n")
    code, _, err = show(tmp_path, capsys, "--config", str(tmp_path / "c.yaml"))
    assert code == 2 and "is used in the config but not set" in err  # the fix parses; the variable is unset
