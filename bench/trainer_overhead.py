"""Trainer overhead: the same model, data and optimizer through hpctrain's trainer and a hand-written loop.

Both run in this process in short rounds, alternating (trainer first in even rounds, the hand loop first in odd
ones), each from a fresh start whose building is not timed, with the same torch thread count and after an untimed
warm-up of each. Both stamp the end of every update; a round's ratio is the hand loop's time per update over the
trainer's, over the updates after the first `--skip` (the steady state: DataLoader start-up and first-call costs
excluded on both sides). Load on a shared machine slows both sides of a round alike, so the within-round ratio
is what is compared, and its median over the rounds is reported with the spread (min, max).

The trainer's run also does what a hand loop does not: it opens a hop and ends with a committed checkpoint
(fsync'd files, the chain, summary.json), a fixed cost per run, not per update. It is reported apart:
`whole_run_ratio` (median of the rounds' whole-run ratios: first update to final save, both sides) and
`trainer_fixed_ms` / `hand_fixed_ms` (whole run minus the updates at the steady rate).

Last line: JSON with `ratio` (goal >= 0.98) for a mid-sized MLP and `small_model_ratio` (goal >= 0.95) for a
tiny one, where the per-update Python work shows most; both ours over the hand loop's, higher is better.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from hpctrain.config.loading import ConfigRequest, load_config
from hpctrain.data.loader import as_batch
from hpctrain.runtime.budget import StopSignals, TimeBudget
from hpctrain.runtime.env import ClusterEnv
from hpctrain.train.task import MicroBatch, StepOutput, UpdateContext
from hpctrain.train.trainer import Trainer
from hpctrain.workloads.registry import config_model, fill_default_types
from hpctrain.workloads.regression.task import MLP, RegressionTask, make_dataset

CLOCK = time.perf_counter  # what the update stamps read


def config(out: Path, hidden: list[int], batch: int, updates: int, threads: int) -> Any:
    overrides = [
        f"run.out_dir={out}",
        "run.name=bench",
        f"model.hidden={hidden}",
        f"data.batch_size={batch}",
        f"train.total_updates={updates}",
        f"train.threads={threads}",
        "train.eval_every=0",
        "data.n_val=0",
        "logging.log_every=10",
        "checkpoint.resume=never",
        "checkpoint.every=0",  # the hand loop saves once at the end: so does the trainer here
        "data.n_train=16384",
        "optim.name=adamw",
    ]
    return load_config(ConfigRequest(None, None, overrides, None), config_model(), prepare=fill_default_types)


class StampedTask(RegressionTask):
    """The regression task, stamping the end of each update (the hand loop stamps its own the same way)."""

    stamps: list[float]

    def train_step(self, micro_batches: list[MicroBatch], ctx: UpdateContext) -> StepOutput:
        out = super().train_step(micro_batches, ctx)
        self.stamps.append(CLOCK())
        return out


def trainer_run(cfg: Any, tmp: Path) -> tuple[list[float], float]:
    """(stamps at the end of each update, seconds of the whole fit)."""
    env = ClusterEnv()
    task = StampedTask(cfg, env)
    task.stamps = []
    trainer = Trainer(cfg, task, env, tmp / "bench", TimeBudget(cfg.budget, env, StopSignals()))
    trainer.build()
    trainer.resume()
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.start_tracking()
        gc.collect()
        start = time.perf_counter()
        trainer.fit()
        seconds = time.perf_counter() - start
    trainer.close()
    return task.stamps, seconds


HAND_FUSED = False  # --hand-optimizer fused: the hand loop takes the trainer's fused AdamW kernel too


def hand_run(cfg: Any, tmp: Path) -> tuple[list[float], float]:
    """What a user writes by hand: DataLoader, forward, MSE, backward, step, a save at the end. Same data, model
    and optimizer settings as the trainer's config; torch's default AdamW (a loop over the tensors on the CPU;
    the trainer takes the fused kernel) unless --hand-optimizer fused."""
    torch.manual_seed(cfg.run.seed)
    d, m, o = cfg.data, cfg.model, cfg.optim
    data = make_dataset(d.n_train, d.in_features, d.noise, d.data_seed)
    model = MLP(d.in_features, m.hidden, m.activation, m.dropout)
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=o.lr,
        betas=o.betas,
        eps=o.eps,
        weight_decay=o.weight_decay,
        fused=HAND_FUSED or None,
    )
    loader = DataLoader(data, batch_size=d.batch_size, shuffle=True, drop_last=True, collate_fn=as_batch)
    updates = cfg.train.total_updates
    stamps: list[float] = []
    done = 0
    gc.collect()
    start = time.perf_counter()
    while done < updates:
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            stamps.append(CLOCK())
            done += 1
            if done % 10 == 0:
                loss.item()  # a hand loop prints its loss now and then too
            if done == updates:
                break
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, tmp / "hand.pt")  # its final save
    return stamps, time.perf_counter() - start


def per_update(stamps: list[float], skip: int) -> float:
    """Seconds per update in the steady state: from the end of update `skip` to the end of the last one."""
    return (stamps[-1] - stamps[skip - 1]) / (len(stamps) - skip)


def compare(
    hidden: list[int], batch: int, updates: int, rounds: int, skip: int, threads: int
) -> dict[str, Any]:
    def one(run: Any, n: int) -> tuple[list[float], float]:
        with tempfile.TemporaryDirectory() as tmp:
            return run(config(Path(tmp), hidden, batch, n, threads), Path(tmp))  # type: ignore[no-any-return]

    one(trainer_run, max(updates // 5, skip + 1))  # warm-up: both paths once, untimed
    one(hand_run, max(updates // 5, skip + 1))
    steady, whole, ours_s, theirs_s, ours_fixed, theirs_fixed = [], [], [], [], [], []
    for r in range(rounds):
        sides = (trainer_run, hand_run) if r % 2 == 0 else (hand_run, trainer_run)
        results = {run: one(run, updates) for run in sides}
        (ours, ours_whole), (theirs, theirs_whole) = results[trainer_run], results[hand_run]
        assert len(ours) == len(theirs) == updates, (len(ours), len(theirs))
        a, b = per_update(ours, skip), per_update(theirs, skip)
        steady.append(b / a)
        whole.append(theirs_whole / ours_whole)
        ours_s.append(a)
        theirs_s.append(b)
        ours_fixed.append(ours_whole - updates * a)
        theirs_fixed.append(theirs_whole - updates * b)
    return {
        "ratio": statistics.median(steady),
        "ratio_min": min(steady),
        "ratio_max": max(steady),
        "whole_run_ratio": statistics.median(whole),
        "trainer_updates_per_s": 1 / statistics.median(ours_s),
        "hand_updates_per_s": 1 / statistics.median(theirs_s),
        "trainer_us_per_update": 1e6 * statistics.median(ours_s),
        "hand_us_per_update": 1e6 * statistics.median(theirs_s),
        "trainer_fixed_ms": 1e3 * statistics.median(ours_fixed),
        "hand_fixed_ms": 1e3 * statistics.median(theirs_fixed),
    }


def show(name: str, res: dict[str, Any]) -> None:
    print(
        f"{name}: trainer {res['trainer_updates_per_s']:.1f} upd/s ({res['trainer_us_per_update']:.1f} us), "
        f"hand loop {res['hand_updates_per_s']:.1f} upd/s ({res['hand_us_per_update']:.1f} us), ratio "
        f"{res['ratio']:.3f} [{res['ratio_min']:.3f}..{res['ratio_max']:.3f}]; whole runs "
        f"{res['whole_run_ratio']:.3f} (fixed: trainer {res['trainer_fixed_ms']:.0f} ms, hand loop "
        f"{res['hand_fixed_ms']:.0f} ms)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--updates", type=int, default=400, help="updates per round, mid-sized MLP (x4: tiny)"
    )
    parser.add_argument("--rounds", type=int, default=10, help="rounds per model (each: one run of both)")
    parser.add_argument("--skip", type=int, default=20, help="first updates of each run left out (start-up)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, the same for both sides")
    parser.add_argument(
        "--hand-optimizer",
        choices=["default", "fused"],
        default="default",
        help="the hand loop's AdamW: torch's default (what a script writes) or the trainer's fused kernel "
        "(the loop's own overhead alone)",
    )
    args = parser.parse_args()
    global HAND_FUSED
    HAND_FUSED = args.hand_optimizer == "fused"
    if args.updates <= args.skip or args.rounds < 1:
        parser.error("--updates must exceed --skip, and --rounds be at least 1")
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    mid = compare([512, 512], 256, args.updates, args.rounds, args.skip, args.threads)
    small = compare([64, 64], 32, args.updates * 4, args.rounds, args.skip, args.threads)
    load_after = os.getloadavg()
    show("mid-sized MLP [512,512] batch 256", mid)
    show("tiny MLP [64,64] batch 32", small)
    print(f"load average (1/5/15 min) before {load_before}, after {load_after}")
    result: dict[str, Any] = {k: round(v, 4) for k, v in mid.items()}
    result.update({f"small_model_{k}": round(v, 4) for k, v in small.items()})
    result.update(
        rounds=args.rounds,
        updates=args.updates,
        threads=args.threads,
        hand_optimizer=args.hand_optimizer,
        load_before=round(load_before[0], 2),
        load_after=round(load_after[0], 2),
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
