"""`hpctrain train`: build the run, train within the time budget, close everything. Exit 0/75/2/1."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from hpctrain.commands.common import ArgParser, add_config_arguments, config_from_args
from hpctrain.config.loading import to_yaml
from hpctrain.runtime.env import ClusterEnv


def _logging(env: ClusterEnv) -> None:
    logging.basicConfig(
        level=logging.INFO if env.is_main else logging.WARNING,
        format=f"%(asctime)s [rank {env.rank}] %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def prepare_run_dir(cfg: Any, env: ClusterEnv) -> Path:
    from hpctrain.train.checkpoint import atomic_write_text

    run_dir = Path(cfg.run.out_dir) / cfg.run.name
    if env.is_main:
        (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        atomic_write_text(run_dir / "config.yaml", to_yaml(cfg))
    return run_dir


def run(cfg: Any, env: ClusterEnv) -> int:
    """The whole life cycle of one training process (also called by the submitit launcher)."""
    # Handlers first (this import has no torch): a USR1 during the slow torch import must not kill the task.
    from hpctrain.runtime.budget import StopSignals, TimeBudget

    signals = StopSignals().install()
    trainer = None
    try:
        from hpctrain.train.trainer import Trainer
        from hpctrain.workloads.registry import task_factory

        _logging(env)
        say = print if env.is_main else (lambda *a, **k: None)
        run_dir = prepare_run_dir(cfg, env)
        say(to_yaml(cfg), end="", flush=True)
        budget = TimeBudget(cfg.budget, env, signals)
        task = task_factory(cfg.model.type)(cfg, env)
        trainer = Trainer(cfg, task, env, run_dir, budget)
        trainer.build()
        say(f"{env.describe()}; device {trainer.device}; run folder {run_dir}", flush=True)
        say(
            f"batch {cfg.data.batch_size} per process x {env.world_size} processes x "
            f"{cfg.train.grad_accum_steps} accumulation = global batch {trainer.setup.global_batch}; "
            f"effective lr {', '.join(f'{k} {v:.3g}' for k, v in trainer.base_lrs.items())} "
            f"(optim.lr_scaling={cfg.optim.lr_scaling})",
            flush=True,
        )
        if budget.deadline is not None:
            say(f"deadline in {budget.remaining():.0f} s ({budget.deadline_source})", flush=True)
        say(trainer.resume(), flush=True)
        trainer.start_tracking()
        result = trainer.fit()
        if result.status == "already_finished":
            say(
                f"run {cfg.run.name!r} already finished at update {result.step} ({run_dir}); "
                "raise train.total_updates to train further",
                flush=True,
            )
        elif result.status == "failed":
            if env.is_main:
                print(f"error: {result.message}", file=sys.stderr, flush=True)
        elif result.status == "stopped":
            say(
                f"stopped ({result.reason}) at update {result.step}/{trainer.total_updates}; run the same "
                f"command again to continue. params_sha256={result.params_sha256}",
                flush=True,
            )
        else:
            say(
                f"finished at update {result.step}/{trainer.total_updates}. "
                f"params_sha256={result.params_sha256}",
                flush=True,
            )
        return result.exit_code
    finally:
        if trainer is not None:
            trainer.close()
        signals.close()
        from hpctrain.runtime import dist

        dist.teardown()


def main(argv: list[str]) -> int:
    parser = ArgParser(
        prog="hpctrain train", description="Train a model (default: the debug regression job)."
    )
    add_config_arguments(parser)
    args = parser.parse_args(argv)
    cfg = config_from_args(args)
    return run(cfg, ClusterEnv.from_environ())
