"""A tiny muon_flow run exported and loaded from a plain script: the generator's state dict rebuilds it outside
hpctrain, and `hpctrain.load(run).sampler` gives the very bundles `hpctrain sample` writes."""

from __future__ import annotations

import json
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

    body = f"""
        import importlib, json
        import numpy as np
        import torch
        import hpctrain

        meta = json.load(open("export.json"))
        net = meta["networks"]["generator"]
        module, _, name = net["class"].rpartition(".")
        rebuilt = getattr(importlib.import_module(module), name)(**net["settings"])
        rebuilt.load_state_dict(torch.load(net["file"], weights_only=True))

        trained = hpctrain.load({str(folder)!r})
        generator = trained.models["generator"]
        assert not generator.training and trained.step == 10 and trained.model_type == "muon_flow"
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
    ours = np.load(out / "api.npz")
    assert len(cli) == 120 and int(cli.counts.sum()) > 0
    for key in ("primaries", "muons", "counts"):
        assert np.array_equal(ours[key], getattr(cli, key)), key
