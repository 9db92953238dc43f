"""`hpctrain report --compare`: one page for several runs: wall time from each record's `time` and `hop` (placed by
update within its hop for older records), the config keys that differ, final/best figures, the CLI's runs and
mistakes; on real trainings, without torch."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image as PILImage

from hpctrain.track.report.compare import config_table, figures_table, metric_groups, wall_hours
from hpctrain.track.report.data import RunData
from tests.conftest import clean_env, hpctrain
from tests.track.report_runs import fields_run


def _set_config(run: Path, **changes: object) -> None:
    config = json.loads((run / "config.yaml").read_text())  # report_runs writes JSON, which is YAML too
    for dotted, value in changes.items():
        section, key = dotted.split(".")
        config.setdefault(section, {})[key] = value
    (run / "config.yaml").write_text(json.dumps(config))


def test_wall_time_from_time_and_hop_else_placed_within_the_hop(tmp_path: Path) -> None:
    # report_runs' hops: #0 from t=1000 to 1100 (updates 0 -> 60), #1 from 1200 to 1300 (60 -> 120)
    old = RunData.load(fields_run(tmp_path / "old"))  # records without `time` and `hop`
    hours = wall_hours(old)
    at = {old.metrics[i]["step"]: h * 3600 for i, h in hours.items() if "loss" in old.metrics[i]}
    assert at[10] == pytest.approx(100 * 10 / 60) and at[60] == pytest.approx(100)
    assert at[90] == pytest.approx(
        100 + 100 * 30 / 60
    )  # hop 1 begins after hop 0's 100 s: the gap is left out

    new = tmp_path / "new"
    fields_run(new)
    records = [
        {"step": 30, "loss": 0.5, "time": 1040.0, "hop": 0},
        {
            "step": 90,
            "loss": 0.4,
            "time": 1290.0,
            "hop": 1,
        },  # late in its hop: its own time, not its update's
        {"step": 95, "loss": 0.4, "time": 1250.0},  # no hop (evaluate's record): the hop that did update 95
    ]
    (new / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    data = RunData.load(new)
    assert [wall_hours(data)[i] * 3600 for i in range(3)] == pytest.approx([40, 190, 150])
    (new / "chain.json").write_text("[]")  # no chain: only records with a time have one
    assert wall_hours(RunData.load(new)) == pytest.approx({0: 0.0, 1: 250 / 3600, 2: 210 / 3600})


def test_tables_name_what_differs_and_each_runs_final_and_best(tmp_path: Path) -> None:
    runs = [fields_run(tmp_path / "lr1"), fields_run(tmp_path / "lr2")]
    _set_config(runs[1], **{"optim.lr": 2e-5, "model.hidden": [64, 64]})
    data = [RunData.load(r) for r in runs]
    table = config_table(data, ["lr1", "lr2"])
    assert table.header == ["key", "lr1", "lr2"]
    assert table.rows == [["model.hidden", "(absent)", "[64, 64]"], ["optim.lr", "(absent)", "2e-05"]]
    assert config_table(data[:1] * 2, ["a", "b"]).rows == []

    groups = metric_groups(data)
    assert groups[0] == ("loss", ["loss_mean", "val_loss"]) and groups[-1] == ("learning rate", ["lr"])
    assert ("r2 omega m", ["val_r2_omega_m"]) in groups and all("share" not in t for t, _ in groups)
    figures = figures_table(data, ["lr1", "lr2"], groups)
    row = dict(zip(figures.header, figures.rows[0]))
    # best_metric val_r2_omega_m (mode min, the default): summary.json's best (0.5) wins over the logged ones
    assert row["best metric"] == "val_r2_omega_m (min)" and row["best"] == "0.5"
    assert row["final"] == f"{1 - 10 / 120:.4g}" and row["final val_loss"] == f"{-1 + 1.2 / 120:.4g}"
    assert row["updates"] == "120 of 120" and row["wall time"] == "0:03:20" and row["status"] == "finished"


def _report(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """`hpctrain report ARGS`, asserting that torch was never imported (a login node's verb)."""
    code = (
        "import sys; from hpctrain.cli import main; rc = main(['report', *sys.argv[1:]]); "
        "assert 'torch' not in sys.modules, 'report imported torch'; sys.exit(rc)"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=tmp_path, env=clean_env(), capture_output=True, text=True
    )


def test_compare_runs_and_folders_of_runs_and_refuse_mistakes_in_one_line(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    fields_run(logs / "a")
    fields_run(logs / "sweep" / "lr1")
    fields_run(logs / "sweep" / "lr2")
    (logs / "sweep" / "lr3").mkdir()
    (logs / "sweep" / "lr3" / "config.yaml").write_text("{}")  # queued, nothing logged yet
    done = _report(tmp_path, "--compare", "logs/sweep")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "report: logs/sweep/compare/index.html\n"
    assert done.stderr == "note: no metrics.jsonl yet, left out: logs/sweep/lr3\n"
    page = (logs / "sweep" / "compare" / "index.html").read_text()
    assert "<b>lr1</b>" in page and "<b>lr2</b>" in page and "lr3" not in page

    # a run and a folder, the same run twice: each run once, written beside them all
    done = _report(tmp_path, "--compare", "logs/a", "logs", "logs/sweep/lr1")
    assert done.returncode == 0 and done.stdout == "report: logs/compare/index.html\n", done.stderr
    page = (logs / "compare" / "index.html").read_text()
    assert re.findall(r"<li><b>(.*?)</b>", page) == ["a", "lr1", "lr2"]

    # the folder is not replaced silently: the same runs are redrawn, others refused (nothing changed), taken
    # with --overwrite, or written elsewhere with --out
    done = _report(tmp_path, "--compare", "logs/a", "logs/sweep/lr1", "logs/sweep/lr2")
    assert (
        done.returncode == 0 and done.stdout == "report: logs/compare/index.html (redrawn: the same runs)\n"
    )
    done = _report(tmp_path, "--compare", "logs/a", "logs/sweep/lr1")
    assert done.returncode == 2 and done.stderr == (
        "error: hpctrain report --compare: logs/compare holds a comparison of other runs (a, lr1, lr2); nothing "
        "was replaced: name another folder with --out DIR, or add --overwrite to replace it\n"
    )
    assert re.findall(r"<li><b>(.*?)</b>", (logs / "compare" / "index.html").read_text()) == [
        "a",
        "lr1",
        "lr2",
    ]
    done = _report(tmp_path, "--compare", "logs/a", "logs/sweep/lr1", "--out", "logs/a-lr1")
    assert done.returncode == 0 and done.stdout == "report: logs/a-lr1/index.html\n", done.stderr
    done = _report(tmp_path, "--compare", "logs/a", "logs/sweep/lr1", "--overwrite")
    assert done.returncode == 0, done.stderr
    assert re.findall(r"<li><b>(.*?)</b>", (logs / "compare" / "index.html").read_text()) == ["a", "lr1"]

    for args, message in [
        (["--compare", "logs/a"], "needs two runs or more, found 1 (logs/a)"),
        (["--compare", "logs/a", "logs/nope"], "logs/nope does not exist"),
        (["--compare", "logs/a", "logs/sweep/lr3"], "logs/sweep/lr3: no metrics.jsonl"),
        (["--compare", "logs/a", str(tmp_path)], "needs two runs or more"),  # too deep: logs/sweep/*
        (["logs/a", "--compare", "logs/sweep"], "'logs/a' before --compare: name every run after it"),
        ([], "name a run folder, or runs to compare with --compare"),
    ]:
        done = _report(tmp_path, *args)
        assert done.returncode == 2 and message in done.stderr, (args, done.stderr)
        assert done.stderr.splitlines()[-1].startswith("error: ") and "Traceback" not in done.stderr


def test_compare_real_runs_by_update_and_wall_time(tmp_path: Path) -> None:
    short = ["train.total_updates=40", "train.threads=1", "run.out_dir=logs"]
    for name, lr in (("lr1", "1e-3"), ("lr3", "3e-3")):
        done = hpctrain("train", *short, f"run.name={name}", f"optim.lr={lr}", cwd=tmp_path)
        assert done.code == 0, done.err
    out = tmp_path / "cmp"
    done = _report(tmp_path, "--compare", "logs/lr1", "logs/lr3", "--out", str(out))
    assert done.returncode == 0, done.stderr
    page = (out / "index.html").read_text()
    config = page[page.index('<table id="config">') :].split("</table>")[0]
    assert re.findall(r"<tr><td>(.*?)</td>", config) == ["optim.lr"]  # the only key that differs
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["compare_learning_rate.png", "compare_loss.png", "compare_mae.png", "compare_mse.png",
                    "compare_rmse.png"]  # fmt: skip
    with PILImage.open(out / "compare_loss.png") as image:
        caption = image.text["Description"]
        assert (
            caption.startswith("loss_mean (solid) and val_loss (dashed) of each run")
            and "No wall" not in caption
        )


def test_runs_of_generators_are_ordered_by_their_best_auc_with_the_goal_count(tmp_path: Path) -> None:
    runs = [fields_run(tmp_path / name) for name in ("x", "y", "z")]
    for run, aucs, met in zip(runs, ([0.6, 0.57], [0.52, 0.55], None), (6, 8, None)):
        records = [{"step": 60 * (i + 1), "val_auc": v} for i, v in enumerate(aucs or [])]
        records += [{"step": 120, "eval_features_goal_met": met, "eval_features_total": 10}] if met else []
        with open(run / "metrics.jsonl", "a") as fh:
            fh.write("".join(json.dumps(r) + "\n" for r in records))
    data = [RunData.load(r) for r in runs]
    table = figures_table(data, ["x", "y", "z"], metric_groups(data))
    rows = [dict(zip(table.header, row)) for row in table.rows]
    assert [(r["run"], r["best AUC"], r["goal"]) for r in rows] == [
        ("y", "0.52", "8/10"), ("x", "0.57", "6/10"), ("z", "-", "-")
    ]  # fmt: skip
    assert any(line.startswith("best AUC: ") for line in table.legend)
    plain = figures_table(data[2:] * 2, ["z1", "z2"], metric_groups(data[2:]))
    assert "best AUC" not in plain.header and not plain.legend
