"""The CNN (shapes, gradient checkpointing), the task's metrics, and the data streams (workers, ranks)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from hpctrain.config.loading import ConfigRequest, load_config
from hpctrain.data.loader import IndexedStream, LoaderOptions, as_batch, seed_worker
from hpctrain.runtime.env import ClusterEnv
from hpctrain.train.context import Context
from hpctrain.workloads.fields.dataset import GeneratedFields
from hpctrain.workloads.fields.model import FieldCNN
from hpctrain.workloads.fields.task import FieldTask
from hpctrain.workloads.registry import config_model, fill_default_types

PRIOR = [(0.1, 0.5), (0.6, 1.0)]


def tiny_cfg(*extra: str):
    overrides = [
        "model.type=field_cnn",
        "data.type=fields",
        "data.size=16",
        "data.n_train=64",
        "data.n_val=32",
        "data.batch_size=8",
        "model.widths=[8, 16]",
        "model.groups=4",
        "model.head_hidden=8",
        *extra,
    ]
    return load_config(ConfigRequest(None, None, overrides, None), config_model(), prepare=fill_default_types)


@pytest.mark.parametrize("stem_stride", [1, 2])
def test_shapes(stem_stride: int):
    model = FieldCNN([8, 16, 32], blocks=2, groups=4, head_hidden=16, outputs=4, stem_stride=stem_stride)
    assert model(torch.randn(3, 1, 32, 32)).shape == (3, 4)
    assert model(torch.randn(1, 1, 16, 16)).shape == (1, 4)  # any even size: global pooling


def test_gradient_checkpointing_gives_the_same_outputs_and_gradients():
    torch.manual_seed(0)
    plain = FieldCNN([8, 16], blocks=2, groups=4, head_hidden=8, outputs=2)
    ckpt = copy.deepcopy(plain)
    ckpt.gradient_checkpointing = True
    x = torch.randn(4, 1, 16, 16)
    out_plain, out_ckpt = plain(x), ckpt(x)
    assert torch.equal(out_plain, out_ckpt)
    (out_plain**2).sum().backward()
    (out_ckpt**2).sum().backward()
    for (name, a), (_, b) in zip(plain.named_parameters(), ckpt.named_parameters()):
        assert a.grad is not None and b.grad is not None, name
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6, msg=name)


def test_gaussian_nll_task_step_and_metrics():
    cfg = tiny_cfg("train.gradient_checkpointing=true")
    task = FieldTask(cfg, ClusterEnv())
    model = task.build_modules()["model"]
    assert model.gradient_checkpointing
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ctx = Context(torch.device("cpu"), {"model": model}, {"model": model}, {"main": optimizer}, "fp32", 0.0)
    batch = next(iter(task.build_data("train", 0)))
    maps, params = batch
    assert maps.shape == (8, 1, 16, 16) and params.shape == (8, 2)
    out = task.train_step(task.split(batch), ctx)
    assert torch.isfinite(out.loss) and out.samples == 8
    # Perfect predictions give R^2 = 1 and RMSE = 0: check the sums' algebra on real truths.
    truth = torch.cat([b[1] for b in task.build_data("val", 0)])  # (32, 2)
    centred = truth.double() - torch.tensor([0.3, 0.8], dtype=torch.float64)
    sums = {"loss_sum": 0.0, "count": 32.0}
    for i, name in enumerate(("omega_m", "sigma_8")):
        sums |= {
            f"sse_{name}": 0.0,
            f"sy_{name}": float(centred[:, i].sum()),
            f"syy_{name}": float((centred[:, i] ** 2).sum()),
        }
    metrics = task.finish_eval(sums)
    assert metrics["val_r2_omega_m"] == 1.0 and metrics["val_rmse_sigma_8"] == 0.0
    # Predicting the mean gives R^2 = 0.
    sse = float(((truth[:, 0].double() - truth[:, 0].double().mean()) ** 2).sum())
    assert task.finish_eval({**sums, "sse_omega_m": sse})["val_r2_omega_m"] == pytest.approx(0.0, abs=1e-9)
    real = task.finish_eval({k: float(v) for k, v in _eval(task, ctx).items()})
    assert set(real) >= {
        "val_loss",
        "val_r2_omega_m",
        "val_rmse_omega_m",
        "val_r2_sigma_8",
        "val_sigma_omega_m",
    }


def _eval(task: FieldTask, ctx: Context) -> dict[str, torch.Tensor]:
    sums: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for batch in task.build_data("val", 0):
            for k, v in task.eval_step(batch, ctx).items():
                sums[k] = sums.get(k, 0) + v
    return sums


def _collect(stream: IndexedStream, batches: int) -> torch.Tensor:
    it = iter(stream)
    maps = torch.cat([next(it)[0] for _ in range(batches)])
    stream.close()
    return maps


def test_workers_and_ranks_draw_different_maps_and_the_same_as_in_process():
    data = GeneratedFields("gaussian", "train", 16, 5, 16, 1000.0, PRIOR)
    in_process = _collect(IndexedStream(data, 4, seed=1, collate_fn=as_batch), 4)
    workers = _collect(
        IndexedStream(data, 4, seed=1, options=LoaderOptions(num_workers=2), collate_fn=as_batch), 4
    )
    assert torch.equal(in_process, workers)  # each map comes from its own (seed, split, index) stream
    flat = workers.reshape(16, -1)
    assert len({tuple(row.tolist()) for row in flat}) == 16  # two workers, sixteen different maps
    ranks = [
        _collect(IndexedStream(data, 4, seed=1, rank=r, world_size=2, collate_fn=as_batch), 2) for r in (0, 1)
    ]
    a, b = (r.reshape(8, -1) for r in ranks)
    assert not any(torch.equal(x, y) for x in a for y in b)


class _NumpyDraw(Dataset):
    """Reports what the worker's global NumPy generator draws (a dataset that used np.random would get it)."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> tuple[int, float]:
        info = torch.utils.data.get_worker_info()
        return info.id, float(np.random.random())


