"""Start-up: the record of a hop's first update, and what a `train` start does not import."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hpctrain.train.first_update import on_first_update
from tests.conftest import clean_env, hpctrain

# What a start of the default job has no use for while W&B, TensorBoard, plots, HDF5 data, submitit and Pelican
# are off: each costs 0.05-0.5 s of every hop (docs/performance.md, "Start-up").
UNUSED_BY_DEFAULT = (
    "wandb",
    "tensorboard",
    "matplotlib",
    "h5py",
    "submitit",
    "pelicanfs",
    "pandas",
    "aiohttp",
)


def _step(optimizer: torch.optim.Optimizer) -> None:
    for group in optimizer.param_groups:
        for p in group["params"]:
            p.grad = torch.ones_like(p)
    optimizer.step()


def test_first_update_fires_once_every_optimizer_stepped_and_unhooks() -> None:
    nets = {name: torch.nn.Linear(2, 1) for name in ("critic", "generator")}
    optimizers = {name: torch.optim.SGD(net.parameters(), lr=0.1) for name, net in nets.items()}
    calls: list[int] = []
    on_first_update(optimizers, lambda: calls.append(1))
    _step(optimizers["critic"])
    _step(optimizers["critic"])  # a GAN's critic steps first, several times: the update is not done yet
    assert calls == []
    _step(optimizers["generator"])
    assert calls == [1]
    for optimizer in optimizers.values():
        _step(optimizer)
        assert not optimizer._optimizer_step_post_hooks  # nothing left to run per update
    assert calls == [1]


def test_every_hop_records_its_start_up(tmp_path: Path) -> None:
    args = ("train", f"run.out_dir={tmp_path}", "run.name=s", "train.total_updates=4", "train.eval_every=0")
    assert hpctrain(*args, cwd=tmp_path).code == 0
    more = hpctrain(*args[:-2], "train.total_updates=8", "train.eval_every=0", cwd=tmp_path)
    assert more.code == 0, more.err
    hops = json.loads((tmp_path / "s" / "chain.json").read_text())
    assert len(hops) == 2
    for hop in hops:  # the process start to its first update: less than the whole hop
        assert 0 < hop["startup_seconds"] < hop["end"] - hop["start"] + 1e-6


def _verb(argv: list[str], cwd: Path, first_update: bool = False) -> tuple[int, list[str], str]:
    """Run `hpctrain ARGV` in a fresh interpreter; (exit code, the watched modules it had loaded at the end, or
    with `first_update` at its first update: what the start and the loader needed, before the muon judge at the
    end of a training, whose scikit-learn brings pandas), err)."""
    watched = ("torch", "numpy", *UNUSED_BY_DEFAULT)
    code = (
        "import json, sys; first = []\n"
        "if sys.argv[1] == 'train' and '--until-done' not in sys.argv:  # the hook imports torch, as such a verb does\n"
        "    import hpctrain.train.first_update as f; hook = f.on_first_update\n"
        "    f.on_first_update = lambda opts, done: hook(opts, lambda: (first.append(set(sys.modules)), done()))\n"
        "from hpctrain.cli import main; rc = main(sys.argv[1:]); "
        f"seen = first[0] if first else set(sys.modules); "
        f"print(json.dumps([rc, [m for m in {watched!r} if m in sys.modules], [m for m in {watched!r} if m in seen]]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *argv],
        cwd=cwd,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    rc, at_end, at_first_update = json.loads(done.stdout.strip().splitlines()[-1])
    return rc, at_first_update if first_update else at_end, done.stderr


@pytest.fixture(scope="module")
def default_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """The default job, started as `hpctrain train` is (a short one): its project folder and what it imported."""
    project = tmp_path_factory.mktemp("project")
    rc, loaded, err = _verb(
        ["train", "run.out_dir=logs", "train.total_updates=4", "train.eval_every=2"], project
    )
    assert rc == 0, err
    return project, loaded


def test_a_default_train_start_imports_no_feature_that_is_off(default_run: tuple[Path, list[str]]) -> None:
    project, loaded = default_run
    assert loaded == ["torch", "numpy"]  # and none of UNUSED_BY_DEFAULT
    assert (project / "logs" / "debug" / "checkpoints" / "latest").exists()  # it did train and save


def test_a_muon_train_start_imports_neither_pandas_nor_the_features_that_are_off(tmp_path: Path) -> None:
    for split, seed in (("train", "1"), ("val", "2")):
        made = hpctrain(
            "data", "generate", "--kind", "muons", "--out", f"data/{split}", "--files", "1",
            "--events-per-file", "400", "--seed", seed, cwd=tmp_path,
        )  # fmt: skip
        assert made.code == 0, made.err
    argv = ["train", "--config", str(Path(__file__).resolve().parents[2] / "configs" / "muons.yaml")]
    argv += ["run.out_dir=logs", "data.paths=[data/train]", "data.val_paths=[data/val]", "data.batch_size=64"]
    rc, loaded, err = _verb(
        [*argv, "train.total_updates=2", "train.eval_every=0"], tmp_path, first_update=True
    )
    assert rc == 0, err
    # pyarrow's to_numpy would bring pandas: the loader reads Arrow buffers
    assert loaded == ["torch", "numpy"]
    (run,) = (tmp_path / "logs").glob(
        "muons-*"
    )  # named from the data and batch given: muons-paths-...-<hash>
    assert (run / "evaluate_val.json").exists()  # the whole run, its last evaluation too


@pytest.mark.parametrize(
    "argv",
    [
        ["submit", "--dry-run"],
        ["submit", "--check", "--signal-lead", "30"],
        ["status", "logs/debug"],
        ["sync", "logs/debug", "--dry-run"],
        ["config", "show"],
        ["auth", "show"],
        # the supervisor (its child, the finished run started again, imports torch in its own process)
        ["train", "--until-done", "run.out_dir=logs", "train.total_updates=4", "train.eval_every=2"],
    ],
    ids=lambda argv: " ".join(argv[:2]),
)
def test_login_node_verbs_import_no_torch(argv: list[str], default_run: tuple[Path, list[str]]) -> None:
    project, _ = default_run
    rc, loaded, err = _verb(argv, project)
    assert rc == 0, err
    # nor numpy: the verbs that only read a config or a run's files start in ~0.9 CPU-s, not ~1.3 (the workload
    # registry once brought in the report's figures module, and numpy with it, for a type)
    assert not {"torch", "numpy"} & set(loaded), f"`hpctrain {' '.join(argv)}` imported {loaded}"
