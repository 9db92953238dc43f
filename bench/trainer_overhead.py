"""Trainer overhead: the same model, data and optimizer through hpctrain's trainer and a hand-written loop.

Both run in this process, alternating, best of N repeats each (the machine may be shared). The trainer's run
includes everything it does per update (LR schedule, timers, budget check, logging every 10 updates) and its
final checkpoint save. Last line: JSON with `ratio` = trainer updates/s over the hand-written loop's
(goal >= 0.97), for a mid-sized MLP; `small_model_ratio` shows the per-update overhead on a tiny one.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from hpctrain.config.loading import ConfigRequest, load_config
from hpctrain.data.loader import as_batch
from hpctrain.runtime.budget import StopSignals, TimeBudget
from hpctrain.runtime.env import ClusterEnv
from hpctrain.train.trainer import Trainer
from hpctrain.workloads.registry import config_model, fill_default_types
from hpctrain.workloads.regression.task import MLP, RegressionTask, make_dataset


def config(out: Path, hidden: list[int], batch: int, updates: int):
    overrides = [
        f"run.out_dir={out}",
        "run.name=bench",
        f"model.hidden={hidden}",
        f"data.batch_size={batch}",
        f"train.total_updates={updates}",
        "train.eval_every=0",
        "data.n_val=0",
        "logging.log_every=10",
        "checkpoint.resume=never",
        "checkpoint.every=0",  # the hand loop saves once at the end: so does the trainer here
        "data.n_train=16384",
        "optim.name=adamw",
    ]
    return load_config(ConfigRequest(None, None, overrides, None), config_model(), prepare=fill_default_types)


def trainer_rate(hidden: list[int], batch: int, updates: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = config(Path(tmp), hidden, batch, updates)
        env = ClusterEnv()
        trainer = Trainer(
            cfg,
            RegressionTask(cfg, env),
            env,
            Path(tmp) / "bench",
            TimeBudget(cfg.budget, env, StopSignals()),
        )
        trainer.build()
        trainer.resume()
        with contextlib.redirect_stdout(io.StringIO()):
            trainer.start_tracking()
            start = time.perf_counter()
            trainer.fit()
            seconds = time.perf_counter() - start
        trainer.close()
    return updates / seconds


def hand_rate(hidden: list[int], batch: int, updates: int) -> float:
    """What a user writes by hand: DataLoader, forward, MSE, backward, step."""
    torch.manual_seed(0)
    data = make_dataset(16384, 16, 0.1, 1234)
    model = MLP(16, hidden, "gelu", 0.0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(data, batch_size=batch, shuffle=True, drop_last=True, collate_fn=as_batch)
    done = 0
    start = time.perf_counter()
    while done < updates:
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            done += 1
            if done % 10 == 0:
                float(loss)  # a hand loop prints its loss now and then too
            if done == updates:
                break
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, io.BytesIO())  # its final save
    return updates / (time.perf_counter() - start)


def compare(hidden: list[int], batch: int, updates: int, repeats: int) -> dict[str, float]:
    trainer_rate(hidden, batch, max(updates // 10, 5))  # warm-up both paths
    hand_rate(hidden, batch, max(updates // 10, 5))
    ours, theirs = [], []
    for _ in range(repeats):
        ours.append(trainer_rate(hidden, batch, updates))
        theirs.append(hand_rate(hidden, batch, updates))
    return {
        "trainer_updates_per_s": max(ours),
        "hand_updates_per_s": max(theirs),
        "ratio": max(ours) / max(theirs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--updates", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    mid = compare([512, 512], 256, args.updates, args.repeats)
    small = compare([64, 64], 32, args.updates * 3, args.repeats)
    print(
        f"mid-sized MLP [512,512] batch 256: trainer {mid['trainer_updates_per_s']:.1f} upd/s, "
        f"hand loop {mid['hand_updates_per_s']:.1f} upd/s, ratio {mid['ratio']:.3f}"
    )
    print(
        f"tiny MLP [64,64] batch 32: trainer {small['trainer_updates_per_s']:.1f} upd/s, "
        f"hand loop {small['hand_updates_per_s']:.1f} upd/s, ratio {small['ratio']:.3f}"
    )
    result = {
        "trainer_updates_per_s": round(mid["trainer_updates_per_s"], 2),
        "hand_updates_per_s": round(mid["hand_updates_per_s"], 2),
        "ratio": round(mid["ratio"], 4),
        "small_model_trainer_updates_per_s": round(small["trainer_updates_per_s"], 2),
        "small_model_hand_updates_per_s": round(small["hand_updates_per_s"], 2),
        "small_model_ratio": round(small["ratio"], 4),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