def test_dataloader_workers_do_not_share_a_numpy_seed():
    loader = DataLoader(
        _NumpyDraw(),
        batch_size=1,
        num_workers=2,
        worker_init_fn=seed_worker,
        generator=torch.Generator().manual_seed(3),
    )
    first: dict[int, float] = {}
    for worker, value in loader:
        first.setdefault(int(worker), float(value))
    assert set(first) == {0, 1}
    assert first[0] != first[1]


def test_training_from_shards_on_disk_sees_the_on_the_fly_maps(tmp_path):
    import argparse

    from hpctrain.workloads.fields.data_verbs import generate, generate_args

    parser = argparse.ArgumentParser()
    generate_args(parser)
    generate(
        parser.parse_args(
            [
                "--out",
                str(tmp_path),
                "--n",
                "64",
                "--n-val",
                "32",
                "--n-test",
                "0",
                "--size",
                "16",
                "--seed",
                "2024",
                "--shard-size",
                "20",
            ]
        )
    )
    disk = FieldTask(tiny_cfg(f"data.path={tmp_path}"), ClusterEnv())
    fly = FieldTask(tiny_cfg(), ClusterEnv())
    first_disk, first_fly = next(iter(disk.build_data("train", 0))), next(iter(fly.build_data("train", 0)))
    assert torch.equal(first_disk[0], first_fly[0]) and torch.equal(first_disk[1], first_fly[1])
    assert len(disk.build_data("val", 0)) == 4  # 32 maps in batches of 8
    assert disk.build_data("test", 0) is None
    with pytest.raises(ValueError, match=r"no train/meta\.json"):
        FieldTask(tiny_cfg(f"data.path={tmp_path / 'missing'}"), ClusterEnv())
