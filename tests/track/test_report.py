"""`hpctrain report`: real PNGs of the expected size and an HTML page that shows them."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image
import numpy as np

from hpctrain.cli import main


def _run_folder(run: Path, with_eval: bool) -> None:
    run.mkdir(parents=True)
    lines = []
    for step in range(10, 130, 10):
        lines.append(
            {
                "step": step,
                "loss": 1 / step,
                "loss_mean": 1.2 / step,
                "lr": 1e-3 * (1 - step / 200),
                "updates_per_s": 50.0 + step % 30,
                "samples_per_s": 1600.0,
                "data_share": 0.1,
                "step_share": 0.7,
                "eval_share": 0.05,
                "checkpoint_share": 0.02,
            }
        )
        if step % 40 == 0:
            lines.append({"step": step, "val_loss": 1.1 / step})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    hops = [
        {
            "hop": 0,
            "job_id": "101",
            "nodes": "n1",
            "start": 1000.0,
            "end": 1100.0,
            "first_update": 0,
            "last_update": 40,
            "exit_reason": "time budget",
            "train_seconds": 70.0,
            "goodput": 0.7,
        },
        {
            "hop": 1,
            "job_id": "102",
            "nodes": "n2",
            "start": 1200.0,
            "end": 1300.0,
            "first_update": 40,
            "last_update": 120,
            "exit_reason": "finished",
            "train_seconds": 80.0,
            "goodput": 0.8,
        },
    ]
    (run / "chain.json").write_text(json.dumps(hops))
    (run / "summary.json").write_text(
        json.dumps({"status": "finished", "step": 120, "hops": 2, "run_goodput": 0.75})
    )
    if with_eval:
        edges = list(range(21))
        evaluation = {
            "distributions": {
                "multiplicity": {
                    "label": "muon multiplicity",
                    "unit": "muons per event",
                    "bins": edges,
                    "generated": [30 - i for i in range(20)],
                    "true": [31 - i for i in range(20)],
                    "log_y": True,
                },
                "energy": {
                    "label": "muon energy",
                    "unit": "GeV",
                    "log_x": True,
                    "generated_values": list(np.geomspace(1, 1000, 200)),
                    "true_values": list(np.geomspace(1, 2000, 300)),
                },
                "lateral_distance": {
                    "label": "lateral distance",
                    "unit": "m",
                    "bins": [0, 10, 20, 40],
                    "generated": [5, 3, 1],
                    "true": [6, 2, 1],
                },
            },
            "metrics": {"multiplicity_wasserstein": 0.12},
        }
        (run / "evaluate.json").write_text(json.dumps(evaluation))


def _check_png(path: Path) -> None:
    image = matplotlib.image.imread(path)
    assert image.shape[:2] == (450, 800), path
    assert np.ptp(image[..., :3]) > 0.5, f"{path} is blank"


def test_report_writes_pngs_and_html(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _run_folder(run, with_eval=True)
    assert main(["report", str(run), "--out", str(tmp_path / "out")]) == 0
    names = [
        "loss.png",
        "lr.png",
        "throughput.png",
        "time_shares.png",
        "dist_energy.png",
        "dist_lateral_distance.png",
        "dist_multiplicity.png",
    ]
    for name in names:
        _check_png(tmp_path / "out" / name)
    page = (tmp_path / "out" / "index.html").read_text()
    for name in names:
        assert f'src="{name}"' in page
    assert "time budget" in page and "multiplicity_wasserstein" in page


def test_report_default_folder_without_evaluation(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _run_folder(run, with_eval=False)
    assert main(["report", str(run)]) == 0
    assert sorted(p.name for p in (run / "report").glob("*.png")) == [
        "loss.png",
        "lr.png",
        "throughput.png",
        "time_shares.png",
    ]


def test_report_of_a_non_run_folder_is_a_one_line_error(tmp_path: Path, capsys) -> None:
    assert main(["report", str(tmp_path)]) == 2
    assert "metrics.jsonl" in capsys.readouterr().err
