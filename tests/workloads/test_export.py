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
    assert (meta["run"], meta["checkpoint"]) == ("d", "checkpoints/step_00000030.pt")
    assert meta["complete"] is True and sorted(meta["files"]) == ["README.md", "config.yaml", "model.pt"]
    assert meta["networks"]["model"]["settings"] == {
        "in_features": 16,
        "hidden": [64, 64],
        "activation": "gelu",
        "dropout": 0.0,
    }
    readme = (out / "README.md").read_text()
    assert 'hpctrain.load("exported")' in readme and 'torch.load("model.pt", weights_only=True)' in readme
    for (
        file
    ) in out.iterdir():  # no path of the exporting machine anywhere (the run folder, the test's folder)
        assert str(tmp_path) not in file.read_bytes().decode("latin-1"), file.name
        assert str(run.parent) not in file.read_bytes().decode("latin-1"), file.name
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
        (["NOSIDECAR", "--which", "step_10"], "has no step_00000010.json with its SHA-256"),
        (["NOSIDECAR", "--which", "best"], "has no best.json with its SHA-256"),
        (["NOSIDECAR/checkpoints/step_00000010.pt"], "has no step_00000010.json with its SHA-256"),
    ],
    ids=[
        "missing",
        "no_such_step",
        "bad_which",
        "which_of_a_file",
        "no_checkpoint",
        "unreadable",
        "out_taken",
        "step_without_sidecar",
        "best_without_sidecar",
        "run_file_without_sidecar",
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
    unchecked = tmp_path / "unchecked"  # the sidecars gone, a bit of step 10's weights flipped
    shutil.copytree(run, unchecked)
    for side in [*(unchecked / "checkpoints").glob("step_*.json"), unchecked / "checkpoints" / "best.json"]:
        side.unlink()
    step10 = unchecked / "checkpoints" / "step_00000010.pt"
    data = bytearray(step10.read_bytes())
    data[len(data) // 2] ^= 1
    step10.write_bytes(bytes(data))
    named = {
        "RUN": str(run),
        "EMPTY": str(tmp_path / "empty"),
        "BROKEN": str(broken),
        "NOSIDECAR": str(unchecked),
    }
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


def _export(*argv: str) -> None:
    from hpctrain.commands.export import main as export_main

    assert export_main(list(argv)) == 0


def test_an_export_loads_where_the_run_folder_is_gone(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The export alone (the run folder removed, another working folder): the same networks, update and hash as
    the run's own checkpoint; a changed file is refused, one line; which= means nothing for an export."""
    import hpctrain

    moved = tmp_path / "elsewhere" / "d"
    shutil.copytree(run, moved)
    model = tmp_path / "model"
    _export(str(moved), "--out", str(model))
    shutil.rmtree(tmp_path / "elsewhere")
    monkeypatch.chdir(tmp_path)
    from_export = hpctrain.load("model")
    from_run = hpctrain.load(run)
    assert (from_export.step, from_export.params_sha256) == (30, from_run.params_sha256)
    assert from_export.run_dir is None and from_export.settings == from_run.settings
    x = torch.linspace(-1, 1, 48).reshape(3, 16)
    with torch.no_grad():
        assert torch.equal(from_export.model(x), from_run.model(x))
    shown = repr(from_export)
    assert len(shown.splitlines()) <= 6 and len(shown) < 500 and "params_sha256" in shown, shown
    with pytest.raises(UserError, match="an export holds one update; which=best needs the run folder"):
        hpctrain.load("model", which="best")
    data = bytearray((model / "model.pt").read_bytes())
    data[-100] ^= 1
    (model / "model.pt").write_bytes(bytes(data))
    with pytest.raises(UserError, match=r"model\.pt: its SHA-256 does not match export\.json"):
        hpctrain.load(model)


class Killed(BaseException):
    """Stands for a kill: nothing after it runs."""


def test_a_kill_during_a_re_export_never_leaves_one_export_over_the_others_files(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed at any commit of a re-export (update 30 over update 10): the folder is either refused as cut short,
    or the whole new export; never export.json of one over the weights of the other. The next export finishes it;
    a folder mixed by hand is refused too."""
    import hpctrain
    from hpctrain import fsutil

    out = tmp_path / "out"
    for name in ("model.pt", "config.yaml", "README.md", "export.json"):
        _export(str(run), "--out", str(out), "--which", "step_10")

        def kill(tmp: Path, final: Path, name: str = name) -> None:
            if final.name == name and json.loads((out / "export.json").read_text()).get("complete") is False:
                raise Killed

        monkeypatch.setattr(fsutil, "before_commit", kill)
        with pytest.raises(Killed):
            _export(str(run), "--out", str(out))
        monkeypatch.setattr(fsutil, "before_commit", None)
        with pytest.raises(UserError, match="an export that was cut short"):
            hpctrain.load(out)
    _export(str(run), "--out", str(out))  # over the marker of the cut export
    assert hpctrain.load(out).step == 30
    early = tmp_path / "early"
    _export(str(run), "--out", str(early), "--which", "step_10")
    shutil.copy(
        early / "export.json", out / "export.json"
    )  # update 10's description over update 30's weights
    with pytest.raises(UserError, match=r"its SHA-256 does not match export\.json"):
        hpctrain.load(out)


def test_a_re_export_removes_or_replaces_only_what_the_earlier_export_wrote(
    run: Path, tmp_path: Path
) -> None:
    """An export.json in --out naming ../ or absolute paths, or a user's file under an export's name: nothing of
    theirs is deleted or replaced; a stale network file the earlier export wrote (its hash recorded) goes."""
    import hashlib

    out = tmp_path / "out"
    out.mkdir()
    outside, absolute = tmp_path / "thesis.tex", tmp_path / "data.h5"
    for victim in (outside, absolute):
        victim.write_text("keep me\n")
    (out / "notes.pt").write_text("mine\n")
    (out / "stale.pt").write_text("written by the earlier export\n")
    digest = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in (outside, absolute, out / "stale.pt")}
    planted = {
        "format": 2,
        "complete": True,
        "files": {
            "../thesis.tex": [digest[outside]],
            str(absolute): [digest[absolute]],
            "notes.pt": ["0" * 64],
            "stale.pt": [digest[out / "stale.pt"]],
        },
        "networks": {"a": {"file": "../thesis.tex"}, "b": {"file": str(absolute)}},
    }
    (out / "export.json").write_text(json.dumps(planted))
    _export(str(run), "--out", str(out))
    assert outside.read_text() == absolute.read_text() == "keep me\n"
    assert (out / "notes.pt").read_text() == "mine\n" and not (out / "stale.pt").exists()
    legacy = {  # the first format: no hashes; its own names are replaced, nothing else touched
        "networks": {
            "a": {"file": "../thesis.tex"},
            "b": {"file": str(absolute)},
            "model": {"file": "model.pt"},
        }
    }
    (out / "export.json").write_text(json.dumps(legacy))
    _export(str(run), "--out", str(out))
    assert outside.read_text() == absolute.read_text() == "keep me\n"
    (out / "model.pt").write_text("a user's own model.pt\n")  # not what the export recorded: never replaced
    with pytest.raises(UserError, match=r"holds model\.pt, which the earlier export there did not write"):
        _export(str(run), "--out", str(out))
    assert (out / "model.pt").read_text() == "a user's own model.pt\n"


def test_load_device_mistakes_are_one_user_line(run: Path) -> None:
    import hpctrain

    with pytest.raises(UserError, match=r"device='tpu9': no such device; choose cpu, cuda, cuda:N or mps"):
        hpctrain.load(run, device="tpu9")
    if torch.version.cuda is None:
        with pytest.raises(UserError, match=r"device='cuda': the installed torch .* is a CPU-only build"):
            hpctrain.load(run, device="cuda")
    elif not torch.cuda.is_available():
        with pytest.raises(UserError, match=r"device='cuda': this machine has no CUDA device visible"):
            hpctrain.load(run, device="cuda")
    else:
        count = torch.cuda.device_count()
        with pytest.raises(UserError, match=rf"this machine has {count} CUDA device"):
            hpctrain.load(run, device=f"cuda:{count}")


def test_a_taken_out_folder_or_a_missing_run_is_refused_before_torch_loads(run: Path, tmp_path: Path) -> None:
    """--out naming a folder of other files, a run folder that is not there, a step the run does not hold: one
    line, exit 2, in a second (torch never imported: seconds, a minute on a busy login node)."""
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    probe = "import sys\nfrom hpctrain.cli import main\nprint(main(sys.argv[1:]), 'torch' in sys.modules)"
    out = str(tmp_path / "out")
    cases = {
        (
            str(run),
            "--out",
            str(taken),
        ): f"--out {taken}: holds other files and no earlier export; name a new",
        (str(tmp_path / "nope"), "--out", out): f"{tmp_path / 'nope'}: no such run folder or checkpoint file",
        (str(run), "--which", "step_7", "--out", out): f"{run}: no step_00000007.pt in",
    }
    for args, said in cases.items():
        done = subprocess.run(
            [sys.executable, "-c", probe, "export", *args],
            cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.stdout.split()[-2:] == ["2", "False"], (args, done.stdout, done.stderr[-2000:])
        assert done.stderr.count("\n") == 1 and done.stderr.startswith(f"error: {said}"), done.stderr
    assert sorted(p.name for p in taken.iterdir()) == ["notes.txt"]
    assert not (tmp_path / "out").exists()
