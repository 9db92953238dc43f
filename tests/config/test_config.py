from __future__ import annotations

import math
from pathlib import Path

import pytest

from hpctrain.cli import main as cli_main
from hpctrain.config import presets
from hpctrain.config.dump import dump_config
from hpctrain.config.loading import ConfigRequest, load_config
from hpctrain.config.schema import OptimConfig, ScheduleConfig
from hpctrain.config.sections.checkpoint import ResumeForm
from hpctrain.errors import UserError
from hpctrain.train.optim import LRSchedule, effective_lr
from hpctrain.workloads.registry import config_model, fill_default_types
from tests.conftest import ROOT, clean_env, hpctrain


def load(*overrides: str, config: str | None = None, preset: str | None = None, environ=None, env_file=None):
    request = ConfigRequest(config, preset, list(overrides), env_file)
    return load_config(request, config_model(), environ=environ or {}, prepare=fill_default_types)


def test_no_arguments_is_the_debug_yaml():
    default = dump_config(load())
    from_yaml = dump_config(load(config=str(ROOT / "configs" / "debug.yaml")))
    assert default == from_yaml
    assert default["run"]["name"] == "debug"
    assert default["model"]["type"] == "regression"


def test_overrides_are_typed_and_zero_is_kept():
    cfg = load(
        "optim.lr=2e-5",
        "optim.momentum=0",
        "optim.name=sgd",
        "train.total_updates=1000",
        "optim.lr_scaling=sqrt",
    )
    assert cfg.optim.lr == pytest.approx(2e-5)
    assert cfg.optim.momentum == 0.0
    assert cfg.train.total_updates == 1000
    assert load("optim.lr=0").optim.lr == 0.0


def test_sources_later_wins(tmp_path: Path):
    yaml_file = tmp_path / "exp.yaml"
    yaml_file.write_text("optim:\n  lr: 0.1\ndata:\n  batch_size: 8\ntrain:\n  total_updates: 7\n")
    cfg = load(config=str(yaml_file))
    assert (cfg.optim.lr, cfg.data.batch_size, cfg.train.total_updates, cfg.run.name) == (0.1, 8, 7, "exp")
    # preset over YAML
    cfg = load(config=str(yaml_file), preset="multi_gpu")
    assert cfg.slurm.gpus_per_node == 4 and cfg.optim.lr == 0.1
    # command line over preset
    cfg = load("data.batch_size=16", config=str(yaml_file), preset="debug")
    assert cfg.data.batch_size == 16
    # the environment (long form and sbatch aliases) over the preset and the YAML, the command line over both
    environ = {"HPCTRAIN_OPTIM__LR": "0.5", "BATCH_SIZE": "4", "TOTAL_UPDATES": "9", "SEED": "3"}
    cfg = load("optim.lr=0.2", config=str(yaml_file), preset="debug", environ=environ)
    assert (cfg.optim.lr, cfg.data.batch_size, cfg.train.total_updates, cfg.run.seed) == (0.2, 4, 9, 3)
    assert load(environ={"LR": "2e-5"}).optim.lr == pytest.approx(2e-5)
    # .env under the environment, over the preset; the command line over .env
    env_file = tmp_path / ".env"
    env_file.write_text("LR=0.3\nRESULTS_DIR=/from/dotenv\nTOTAL_UPDATES=11\n")
    cfg = load(preset="debug", env_file=str(env_file), environ={"LR": "0.4"})
    assert (cfg.optim.lr, cfg.run.out_dir, cfg.train.total_updates) == (0.4, "/from/dotenv", 11)
    cfg = load("run.out_dir=mine", env_file=str(env_file), environ={"RESULTS_DIR": "/from/env"})
    assert cfg.run.out_dir == "mine"


