"""`hpctrain export` and `hpctrain.load` on a real training of the default job, used from plain scripts as a
physicist's notebook or old script would (subprocesses: nothing of the test's own imports helps them)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from hpctrain.errors import UserError
from tests.conftest import clean_env, hpctrain


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default job, 30 updates, a checkpoint every 10 (all kept), best.pt from the evaluations."""
    root = tmp_path_factory.mktemp("export")
    done = hpctrain(
        "train",
        "run.name=d",
        "train.total_updates=30",
        "train.eval_every=10",
        "checkpoint.every=10",
        "checkpoint.keep_last=5",
        cwd=root,
    )
    assert done.code == 0, done.err
    return root / "logs" / "d"


def script(path: Path, body: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run `body` as a plain Python file in a fresh interpreter."""
    path.write_text(textwrap.dedent(body))
    return subprocess.run(
        [sys.executable, str(path)], cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=180
    )


def test_export_is_plain_state_dicts_with_config_and_readme(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "exported"
    done = hpctrain("export", str(run), "--out", str(out), cwd=tmp_path)
    assert done.code == 0, done.err
    summary = json.loads((run / "summary.json").read_text())
    assert done.out.strip().endswith(f"params_sha256={summary['params_sha256']}")
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.yaml", "export.json", "model.pt"]
    meta = json.loads((out / "export.json").read_text())
    assert (meta["step"], meta["params_sha256"], meta["model_type"]) == (
        30,
        summary["params_sha256"],
        "regression",
    )
    assert meta["run"] == str(run.absolute()) and meta["networks"]["model"]["settings"] == {
        "in_features": 16,
        "hidden": [64, 64],
        "activation": "gelu",
        "dropout": 0.0,
    }
    readme = (out / "README.md").read_text()
    assert "hpctrain.load(" in readme and 'torch.load("model.pt", weights_only=True)' in readme
    assert (
        "from hpctrain.workloads.regression.task import MLP" in readme and "net.0.weight (64, 16)" in readme
    )

    # Without hpctrain: torch alone, a network written by hand with the same layer names.
    plain = script(
        tmp_path / "plain.py",
        """
        import sys
        import torch
        from torch import nn

        class MLP(nn.Module):
            def __init__(self):
                super().__init__()
                self.net = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 1))

            def forward(self, x):
                return self.net(x)

        state = torch.load("model.pt", weights_only=True)
        assert set(state) == {f"net.{i}.{p}" for i in (0, 2, 4) for p in ("weight", "bias")}, sorted(state)
        model = MLP()
        model.load_state_dict(state)  # strict: every key, nothing around them
        model.eval()
        torch.save(model(torch.linspace(-1, 1, 48).reshape(3, 16)).detach(), "plain_out.pt")
        assert not any(m == "hpctrain" or m.startswith("hpctrain.") for m in sys.modules)
        """,
        cwd=out,
    )
    assert plain.returncode == 0, plain.stderr

    # With hpctrain: the class and settings export.json names, and hpctrain.load on the run folder.
    api = script(
        tmp_path / "api.py",
        f"""
        import hashlib, importlib, json
        import torch

        meta = json.load(open("export.json"))
        net = meta["networks"]["model"]
        module, _, name = net["class"].rpartition(".")
        rebuilt = getattr(importlib.import_module(module), name)(**net["settings"])
        rebuilt.load_state_dict(torch.load(net["file"], weights_only=True))
        digest = hashlib.sha256()  # hpctrain's params_sha256, written out
        for key, tensor in rebuilt.state_dict().items():
            digest.update(f"model.{{key}}".encode())
            digest.update(tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        assert digest.hexdigest() == meta["params_sha256"]

        import hpctrain

        trained = hpctrain.load({str(run)!r})
        assert trained.step == 30 and not trained.model.training and trained.sampler is None
        assert trained.params_sha256 == meta["params_sha256"] and trained.settings["model"] == net["settings"]
        x = torch.linspace(-1, 1, 48).reshape(3, 16)
        with torch.no_grad():
            assert torch.equal(trained.model(x), rebuilt.eval()(x))
            assert torch.equal(trained.models["model"](x), torch.load("plain_out.pt"))
        print("ok")
        """,
        cwd=out,
    )
    assert api.returncode == 0 and api.stdout.strip() == "ok", api.stderr


def test_import_hpctrain_stays_light() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, hpctrain; print(callable(hpctrain.load), 'torch' in sys.modules)",
        ],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.split() == ["True", "False"], done.stderr


def test_load_picks_the_checkpoint_asked_for(run: Path) -> None:
    import hpctrain

    step10 = hpctrain.load(run, which="step_10")
    latest = hpctrain.load(run)
    best = hpctrain.load(run / "checkpoints", which="best")
    by_file = hpctrain.load(run / "checkpoints" / "step_00000020.pt")
    assert (step10.step, latest.step, by_file.step) == (10, 30, 20)
    assert step10.checkpoint.name == "step_00000010.pt" and best.checkpoint.name == "best.pt"
    assert step10.params_sha256 != latest.params_sha256
    assert best.step in (10, 20, 30) and best.run_dir == run
    state = torch.random.get_rng_state()
    hpctrain.load(run)  # building the networks draws initial weights: not from the caller's RNG
    assert torch.equal(torch.random.get_rng_state(), state)
    with pytest.raises(UserError, match=r"which='last': choose latest, best or step_N"):
        hpctrain.load(run, which="last")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nothere"], "nothere: no such run folder or checkpoint file"),
        (["RUN", "--which", "step_7"], "no step_00000007.pt in"),
        (["RUN", "--which", "newest"], "choose latest, best or step_N"),
        (
            ["RUN/checkpoints/step_00000010.pt", "--which", "best"],
            "a checkpoint file; which=best needs the run",
        ),
        (["EMPTY"], "no readable checkpoint"),
        (["BROKEN"], "no checkpoint in"),
        (["RUN", "--out", "RUN"], "holds other files and no earlier export"),
    ],
    ids=[
        "missing",
        "no_such_step",
        "bad_which",
        "which_of_a_file",
        "no_checkpoint",
        "unreadable",
        "out_taken",
    ],
)
def test_export_mistakes_are_one_line_exit_2(
    run: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    (tmp_path / "empty" / "checkpoints").mkdir(parents=True)
    broken = tmp_path / "broken"
    shutil.copytree(run, broken)
    for file in (broken / "checkpoints").glob("*.pt"):
        file.write_bytes(b"not a checkpoint")
    named = {"RUN": str(run), "EMPTY": str(tmp_path / "empty"), "BROKEN": str(broken)}
    argv = [named.get(a.split("/")[0], a.split("/")[0]) + a[len(a.split("/")[0]) :] for a in args]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "out")]
    done = hpctrain("export", *argv, cwd=tmp_path)
    assert done.code == 2 and message in done.err, done.err
    assert done.err.count("\n") == 1 and done.err.startswith("error: ") and "Traceback" not in done.err
    assert not (tmp_path / "out").exists()


def test_a_second_export_replaces_the_first(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "exported"
    assert hpctrain("export", str(run), "--out", str(out), "--which", "step_10", cwd=tmp_path).code == 0
    done = hpctrain("export", str(run), "--out", str(out), cwd=tmp_path)
    assert done.code == 0, done.err
    assert json.loads((out / "export.json").read_text())["step"] == 30
