"""`hpctrain evaluate --sample FILES --data FILES`: a sample from anywhere judged against true files of any layout,
through the CLI on small files: a fresh truth draw for the same primaries is accepted, a copy whose muon
positions are shuffled within events is rejected, and the errors a user can cause are one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hpctrain.cli import main
from hpctrain.runtime.seeding import numpy_rng
from hpctrain.workloads.muons.data_verbs import synthetic_events
from hpctrain.workloads.muons.evaluation import judge_files, quality
from hpctrain.workloads.muons.events import layouts
from hpctrain.workloads.muons.truth import v1 as truth
from tests.conftest import hpctrain

EVENTS = 1500  # per file, 2 files: enough pairs for the shuffled copy to stand out (AUC ~0.7 vs band ~0.52)
FAST = ("--folds", "2", "--null-replicates", "1", "--seed", "3")


def _with_bundles(events: layouts.Events, muons: np.ndarray, counts: np.ndarray) -> layouts.Events:
    return layouts.Events(events.primaries, muons.astype(np.float32), counts.astype(np.int64), events.ids)


def _shuffled(events: layouts.Events, rng: np.random.Generator) -> layouts.Events:
    """The muons' positions (x, y) permuted among the muons of each event; energies and counts stay."""
    event = np.repeat(np.arange(len(events)), events.counts)
    order = np.argsort(event + rng.random(len(event)))
    muons = events.muons.copy()
    muons[:, 1:] = events.muons[order, 1:]
    return _with_bundles(events, muons, events.counts)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """True files (Parquet), a fresh truth draw for their primaries (HDF5), a shuffled copy (legacy Parquet)
    and a sample of other primaries."""
    root = tmp_path_factory.mktemp("judge_files")
    out = {name: root / name for name in ("data", "fresh", "shuffled", "other")}
    for folder in out.values():
        folder.mkdir()
    rng = numpy_rng(11, 0)
    for i in range(2):
        true = synthetic_events(EVENTS, 4, i)
        layouts.write_events(str(out["data"] / f"t{i}.parquet"), true, "parquet", 500)
        fresh = _with_bundles(true, *truth.sample_bundles(true.primaries.astype(np.float64), rng))
        layouts.write_events(str(out["fresh"] / f"f{i}.h5"), fresh, "hdf5", 500)
        layouts.write_events(
            str(out["shuffled"] / f"s{i}.parquet"), _shuffled(true, rng), "parquet-legacy", 500
        )
    layouts.write_events(str(out["other"] / "o.parquet"), synthetic_events(100, 5, 0), "parquet", 100)
    return out


def test_a_fresh_truth_draw_is_accepted(files: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "fresh.json"
    done = hpctrain(
        "evaluate", "--sample", str(files["fresh"]), "--data", str(files["data"]), "--out", str(out), *FAST,
        cwd=tmp_path,
    )  # fmt: skip
    assert done.code == 0, done.err
    assert "classifier two-sample test" in done.out and "min_feature_ratio" in done.out
    for name in quality.FEATURES:
        assert any(line.strip().startswith(name) for line in done.out.splitlines()), (name, done.out)
    result = json.loads(out.read_text())
    judged = result["two_sample"]
    assert result["info"]["events"] == 2 * EVENTS and result["info"]["sample_layouts"] == ["hdf5"]
    assert judged["accepted"] and judged["null_source"] == "swap", judged
    assert judged["auc"] <= judged["auc_null_upper"] < 0.56
    assert [row["bin"] for row in judged["table"]] == ["all", "E3-5", "E5-6", "E6-7", "E7-8", "E8-9"]
    assert result["metrics"]["auc"] == judged["auc"] and "auc_E8-9" in result["metrics"]
    assert set(result["quality"]["features"]) == set(quality.FEATURES)


def test_a_copy_with_positions_shuffled_within_events_is_rejected(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "shuffled.json"
    code = main(
        [
            "evaluate",
            "--sample",
            str(files["shuffled"]),
            "--data",
            str(files["data"]),
            "--out",
            str(out),
            *FAST,
        ]
    )
    assert code == 0
    assert "DIFFERS" in capsys.readouterr().out
    judged = json.loads(out.read_text())["two_sample"]
    assert not judged["accepted"] and judged["auc"] > 0.6, judged
    by_bin = {row["bin"]: row for row in judged["table"]}
    assert not by_bin["E8-9"]["within_null"]  # the most muons per event: the correlation lost is seen most


@pytest.mark.parametrize(
    "case, words",
    [
        ("missing", "no such file"),
        ("not_muons", "neither Parquet nor HDF5"),
        ("other_primaries", "no event of the same primary"),
        ("model_too", "without a model"),
        ("folds", "--folds must be at least 2"),
    ],
)
def test_user_errors_are_one_line_exit_2(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, words: str
) -> None:
    (tmp_path / "notes.txt").write_text("not muons\n")
    sample, extra = str(files["fresh"]), []
    if case == "missing":
        sample = str(tmp_path / "nowhere.parquet")
    elif case == "not_muons":
        sample = str(tmp_path / "notes.txt")
    elif case == "other_primaries":
        sample = str(files["other"])
    elif case == "model_too":
        extra = [str(tmp_path)]
    elif case == "folds":
        extra = ["--folds", "1"]
    code = main(["evaluate", *extra, "--sample", sample, "--data", str(files["data"])])
    err = capsys.readouterr().err
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err


def test_pairs_follow_the_primaries_not_the_order(files: dict[str, Path]) -> None:
    _, true = layouts.read_all(str(files["data"] / "t0.parquet"))
    rng = np.random.default_rng(0)
    rows = rng.permutation(len(true))[:200]
    sample = judge_files.take(true, rows)
    got_s, got_d = judge_files.pair_by_primary(sample, true)
    assert np.array_equal(rows[got_s], got_d) and np.all(np.diff(got_d) > 0)
    assert np.array_equal(judge_files.take(sample, got_s).muons, judge_files.take(true, got_d).muons)
