"""The cosmology seed's lines: `data.kind=des` reads the user's survey maps (one line naming what is missing when
they are not there), TRAIN_SAMPLES/VAL_SAMPLES take the first maps of a folder, and `sbatch slurm/single_gpu.sh
--export=EPOCHS=200,DATA_TYPE=2lpt` resolves to the fields workload (its config, as the template's check sees it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hpctrain.commands.train import run
from hpctrain.config.loading import ConfigRequest
from hpctrain.config.messages import error_line
from hpctrain.errors import EXIT_OK, UserError
from hpctrain.runtime.env import ClusterEnv
from hpctrain.workloads.fields.task import FieldTask
from hpctrain.workloads.registry import resolve
from tests.conftest import ROOT, clean_env, read_jsonl

TINY = ["data.size=16", "data.batch_size=8", "model.widths=[8]", "model.groups=4", "model.head_hidden=8",
        "model.stem_stride=1", "train.device=cpu", "train.threads=1", "logging.progress=lines"]  # fmt: skip


def _survey(root: Path, n_train: int = 40, n_val: int = 16, mask: bool = True) -> Path:
    rng = np.random.default_rng(0)
    for split, n in (("train", n_train), ("val", n_val)):
        (root / split).mkdir(parents=True)
        params = np.column_stack([rng.uniform(0.1, 0.5, n), rng.uniform(0.6, 1.0, n)])
        # a map whose amplitude follows sigma_8: something to learn
        maps = rng.standard_normal((n, 16, 16)) * params[:, 1, None, None]
        np.save(root / split / "maps.npy", maps.astype(np.float32))
        np.save(root / split / "params.npy", params)
    if mask:
        observed = np.ones((16, 16))
        observed[:4] = 0
        np.save(root / "mask.npy", observed)
    return root


def _cfg(*overrides: str):
    return resolve(ConfigRequest(overrides=["model.type=field_cnn", *TINY, *overrides]))[0]


def test_survey_maps_train_masked_and_the_sample_counts_take_the_first_maps(tmp_path: Path) -> None:
    survey = _survey(tmp_path / "des")
    out = f"run.out_dir={tmp_path / 'logs'}"
    cfg = _cfg("data.kind=des", f"data.path={survey}", "data.n_train=24", "data.n_val=8", out, "run.name=d",
               "train.total_updates=6", "train.eval_every=3")  # fmt: skip
    task = FieldTask(cfg, ClusterEnv())
    maps, params = task.dataset("train").__getitems__([0, 23])
    assert maps.shape == (2, 1, 16, 16) and float(maps[:, :, :4].abs().max()) == 0.0  # masked rows
    assert np.allclose(params.numpy(), np.load(survey / "train" / "params.npy")[[0, 23]], atol=1e-6)
    assert len(task.dataset("train")) == 24 and len(task.dataset("val")) == 8 and task.dataset("test") is None
    assert run(cfg, ClusterEnv()) == EXIT_OK
    evals = [r for r in read_jsonl(tmp_path / "logs" / "d" / "metrics.jsonl") if "val_loss" in r]
    assert [r["step"] for r in evals] == [3, 6]


@pytest.mark.parametrize(
    ("layout", "said"),
    [
        ("no path", "data.kind=des reads your survey maps from data.path, which is not set"),
        ("no train", "(data.kind=des): no train/ folder there"),
        ("no params", "train/ has no params.npy; the survey maps go into"),
        ("bad params", "params.npy: shape (40, 3), not (40, 2)"),
    ],
)
def test_survey_mistakes_are_one_line(layout: str, said: str, tmp_path: Path) -> None:
    survey = tmp_path / "des"
    if layout == "no train":
        survey.mkdir()
    elif layout != "no path":
        _survey(survey, mask=False)
    if layout == "no params":
        (survey / "train" / "params.npy").unlink()
    if layout == "bad params":
        np.save(survey / "train" / "params.npy", np.zeros((40, 3)))
    with pytest.raises(UserError) as refused:
        FieldTask(
            _cfg("data.kind=des", *([] if layout == "no path" else [f"data.path={survey}"])), ClusterEnv()
        )
    line = error_line(refused.value)
    assert said in line and "\n" not in line, line


def test_the_seed_line_trains_the_fields_workload_with_its_names(tmp_path: Path) -> None:
    script = (
        "source slurm/common.sh; hpctrain_default_preset=single_gpu; "
        "hpctrain_parse_args --export=EPOCHS=200,DATA_TYPE=2lpt,VAL_SAMPLES=10 || exit 9; "
        'cd "$1" && exec hpctrain config show "${HPCTRAIN_ARGS[@]}"'
    )
    env = clean_env(PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    done = subprocess.run(
        ["bash", "-c", script, "-", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    for line in ("type: field_cnn", "kind: 2lpt  # from environment DATA_TYPE",
                 "n_val: 10  # from environment VAL_SAMPLES", "epochs: 200.0  # from environment EPOCHS"):  # fmt: skip
        assert line in done.stdout, line
