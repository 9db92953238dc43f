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


# The seed scripts' habits (issue 44): each answered with the key, in one line, exit 2, for every verb that takes
# a config; the answer is then accepted as written.
SEED_HABITS = [
    (["--lr", "2e-5"], "write optim.lr=2e-5", ["optim.lr=2e-5"]),
    (["--lr=2e-5"], "write optim.lr=2e-5", ["optim.lr=2e-5"]),
    (["--batch-size", "128"], "write data.batch_size=128", ["data.batch_size=128"]),
    (["--epochs", "10"], "write train.epochs=10", ["train.epochs=10"]),
    (["--export=LR=2e-5"], "(LR=2e-5 hpctrain ...), or write optim.lr=2e-5", ["optim.lr=2e-5"]),
    (["LR=2e-5"], "LR is an environment variable (what `sbatch --export=LR=...` sets), not a key: write "
     "optim.lr=2e-5, or put it before the command (LR=2e-5 hpctrain ...)", ["optim.lr=2e-5"]),
    (["-i", "a.parquet", "b.parquet"], "write 'data.paths=[a.parquet,b.parquet]'", None),
    (["--wandb-offline"], "write logging.wandb.enabled=true logging.wandb.mode=offline",
     ["logging.wandb.enabled=true", "logging.wandb.mode=offline"]),
    (["--tb-logdir", "tb"], "write logging.tensorboard.dir=tb", ["logging.tensorboard.dir=tb"]),
    (["--eval-every", "50"], "write train.eval_every=50", ["train.eval_every=50"]),  # by the key's name
]  # fmt: skip


@pytest.mark.parametrize("args, expected, accepted", SEED_HABITS)
def test_the_seed_scripts_flags_are_answered_with_the_key(
    tmp_path: Path, capsys, args: list[str], expected: str, accepted: list[str] | None
) -> None:
    for verb in (["config", "show"], ["train"], ["submit", "--dry-run"]):
        code = cli_main([*verb, "--env-file", "", *args])
        err = capsys.readouterr().err
        assert code == 2 and len(err.splitlines()) == 1, err
        assert err.startswith("error: ") and err.rstrip().endswith(expected), err
    if accepted is not None:
        code, _, err = show(tmp_path, capsys, *accepted)
        assert code == 0, err


def test_the_muon_flag_and_one_path_without_brackets(tmp_path: Path, capsys) -> None:
    muons = ["--config", str(Path(__file__).parents[2] / "configs" / "muons_quick.yaml")]
    code = cli_main(["config", "show", "--env-file", "", *muons, "--max-muons-per-event", "500"])
    assert code == 2 and capsys.readouterr().err.rstrip().endswith("write data.max_muons_per_event=500")
    # one path without brackets is a list of one (the seeds' -i took one); several need them
    code, out, _ = show(tmp_path, capsys, *muons, "data.paths=one/path")
    assert code == 0 and yaml.safe_load(out)["data"]["paths"] == ["one/path"]
    code, _, err = show(tmp_path, capsys, *muons, "data.paths=a,b")
    assert code == 2 and err.startswith(
        "error: data.paths='a,b': a list of several takes brackets, quoted for the shell: 'data.paths=[a,b]'"
    )


def test_a_mistyped_config_path_names_the_nearest_file(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(Path(__file__).parents[2])
    code, _, err = show(tmp_path, capsys, "--config", "configs/muon_quick.yaml")
    assert code == 2
    assert (
        err
        == "error: config file 'configs/muon_quick.yaml' not found; did you mean configs/muons_quick.yaml?\n"
    )
    code, _, err = show(tmp_path, capsys, "--config", str(tmp_path / "nothing-like-it.yaml"))
    assert code == 2 and err.rstrip().endswith("not found")
