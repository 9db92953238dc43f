"""Configuration on the real command line (issue 13 items 1-5): precedence, argument order, typed values,
help with keys, and nothing taken from the environment silently."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hpctrain.config.schema import parse_duration
from tests.conftest import ROOT, clean_env, hpctrain


def show(tmp_path: Path, *args: str, **env: str):
    done = hpctrain("config", "show", *args, cwd=tmp_path, env=clean_env(**env))
    assert done.code == 0, done.err
    return yaml.safe_load(done.out), done


def test_a_setting_spelt_with_one_underscore_is_refused_naming_the_right_name(tmp_path: Path) -> None:
    """HPCTRAIN_OPTIM_LR looks like a setting and set nothing: the run went on at the old learning rate."""
    cases = {
        ("HPCTRAIN_OPTIM_LR", "5"): "environment variable HPCTRAIN_OPTIM_LR sets nothing: write "
        "HPCTRAIN_OPTIM__LR for optim.lr (two underscores between section and key)",
        ("HPCTRAIN_TRAIN_TOTAL_UPDATES", "9"): "write HPCTRAIN_TRAIN__TOTAL_UPDATES for train.total_updates",
        ("HPCTRAIN_DATA_PELICAN_TOKEN_FILE", "t"): "write HPCTRAIN_DATA__PELICAN__TOKEN_FILE for "
        "data.pelican.token_file",
    }
    for (name, value), message in cases.items():
        done = hpctrain("config", "show", cwd=tmp_path, env=clean_env(**{name: value}))
        assert done.code == 2 and len(done.err.strip().splitlines()) == 1 and message in done.err, done.err
    (tmp_path / ".env").write_text("HPCTRAIN_OPTIM_LR=5\n")
    done = hpctrain("config", "show", cwd=tmp_path, env=clean_env())
    assert done.code == 2 and ".env variable HPCTRAIN_OPTIM_LR sets nothing" in done.err
    (tmp_path / ".env").unlink()
    # names that spell no key are the scripts' own (slurm/common.sh, the templates): left alone
    cfg, _ = show(
        tmp_path,
        HPCTRAIN_HOME=str(tmp_path),
        HPCTRAIN_ORIGINAL_ARGS="x",
        HPCTRAIN_TRAIN="1",  # a section's name alone spells no key either
        HPCTRAIN_OPTIM__LR="0.5",
    )
    assert cfg["optim"]["lr"] == 0.5


def test_command_line_beats_environment_beats_dotenv_and_says_so(tmp_path: Path) -> None:
    cfg, done = show(tmp_path, "train.total_updates=9", TOTAL_UPDATES="7")
    assert cfg["train"]["total_updates"] == 9
    conflict = [line for line in done.err.splitlines() if line.startswith("note: where sources disagree")]
    assert conflict == [
        "note: where sources disagree the later one wins: train.total_updates=9 from command line "
        "(over preset debug: 200, environment TOTAL_UPDATES: 7)"
    ]
    (tmp_path / ".env").write_text("RESULTS_DIR=/scratch/results\nLR=0.25\n")
    cfg, done = show(tmp_path, "run.out_dir=mine")
    assert cfg["run"]["out_dir"] == "mine" and cfg["optim"]["lr"] == 0.25
    assert "run.out_dir=mine from command line (over .env RESULTS_DIR: /scratch/results)" in done.err
    cfg, _ = show(tmp_path, LR="0.5")  # the environment beats .env
    assert cfg["optim"]["lr"] == 0.5


def test_notes_only_on_rank_zero(tmp_path: Path) -> None:
    _, done = show(tmp_path, "train.total_updates=9", TOTAL_UPDATES="7", RANK="1")
    assert done.err == ""
    _, done = show(tmp_path, "train.total_updates=9", TOTAL_UPDATES="7", SLURM_PROCID="2")
    assert done.err == ""
    _, done = show(tmp_path, "train.total_updates=9", TOTAL_UPDATES="7", SLURM_PROCID="0")
    assert "the later one wins" in done.err


def test_every_value_from_the_environment_is_named_and_marked(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("RESULTS_DIR=/scratch/results\nWANDB_API_KEY=verysecret123\n")
    cfg, done = show(
        tmp_path, "--preset", "debug", "optim.lr=0.01", LR="2e-5", SEED="4", HPCTRAIN_TRAIN__EPOCHS="2"
    )
    assert cfg["run"]["seed"] == 4 and cfg["train"]["epochs"] == 2.0 and cfg["optim"]["lr"] == 0.01
    line = next(line for line in done.err.splitlines() if line.startswith("note: taken from the environment"))
    for item in (
        "run.out_dir=/scratch/results (.env RESULTS_DIR)",
        "logging.wandb.api_key=*** (.env WANDB_API_KEY)",
        "run.seed=4 (environment SEED)",
        "train.epochs=2 (environment HPCTRAIN_TRAIN__EPOCHS)",
    ):
        assert item in line, line
    assert "LR" not in line  # the command line won: named in the conflict line instead
    assert "optim.lr=0.01 from command line (over environment LR: 2e-5)" in done.err
    assert "verysecret123" not in done.out + done.err
    marks = {
        line.split(":")[0].strip(): line.split("# from ")[-1]
        for line in done.out.splitlines()
        if "# from" in line
    }
    assert marks["seed"] == "environment SEED" and marks["out_dir"] == ".env RESULTS_DIR"
    assert marks["lr"] == "command line" and marks["total_updates"] == "preset debug"
    assert "# from" not in next(line for line in done.out.splitlines() if "momentum:" in line)  # a default


def test_train_names_the_environment_values(tmp_path: Path) -> None:
    done = hpctrain(
        "train",
        "train.total_updates=2",
        "run.out_dir=out",
        "logging.log_every=1",
        cwd=tmp_path,
        env=clean_env(SEED="5"),
    )
    assert done.code == 0, done.err
    assert "note: taken from the environment or .env: run.seed=5 (environment SEED)" in done.err


@pytest.mark.parametrize("verb", ["config", "train", "submit"])
def test_options_and_overrides_in_any_order(tmp_path: Path, verb: str) -> None:
    head = ["config", "show"] if verb == "config" else [verb]
    tail = {"config": [], "train": ["train.total_updates=1", "run.out_dir=out"], "submit": ["--dry-run"]}[
        verb
    ]
    done = hpctrain(
        *head,
        "--config",
        str(ROOT / "configs" / ("muons.yaml" if verb == "config" else "debug.yaml")),
        "train.total_updates=5000",
        "--preset",
        "debug",
        "run.name=mix",
        *tail,
        cwd=tmp_path,
    )
    assert "unrecognized arguments" not in done.err
    if verb == "config":
        assert done.code == 0, done.err
        cfg = yaml.safe_load(done.out)
        assert (cfg["train"]["total_updates"], cfg["model"]["type"], cfg["run"]["name"]) == (
            5000,
            "muon_flow",
            "mix",
        )
    else:
        assert done.code == 0, done.err
        assert "run folder" in done.out + done.err or "mix" in done.out


def test_values_are_typed_by_their_field(tmp_path: Path) -> None:
    cfg, _ = show(
        tmp_path,
        "run.name=2024",
        "logging.wandb.group=007",
        "train.compile=YES",
        "train.allow_tf32=No",
        "data.shuffle=0",
        "checkpoint.restart=False",
        "slurm.time=30",
        "budget.time_limit=2-12:00",
        "slurm.mem=null",
        "optim.lr=2e-5",
    )
    assert cfg["run"]["name"] == "2024" and cfg["logging"]["wandb"]["group"] == "007"
    assert (cfg["train"]["compile"], cfg["train"]["allow_tf32"], cfg["data"]["shuffle"]) == (
        "default",
        False,
        False,
    )
    assert cfg["checkpoint"]["restart"] is False
    assert (cfg["slurm"]["time"], cfg["budget"]["time_limit"], cfg["slurm"]["mem"]) == ("30", "2-12:00", None)
    assert cfg["optim"]["lr"] == pytest.approx(2e-5)
    # an optional boolean takes `null` back (the default's rule), from the command line and the environment
    cfg, _ = show(tmp_path, "train.compile_background=true", "train.compile_background=null")
    assert cfg["train"]["compile_background"] is None
    cfg, _ = show(tmp_path, "train.compile_background=~")
    assert cfg["train"]["compile_background"] is None
    cfg, _ = show(tmp_path, HPCTRAIN_TRAIN__COMPILE_BACKGROUND="null")
    assert cfg["train"]["compile_background"] is None
    # a YAML file: numbers where the field is text, and times YAML 1.1 would read as base-60 integers
    (tmp_path / "exp.yaml").write_text(
        "run:\n  name: 2024\nslurm:\n  time: 1:00:00\nbudget:\n  time_limit: 30\n"
    )
    cfg, _ = show(tmp_path, "--config", "exp.yaml")
    assert (cfg["run"]["name"], cfg["slurm"]["time"], cfg["budget"]["time_limit"]) == (
        "2024",
        "1:00:00",
        "30",
    )
    cfg, _ = show(tmp_path, HPCTRAIN_RUN__NAME="2025")
    assert cfg["run"]["name"] == "2025"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 1800),
        ("0", 0),
        ("30:00", 1800),
        ("1:30", 90),
        ("1:00:00", 3600),
        ("100:00:00", 360000),
        ("2-00", 172800),
        ("0-30", 108000),
        ("2-12:00", 216000),
        ("2-12:00:00", 216000),
        ("1-2:3:4", 93784),
        (" 05:00 ", 300),
    ],
)
def test_parse_duration_takes_every_sbatch_time_form(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text",
    [
        "1:99",
        "1:60",
        "1:60:00",
        "1:00:60",
        "2-12:60",
        "2-1:00:99",
        "abc",
        "1:2:3:4",
        "",
        "5.5",
        "-5",
        "1-",
        "2-",
    ],
)
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("arg", "expected"),
    [
        ("budget.time_limit=1:99", "budget.time_limit='1:99': Value error, '1:99' is not a duration"),
        ("slurm.time=1:60:00", "slurm.time='1:60:00'"),
        ("optim.lrr=1", "optim.lrr=1: unknown key (did you mean optim.lr?)"),
        ("lr=1", "lr=1: unknown key (did you mean optim.lr?)"),
        ("train.total_update=3", "unknown key (did you mean train.total_updates?)"),
        ("model.hiden=[3]", "unknown key (did you mean model.hidden"),
        # a key of another model type: said so, not "did you mean" the very key
        (
            "model.critic_steps=2",
            "model.critic_steps=2: not a key of model.type=regression (a key of muon_wgan)",
        ),
        (
            "data.shuffle_window=4",
            "data.shuffle_window=4: not a key of data.type=regression (a key of muons)",
        ),
        ("train.compile=maybe", "train.compile='maybe'"),
    ],
)
def test_bad_values_and_keys_are_one_line_with_help(tmp_path: Path, arg: str, expected: str) -> None:
    done = hpctrain("config", "show", arg, cwd=tmp_path)
    assert done.code == 2 and len(done.err.strip().splitlines()) == 1, done.err
    assert expected in done.err


def test_doc_lists_keys_with_type_default_and_description(tmp_path: Path) -> None:
    done = hpctrain("config", "show", "--doc", "optim", cwd=tmp_path)
    assert done.code == 0, done.err
    assert "optim.lr (float, default 0.001): Learning rate before scaling" in done.out
    assert all(line.startswith("optim.") for line in done.out.splitlines())
    everything = hpctrain("config", "show", "--doc", cwd=tmp_path).out
    assert "slurm.time (str, default '01:00:00'):" in everything and "model.hidden (list[int]" in everything
    assert "model.latent_global" not in everything  # the configured model.type (regression) only
    muons = hpctrain(
        "config",
        "show",
        "--config",
        str(ROOT / "configs" / "muons_wgan.yaml"),
        "--doc",
        "model",
        cwd=tmp_path,
    )
    assert "model.latent_global (int, default 32)" in muons.out and "model.dropout" not in muons.out
    every = hpctrain("config", "show", "--doc", "model", "--all-types", cwd=tmp_path).out
    assert "[model.type=muon_wgan]" in every and "[model.type=regression]" in every
    bad = hpctrain("config", "show", "--doc", "optimm", cwd=tmp_path)
    assert bad.code == 2 and "did you mean optim" in bad.err


def test_version(tmp_path: Path) -> None:
    from importlib.metadata import version

    done = hpctrain("--version", cwd=tmp_path)
    assert done.code == 0 and done.out.strip() == f"hpctrain {version('hpctrain')}"


@pytest.mark.parametrize(
    ("key", "seed"),
    [("run.seed", str(2**70)), ("run.seed", str(2**63)), ("run.seed", "-1"), ("data.data_seed", str(2**62))],
)
def test_seed_out_of_range_is_refused_before_anything_is_made(tmp_path: Path, key: str, seed: str) -> None:
    done = hpctrain("train", f"{key}={seed}", "train.total_updates=2", cwd=tmp_path)
    assert done.code == 2 and len(done.err.strip().splitlines()) == 1, done.err
    assert done.err.startswith(f"error: {key}={seed}: ") and "Traceback" not in done.err
    assert not (tmp_path / "logs").exists()  # no run folder, no checkpoints/


def test_largest_seed_trains(tmp_path: Path) -> None:
    done = hpctrain("train", f"run.seed={2**63 - 1}", "train.total_updates=2", cwd=tmp_path)
    assert done.code == 0, done.err
    assert "params_sha256=" in done.out.strip().splitlines()[-1]
