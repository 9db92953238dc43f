"""A tiny muon_flow run exported and loaded from a plain script with the run folder and its data gone: the
generator's state dict rebuilds it outside hpctrain, and `hpctrain.load(EXPORT).sampler` gives the very bundles
`hpctrain sample RUN` wrote (and `hpctrain sample EXPORT` writes), for primaries by named columns with units."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

from hpctrain.commands.train import run
from hpctrain.errors import EXIT_OK
from hpctrain.runtime.env import ClusterEnv
from hpctrain.workloads.muons.events import layouts
from tests.conftest import clean_env, hpctrain
from tests.workloads.muons.conftest import write_set
from tests.workloads.muons.test_model_run import FLOW_MODEL, make_cfg


def test_muon_flow_export_and_sampler_from_a_plain_script(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_set(data / "train", files=2, events=160, row_group=40, seed=3)
    write_set(data / "val", files=1, events=60, row_group=60, seed=4)
    cfg = make_cfg(data, tmp_path, FLOW_MODEL, "checkpoint.best_metric=val_loss", "optim.lr=5e-3")
    assert run(cfg, ClusterEnv()) == EXIT_OK
    folder = tmp_path / "t"
    summary = json.loads((folder / "summary.json").read_text())

    out = tmp_path / "exported"
    done = hpctrain("export", str(folder), "--out", str(out), cwd=tmp_path)
    assert done.code == 0, done.err
    meta = json.loads((out / "export.json").read_text())
    assert sorted(meta["networks"]) == ["generator"] and meta["sampler"] is True
    assert meta["params_sha256"] == summary["params_sha256"] and meta["step"] == 10
    assert "trained.sampler.sample(" in (out / "README.md").read_text()

    reference = tmp_path / "cli.parquet"
    done = hpctrain(
        "sample", str(folder), "--events", "120", "--seed", "3", "--batch-size", "50", "--out", str(reference),
        cwd=tmp_path,
    )  # fmt: skip
    assert done.code == 0, done.err

    # the run folder and its data leave this machine: only the export is left
    shutil.move(str(tmp_path / "t"), str(tmp_path / "gone-run"))
    shutil.move(str(data), str(tmp_path / "gone-data"))
    again = tmp_path / "again.parquet"
    done = hpctrain(
        "sample", str(out), "--events", "120", "--seed", "3", "--batch-size", "50", "--out", str(again),
        cwd=tmp_path,
    )  # fmt: skip
    assert done.code == 0, done.err
    assert "events (" in done.out and "have a multiplicity at the model's cap of" in done.out
    assert str(tmp_path) not in (out / "export.json").read_text() + (out / "README.md").read_text()
    assert str(tmp_path) not in (out / "config.yaml").read_text()
    folder = Path(".")  # the export, from inside it

    body = f"""
        import importlib, json
        import numpy as np
        import torch
        import hpctrain
        from hpctrain.errors import UserError

        meta = json.load(open("export.json"))
        net = meta["networks"]["generator"]
        module, _, name = net["class"].rpartition(".")
        rebuilt = getattr(importlib.import_module(module), name)(**net["settings"])
        rebuilt.load_state_dict(torch.load(net["file"], weights_only=True))

        trained = hpctrain.load({str(folder)!r})
        generator = trained.models["generator"]
        assert not generator.training and trained.step == 10 and trained.model_type == "muon_flow"
        assert trained.run_dir is None and len(repr(trained).splitlines()) <= 6
        assert all(torch.equal(a, b) for a, b in zip(rebuilt.state_dict().values(), generator.state_dict().values()))
        torch.manual_seed(11)
        expected = torch.rand(3)
        torch.manual_seed(11)
        events = trained.sampler.sample(120, seed=3, batch_size=50)
        assert torch.equal(torch.rand(3), expected)  # the caller's RNG is left as it was
        again = trained.sampler.sample(120, seed=3, batch_size=50)
        assert np.array_equal(again.muons, events.muons)
        fixed = trained.sampler.generate(events.primaries[:5], counts=np.array([0, 1, 2, 3, 4]))
        assert fixed.counts.tolist() == [0, 1, 2, 3, 4] and len(fixed.muons) == 10
        # named columns with units: the same bundles as the plain array in the documented order
        p = events.primaries[:20].astype(np.float64)
        plain = trained.sampler.generate(p, seed=5)
        columns = {{"energy_GeV": p[:, 0], "zenith_rad": p[:, 1], "mass_GeV": p[:, 2], "depth_m": p[:, 3]}}
        by_name = trained.sampler.generate(columns, seed=5)
        cosine = dict(columns, cos_zenith=np.cos(p[:, 1]))
        del cosine["zenith_rad"]
        by_cosine = trained.sampler.generate(cosine, seed=5)
        assert np.array_equal(plain.counts, by_name.counts) and np.array_equal(plain.muons, by_name.muons)
        assert np.allclose(by_cosine.primaries[:, 1], p[:, 1], atol=1e-5)
        assert trained.sampler.at_cap == 0 and trained.sampler.cap > 0
        # the documented mistake, a cosine in the zenith's place or the order mixed: one line each
        for wrong, said in (
            ([[1e6, 1.7, 0.938, 1500.0]], "row 0: zenith_rad 1.7 is outside [0, pi/2]"),
            ([[0.938, 0.1, 1e6, 1500.0], [1e6, 0.1, 0.938, -3.0]], "row 1: depth_m -3 is not positive"),
            ({{"energy": [1e6], "zenith_rad": [0.1], "mass_GeV": [1.0], "depth_m": [1.0]}}, "no column energy_GeV"),
            ({{**columns, "cos_zenith": np.cos(p[:, 1])}}, "both zenith_rad and cos_zenith given"),
        ):
            try:
                trained.sampler.generate(wrong)
            except UserError as err:
                assert said in str(err) and "\\n" not in str(err), str(err)
            else:
                raise AssertionError(f"accepted {{wrong}}")
        for device, said in (("cuda:7", "device='cuda:7'"), ("nonsense", "no such device")):
            try:
                hpctrain.load({str(folder)!r}, device=device)
            except UserError as err:
                assert said in str(err), str(err)
            else:
                assert torch.cuda.device_count() > 7
        np.savez("api.npz", primaries=events.primaries, muons=events.muons, counts=events.counts)
        print("ok")
    """
    path = tmp_path / "api.py"
    path.write_text(textwrap.dedent(body))
    api = subprocess.run(
        [sys.executable, str(path)], cwd=out, env=clean_env(), capture_output=True, text=True, timeout=180
    )
    assert api.returncode == 0 and api.stdout.strip() == "ok", api.stderr
    _, cli = layouts.read_all(str(reference))
    _, from_export = layouts.read_all(str(again))
    ours = np.load(out / "api.npz")
    assert len(cli) == 120 and int(cli.counts.sum()) > 0
    for key in ("primaries", "muons", "counts"):
        assert np.array_equal(ours[key], getattr(cli, key)), key
        assert np.array_equal(getattr(from_export, key), getattr(cli, key)), key