def test_dotenv_paths_and_masked_secret(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    env_file = tmp_path / ".env"
    env_file.write_text("RESULTS_DIR=/scratch/results\nDATA_DIR=/data/muons\nWANDB_API_KEY=supersecret123\n")
    yaml_file = tmp_path / "exp.yaml"
    yaml_file.write_text("run:\n  name: exp\ndata:\n  type: regression\n")
    cfg = load(config=str(yaml_file), env_file=str(env_file))
    assert cfg.run.out_dir == "/scratch/results"
    assert cfg.logging.wandb.api_key.get_secret_value() == "supersecret123"
    assert "supersecret123" not in str(dump_config(cfg))
    code = cli_main(["config", "show", "--config", str(yaml_file), "--env-file", str(env_file)])
    out = capsys.readouterr().out
    assert code == 0 and "supersecret123" not in out and "/scratch/results" in out


def test_yaml_interpolates_paths_from_env(tmp_path: Path):
    yaml_file = tmp_path / "exp.yaml"
    yaml_file.write_text("run:\n  out_dir: ${RESULTS}/runs\n")
    assert load(config=str(yaml_file), environ={"RESULTS": "/r"}).run.out_dir == "/r/runs"
    with pytest.raises(UserError, match=r"\$\{RESULTS\}"):
        load(config=str(yaml_file))


def test_yaml_off_is_the_text_a_choice_names(tmp_path: Path):
    # YAML 1.1 read `off` as False: the documented train.on_spike=off was refused in a config file
    yaml_file = tmp_path / "exp.yaml"
    yaml_file.write_text(
        "train:\n  on_spike: off\n  compile: off\n  compile_background: yes\n  allow_tf32: no\n"
    )
    train = load(config=str(yaml_file)).train
    assert (train.on_spike, train.compile, train.compile_background, train.allow_tf32) == (
        "off",
        "off",
        True,
        False,
    )


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["optim.lr=abc"], "optim.lr='abc'"),
        (["foo.bar=1"], "foo.bar=1: unknown key"),
        (["train.total_updates=-5"], "train.total_updates=-5"),
        (["optim.nme=sgd"], "optim.nme='sgd': unknown key"),
        (["model.type=nope"], "model.type"),
        (["optim.name=lamb"], "optim.name='lamb'"),
        (["budget.time_limit=1:99:00"], "budget.time_limit"),
        (["schedule.stages=[{type: cosine, num_updates: 0}]"], "num_updates"),
        (["lr2e-5"], "key=value"),
        (["--config", "does/not/exist.yaml"], "'does/not/exist.yaml' not found"),
        (["--preset", "huge"], "--preset 'huge' is unknown"),
        # issue 46's settings
        (["train.on_oom=retry"], "train.on_oom='retry': Input should be 'stop' or 'split'"),
        (["train.on_spike=skip"], "train.on_spike='skip'"),
        (["train.spike.window=2"], "train.spike.window=2"),
        (["train.spike.threshold=0"], "train.spike.threshold=0"),
        (["train.spike.lr_factor=1"], "train.spike.lr_factor=1"),
        (["train.spike.max_rewinds=0"], "train.spike.max_rewinds=0"),
        (["train.spike.wndow=9"], "train.spike.wndow=9: unknown key"),
        (["distributed.hang_seconds=-1"], "distributed.hang_seconds=-1"),
        (["checkpoint.resume= "], "checkpoint.resume=' ': Value error, empty: give auto"),
        (
            ["distributed.hang_seconds=600"],
            # the line starts with the keys it names (it was "error: distributed: Value error, distributed.")
            "error: distributed.hang_seconds=600 must be below distributed.timeout_seconds",
        ),
    ],
)
def test_bad_input_exits_2_with_one_line(args: list[str], expected: str, capsys: pytest.CaptureFixture[str]):
    code = cli_main(["config", "show", *args])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert expected in err


