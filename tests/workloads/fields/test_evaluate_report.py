"""A trained fields run evaluated on its held-out test maps, then reported: predicted vs true per parameter."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image as PILImage

from hpctrain.workloads.fields import evaluate
from tests.conftest import ROOT, hpctrain

TINY = ("data.size=16", "data.n_val=32", "data.n_test=48", "data.batch_size=16", "model.widths=[8,8]")


def test_test_maps_are_predicted_and_drawn(tmp_path: Path) -> None:
    args = ("train.total_updates=10", "train.eval_every=10", "checkpoint.every=10", "run.name=f")
    done = hpctrain("train", "--config", str(ROOT / "configs" / "fields.yaml"), *args, *TINY, cwd=tmp_path)
    assert done.code == 0, done.err
    run = tmp_path / "logs" / "f"
    done = hpctrain("evaluate", str(run), cwd=tmp_path)  # the registry routes a fields model here
    assert done.code == 0, done.err
    assert "on 48 test maps" in done.out and "omega_m  R2" in done.out
    result = json.loads((run / "evaluate.json").read_text())
    assert result == json.loads(
        json.dumps(evaluate.evaluate_run(run))
    )  # the verb wrote what evaluate_run gives
    assert result["info"] == {**result["info"], "maps": 48, "split": "test", "step": 10}
    for name in ("omega_m", "sigma_8"):
        p = result["predictions"][name]
        true, pred = np.asarray(p["true"]), np.asarray(p["predicted"])
        assert len(true) == len(pred) == len(p["sigma"]) == 48
        sst = np.sum((true - true.mean()) ** 2)
        assert np.isclose(result["metrics"][f"r2_{name}"], 1 - np.sum((pred - true) ** 2) / sst)
        assert np.isclose(result["metrics"][f"residual_std_{name}"], np.std(pred - true))
    done = hpctrain("report", str(run), cwd=tmp_path)
    assert done.code == 0, done.err
    with PILImage.open(run / "report" / "predicted_vs_true.png") as png:
        assert "Ω_m: predicted vs true" in png.text["Comment"]
