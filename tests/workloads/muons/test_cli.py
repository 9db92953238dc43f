from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.cli import main
from hpctrain.workloads.muons.events import layouts


@pytest.mark.parametrize("layout", layouts.LAYOUTS)
def test_generate_then_inspect(tmp_path: Path, layout: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / layout
    code = main(
        [
            "data",
            "generate",
            "--out",
            str(out),
            "--files",
            "2",
            "--events-per-file",
            "50",
            "--layout",
            layout,
            "--seed",
            "3",
            "--row-group-size",
            "20",
        ]
    )
    assert code == 0
    files = sorted(out.iterdir())
    assert len(files) == 2
    assert layouts.read_all(str(files[0]))[0] == layout
    capsys.readouterr()
    assert main(["data", "inspect", str(files[1]), "--events", "2"]) == 0
    text = capsys.readouterr().out
    assert f"layout {layout}" in text and "events 50," in text and "multiplicity:" in text
    assert "[1, 0] |" in text and "[1, 2] |" not in text
    assert "| muons [E_GeV, x_m, y_m]" in text  # every column labelled with its unit


def test_generate_is_deterministic(tmp_path: Path) -> None:
    for name in ("a", "b"):
        assert main(["data", "generate", "--out", str(tmp_path / name), "--events-per-file", "30"]) == 0
    _, a = layouts.read_all(str(tmp_path / "a" / "muons-00000.parquet"))
    _, b = layouts.read_all(str(tmp_path / "b" / "muons-00000.parquet"))
    assert (a.muons == b.muons).all() and (a.counts == b.counts).all()


def test_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["data", "generate", "--out", str(tmp_path), "--files", "0"]) == 2
    assert main(["data", "generate", "--out", str(tmp_path), "--layout", "csv"]) == 2
    assert main(["data", "inspect", str(tmp_path / "missing.parquet")]) == 2
    assert main(["data"]) == 2
    err = capsys.readouterr().err
    assert "--files must be at least 1" in err and "mounted" in err and "invalid choice: 'csv'" in err
    # an --out that cannot be a folder: one line naming it, for the muon files and (through the command's own
    # net for a path the verb did not check) the fields splits
    (tmp_path / "afile").write_text("precious")
    assert main(["data", "generate", "--out", str(tmp_path / "afile"), "--events-per-file", "5"]) == 2
    assert main(["data", "generate", "--kind", "fields", "--out", str(tmp_path / "afile"), "--n", "2"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        f"error: --out {tmp_path / 'afile'}: cannot be the folder for the files (File exists)",
        f"error: {tmp_path / 'afile' / 'train'}: Not a directory",
    ]
    assert (tmp_path / "afile").read_text() == "precious"


def test_generate_never_replaces_data_files_without_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A second `data generate` into the same --out (muon files, or fields shards and meta.json) is one line, exit
    2, every file as it was and none added; --overwrite replaces; array tasks writing their shares of one set
    refuse nothing of each other's."""
    out = tmp_path / "muons"
    small = ["data", "generate", "--out", str(out), "--events-per-file", "5"]
    assert main([*small, "--files", "2"]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert main([*small, "--files", "3", "--seed", "7"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: --out {out} already holds 2 of the files this would write (muons-00000.parquet, "
        "muons-00001.parquet): nothing was written; choose another --out, or add --overwrite to replace them"
    ]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert main([*small, "--files", "1", "--first-file", "2"]) == 0  # the next files of the set: new names
    assert main([*small, "--files", "1", "--seed", "7", "--overwrite"]) == 0
    assert (out / "muons-00000.parquet").read_bytes() != before["muons-00000.parquet"]
    fields = ["data", "generate", "--kind", "fields", "--size", "8", "--shard-size", "2", "--n-test", "0"]
    shares = [*fields, "--out", str(tmp_path / "f"), "--n", "4", "--n-val", "2"]
    assert main([*shares, "--share", "0/2"]) == 0 and main([*shares, "--share", "1/2"]) == 0
    assert (tmp_path / "f" / "train" / "meta.json").is_file() and (
        tmp_path / "f" / "val" / "meta.json"
    ).is_file()
    kept = {p: p.read_bytes() for p in (tmp_path / "f").rglob("*") if p.is_file()}
    capsys.readouterr()
    for again in ([*shares, "--share", "1/2"], shares, [*shares, "--layout", "npy", "--n", "2"]):
        assert main(again) == 2
    for line in capsys.readouterr().err.strip().splitlines():
        assert line.startswith(f"error: --out {tmp_path / 'f'} already holds ") and "--overwrite" in line
    assert {p: p.read_bytes() for p in (tmp_path / "f").rglob("*") if p.is_file()} == kept
    assert main([*shares, "--overwrite"]) == 0