def test_checkpoint_resume_is_parsed_once_when_validated_and_dumped_as_written() -> None:
    """Preflight and resume read `checkpoint.resume_form`, parsed by the validation (config/sections/checkpoint.py);
    the value itself stays the string written (config show, the run folder's config.yaml)."""
    for text, form in [
        ("auto", ResumeForm("auto", "auto")),
        ("never", ResumeForm("never", "never")),
        ("best", ResumeForm("rewind", "best")),
        ("step_007", ResumeForm("rewind", "step_007", 7)),
        (
            "runs/old/checkpoints/step_00000002.pt",
            ResumeForm("given", "runs/old/checkpoints/step_00000002.pt"),
        ),
    ]:
        cfg = load(f"checkpoint.resume={text}")
        assert cfg.checkpoint.resume_form == form
        assert dump_config(cfg)["checkpoint"]["resume"] == text
    cfg = load()
    cfg.checkpoint.resume = "latest"  # an assignment is validated, and parsed, too
    assert cfg.checkpoint.resume_form == ResumeForm("latest", "latest")
    with pytest.raises(ValueError, match="resume\n  Value error, empty"):
        cfg.checkpoint.resume = ""


def test_malformed_yaml_names_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    bad = tmp_path / "bad.yaml"
    bad.write_text("optim:\n  lr: [1, 2\ntrain: {}\n")
    assert cli_main(["config", "show", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.yaml" in err and "malformed YAML" in err and "line" in err


def test_bad_input_from_the_real_command_does_no_work(tmp_path: Path):
    done = hpctrain("train", "optim.lr=abc", "run.out_dir=out", cwd=tmp_path)
    assert done.code == 2
    assert "optim.lr='abc'" in done.err and len(done.err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
    done = hpctrain("train", "run.out_dir=out", cwd=tmp_path, env=clean_env(LR="fast"))
    assert done.code == 2 and "environment LR" in done.err


def test_presets_are_importable_and_valid():
    for name, factory in presets.PRESETS.items():
        assert isinstance(factory(), dict)
        cfg = load(preset=name)
        assert cfg.run.name == (name if name != "none" else "default")  # no config file: the preset names it
    assert load(preset="multi_node").slurm.nodes == 2


def test_schedule_milestones_are_cumulative():
    sched = ScheduleConfig.model_validate(
        {
            "stages": [
                {"type": "linear", "num_updates": 10, "start_factor": 0.0, "end_factor": 1.0},
                {"type": "cosine", "num_updates": -1, "start_factor": 1.0, "end_factor": 0.1},
                {"type": "linear", "num_updates": 20, "start_factor": 0.1, "end_factor": 0.0},
            ]
        }
    )
    lr = LRSchedule(sched, total_updates=1000)
    factors = [lr.factor(u) for u in range(1000)]
    assert factors[0] == 0.0 and factors[5] == pytest.approx(0.5)
    assert factors[10] == pytest.approx(1.0)  # the cosine starts where warmup ended
    assert factors[979] == pytest.approx(0.1, abs=1e-3)  # cosine ends at 980 (1000 - 20 of cooldown)
    assert factors[980] == pytest.approx(0.1)
    assert factors[990] == pytest.approx(0.05)
    # never sits at 0 in the middle (the per-stage milestone bug of the seed project)
    assert min(factors[1:990]) > 0.04
    assert all(not math.isnan(f) for f in factors)


def test_lr_scaling_with_global_batch():
    cfg = OptimConfig(lr=1e-3, lr_scaling="linear", base_batch_size=64)
    assert effective_lr(cfg, 256) == pytest.approx(4e-3)
    cfg = OptimConfig(lr=1e-3, lr_scaling="sqrt", base_batch_size=64)
    assert effective_lr(cfg, 256) == pytest.approx(2e-3)
    assert effective_lr(OptimConfig(lr=1e-3), 256) == 1e-3


def test_script_variables_with_the_prefix_are_not_config():
    """HPCTRAIN_HOME (set by the sbatch templates) must not be read as a config key."""
    cfg = load(environ={"HPCTRAIN_HOME": "/work/project", "HPCTRAIN_TRAIN__TOTAL_UPDATES": "12"})
    assert cfg.train.total_updates == 12


SECRET = "s3cr3tTokenValue0123456789"


@pytest.mark.parametrize(
    ("verb", "source", "expected"),
    [
        (
            "train",
            {"arg": f"data.pelican.token={SECRET}"},
            "error: data.pelican.token is a secret and may not be given on the command line "
            "(data.pelican.token=...), where process lists, shell history and job records keep it: put the "
            "token in a file only you can read and set data.pelican.token_file=PATH, or put BEARER_TOKEN=... "
            "in .env",
        ),
        (
            "submit",
            {"arg": f"logging.wandb.api_key={SECRET}"},
            "error: logging.wandb.api_key is a secret and may not be given on the command line "
            "(logging.wandb.api_key=...), where process lists, shell history and job records keep it: put "
            "WANDB_API_KEY=... in .env (or in the environment as WANDB_API_KEY)",
        ),
        (
            "train",
            {"arg": f"data.pelican={{token: {SECRET}}}"},
            "error: data.pelican.token is a secret and may not be given on the command line (data.pelican=...)",
        ),
        (
            "train",
            {"env": {"HPCTRAIN_DATA__PELICAN__TOKEN": SECRET}},
            "error: data.pelican.token is a secret and may not be given in the environment variable "
            "HPCTRAIN_DATA__PELICAN__TOKEN, where",
        ),
        (
            "config",
            {"arg": f"logging.wandb.apikey={SECRET}"},  # misspelt: unknown, and still never echoed
            "error: logging.wandb.apikey=***: unknown key (did you mean logging.wandb.api_key?) "
            "(from override logging.wandb.apikey=***)",
        ),
    ],
)
def test_secrets_on_the_command_line_are_refused_without_echo(
    tmp_path: Path, verb: str, source: dict, expected: str
) -> None:
    args = [verb, "show"] if verb == "config" else [verb]
    if "arg" in source:
        args.append(source["arg"])
    done = hpctrain(
        *args, f"run.out_dir={tmp_path / 'logs'}", cwd=tmp_path, env=clean_env(**source.get("env", {}))
    )
    assert done.code == 2
    assert done.err.strip().startswith(expected) and len(done.err.strip().splitlines()) == 1
    assert SECRET not in done.err + done.out
    assert not (tmp_path / "logs").exists()


def test_secrets_from_dotenv_and_token_files_are_accepted_and_masked(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text(f"BEARER_TOKEN={SECRET}\nWANDB_API_KEY={SECRET}x\n")
    done = hpctrain("config", "show", cwd=tmp_path)
    assert done.code == 0, done.err
    assert SECRET not in done.out + done.err
    assert "token: '**********'" in done.out and "api_key: '**********'" in done.out
    cfg = load(env_file=str(tmp_path / ".env"))
    assert cfg.data.pelican.token.get_secret_value() == SECRET


def test_argv_scrubbing_masks_secret_looking_values() -> None:
    from hpctrain.config.keys import secret_keys
    from hpctrain.config.secrets import scrub_argv

    assert secret_keys(config_model()) == {"data.pelican.token", "logging.wandb.api_key"}
    argv = ["-m", "hpctrain", "train", "optim.lr=2", f"data.pelican.token={SECRET}", f"--api-key={SECRET}"]
    assert scrub_argv(argv) == [
        "-m",
        "hpctrain",
        "train",
        "optim.lr=2",
        "data.pelican.token=***",
        "--api-key=***",
    ]


def test_unreadable_config_and_env_files_and_infinite_values_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "bin.yaml").write_bytes(b"\xff\xfe\x00garbage")
    (tmp_path / "badenv").write_bytes(b"BEARER_TOKEN\n\xff=1\n")
    (tmp_path / "configs").mkdir()
    # a line dotenv cannot parse would drop its setting with a warning naming neither file nor line
    (tmp_path / "openquote.env").write_text('TOTAL_UPDATES=5\nBEARER_TOKEN="tok-123-secret\n')
    (tmp_path / "prose.env").write_text("# paths\nthis is not a setting\n")
    cases = {
        ("--config", "bin.yaml"): "error: config file 'bin.yaml' is not UTF-8 text (byte 0)",
        ("--env-file", "badenv"): "error: env file 'badenv' is not UTF-8 text",
        ("--env-file", "missing.env"): "error: env file 'missing.env' does not exist",
        ("--env-file", "configs"): "error: env file 'configs' is a folder",
        (
            "--env-file",
            "openquote.env",
        ): "error: env file 'openquote.env' line 2 (setting BEARER_TOKEN) is not",
        ("--env-file", "prose.env"): "error: env file 'prose.env' line 2 is not NAME=value",
        ("--config", "configs"): "error: config file 'configs' is a folder",
        ("optim.lr=inf",): "error: optim.lr='inf': Input should be a finite number",
        ("optim.lr=-inf",): "error: optim.lr='-inf': Input should be a finite number",
    }
    for args, start in cases.items():
        done = hpctrain("config", "show", *args, cwd=tmp_path)
        assert done.code == 2, (args, done.err)
        assert done.err.startswith(start) and len(done.err.strip().splitlines()) == 1, (args, done.err)
        assert "tok-123-secret" not in done.err
    # the default .env may be missing or a folder (a virtualenv named .env): nothing is read, nothing refused
    (tmp_path / ".env").mkdir()
    assert hpctrain("config", "show", cwd=tmp_path).code == 0


def test_best_metric_auto_is_the_models_own_and_a_named_one_is_kept():
    """checkpoint.best_metric=auto (the default) is resolved into the config: a muon generator's best.pt follows
    its judge (val_auc), every other model its val_loss; a named metric is kept (issue 43)."""
    from hpctrain.config.identity import MAY_CHANGE, classify

    assert load().checkpoint.best_metric == "val_loss"
    assert load("model.type=muon_multiplicity").checkpoint.best_metric == "val_loss"
    for model in ("muon_flow", "muon_wgan"):
        cfg = load(f"model.type={model}")
        assert cfg.checkpoint.best_metric == "val_auc" and cfg.checkpoint.best_mode == "min"
        assert dump_config(cfg)["checkpoint"]["best_metric"] == "val_auc"  # what config.yaml and status read
        assert (
            load(f"model.type={model}", "checkpoint.best_metric=val_loss").checkpoint.best_metric
            == "val_loss"
        )
    # which checkpoint is kept watches the run, it does not make another one: a hop may change it
    marks = classify(load())
    assert marks["checkpoint.best_metric"] == marks["checkpoint.best_mode"] == MAY_CHANGE


@pytest.mark.parametrize("mask", ["**********", "***", "  *****  "])
def test_a_masked_secret_read_back_is_unset_and_said(tmp_path: Path, mask: str) -> None:
    """U6: a saved config.yaml writes secrets as '**********'; given back with --config (as the docs suggest) the
    mask is no key or token: unset, named once at start, and never sent (a real one from .env still wins)."""
    saved = tmp_path / "config.yaml"
    saved.write_text(f"logging:\n  wandb:\n    api_key: '{mask}'\ndata:\n  pelican:\n    token: '{mask}'\n")
    cfg = load(config=str(saved))
    assert cfg.logging.wandb.api_key is None and cfg.data.pelican.token is None
    (tmp_path / ".env").write_text(f"BEARER_TOKEN={mask}\nWANDB_API_KEY=real-key-123\n")
    cfg = load(config=str(saved), env_file=str(tmp_path / ".env"))
    assert cfg.data.pelican.token is None
    assert cfg.logging.wandb.api_key.get_secret_value() == "real-key-123"
    done = hpctrain("config", "show", "--config", str(saved), cwd=tmp_path)
    assert done.code == 0, done.err
    notes = [line for line in done.err.splitlines() if "masked value" in line]
    assert len(notes) == 1 and "logging.wandb.api_key" in notes[0] and "data.pelican.token" in notes[0]


def test_a_masked_token_in_the_environment_or_a_token_file_is_never_sent(tmp_path: Path) -> None:
    from hpctrain.config.remote import PelicanConfig
    from hpctrain.remote.auth import resolve_token

    assert resolve_token(PelicanConfig(), {"BEARER_TOKEN": "**********"}) is None
    assert PelicanConfig(token="**********").token is None
    token_file = tmp_path / "token"
    token_file.write_text("**********\n")
    with pytest.raises(ValueError, match="holds a mask"):
        resolve_token(PelicanConfig(token_file=str(token_file)), {})
    from hpctrain.track.sync import sync_environment

    assert "WANDB_API_KEY" not in sync_environment(None, {"WANDB_API_KEY": "**********"})
