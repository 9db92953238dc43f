"""One training process from start to end: the life cycle of a run in one place.

`run(cfg, env)` is what `hpctrain train` and the submitit job both call:
1. stop handlers first (this module imports no torch): a USR1 during the slow torch import must not kill us;
2. the pre-flight checks (inputs, token file, output folders, resume path): a mistake is one line, exit 2;
3. build the task and the trainer, then decide how to resume. Only once that succeeded is `config.yaml`
   written: a run folder whose resume failed keeps the config of the run it holds;
4. train within the budget;
5. close everything in `finally`. A closing step that fails after an error is logged and never replaces the
   error that ended the run: the root cause is what the user sees.

User mistakes raise `UserError` (one line, exit 2 from the cli); anything else propagates with its traceback
(exit 1).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctrain.config.loading import to_yaml
from hpctrain.errors import UserError
from hpctrain.runtime.env import ClusterEnv
from hpctrain.train.preflight import check_config

if TYPE_CHECKING:
    from hpctrain.runtime.budget import TimeBudget
    from hpctrain.train.trainer import Trainer

log = logging.getLogger(__name__)


def _logging(env: ClusterEnv) -> None:
    logging.basicConfig(
        level=logging.INFO if env.is_main else logging.WARNING,
        format=f"%(asctime)s [rank {env.rank}] %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def run(cfg: Any, env: ClusterEnv) -> int:
    """Train the run `cfg` names in this process; returns the exit code (0 finished, 75 stopped, resumable)."""
    from hpctrain.runtime.budget import StopSignals

    signals = StopSignals().install()
    # Filled as soon as it exists, so that a build failing half-way is still closed.
    built: list[Trainer] = []
    error: BaseException | None = None
    try:
        _logging(env)
        problems = check_config(cfg, writable=env.is_main)
        if problems:
            raise UserError("; ".join(problems))
        from hpctrain.train.remote_ckpt import prepare_tokens

        prepare_tokens(cfg)  # data.pelican.auto_token: the login (cached; a batch job without one: exit 2)
        return _train(cfg, env, signals, built)
    except BaseException as exc:
        error = exc
        raise
    finally:
        _close_all(
            [
                ("the trainer", built[0].close if built else None),
                ("the stop signal handlers", signals.close),
                ("the process group", lambda: _teardown(clean=error is None)),
            ],
            error,
        )


def _train(cfg: Any, env: ClusterEnv, signals: Any, built: list[Trainer]) -> int:
    from hpctrain.runtime.budget import TimeBudget
    from hpctrain.train.trainer import Trainer

    # The registry hands the workload over; the engine itself names none.
    from hpctrain.workloads.registry import task_factory

    say = _say(env)
    run_dir = Path(cfg.run.out_dir) / cfg.run.name
    say(to_yaml(cfg), end="")
    budget = TimeBudget(cfg.budget, env, signals)
    with _user_mistakes():
        task = task_factory(cfg.model.type)(cfg, env)
        built.append(Trainer(cfg, task, env, run_dir, budget))
        trainer = built[0]
        trainer.build()
    _describe(cfg, env, trainer, budget, run_dir)
    with _user_mistakes(resuming=run_dir):
        resumed = trainer.resume()
    if env.is_main:
        from hpctrain.fsutil import atomic_write_text

        # Only now: the run really starts with this config (a failed resume above left config.yaml alone).
        atomic_write_text(run_dir / "config.yaml", to_yaml(cfg))
    say(resumed)
    trainer.start_tracking()
    result = trainer.fit()
    if result.status == "already_finished":
        say(
            f"run {cfg.run.name!r} already finished at update {result.step} ({run_dir}); "
            f"raise train.total_updates to train further. params_sha256={result.params_sha256}"
        )
    elif result.status == "failed":  # e.g. a non-finite loss: one line, exit 1, `latest` the last good state
        if env.is_main:
            print(f"error: {result.message}", file=sys.stderr, flush=True)
    elif result.status == "stopped":
        say(
            f"stopped ({result.reason}) at update {result.step}/{trainer.total_updates}; run the same "
            f"command again to continue. params_sha256={result.params_sha256}"
        )
    else:
        say(f"finished at update {result.step}/{trainer.total_updates}. params_sha256={result.params_sha256}")
    return result.exit_code


def _say(env: ClusterEnv) -> Callable[..., None]:
    def say(text: str, end: str = "\n") -> None:
        if env.is_main:
            print(text, end=end, flush=True)

    return say


def _describe(cfg: Any, env: ClusterEnv, trainer: Trainer, budget: TimeBudget, run_dir: Path) -> None:
    say = _say(env)
    say(f"{env.describe()}; device {trainer.device}; run folder {run_dir}")
    say(
        f"batch {cfg.data.batch_size} per process x {env.world_size} processes x "
        f"{cfg.train.grad_accum_steps} accumulation = global batch {trainer.setup.global_batch}; "
        f"effective lr {', '.join(f'{k} {v:.3g}' for k, v in trainer.base_lrs.items())} "
        f"(optim.lr_scaling={cfg.optim.lr_scaling})"
    )
    if budget.deadline is not None:
        say(f"deadline in {budget.remaining():.0f} s ({budget.deadline_source})")


@contextmanager
def _user_mistakes(resuming: Path | None = None) -> Iterator[None]:
    """Turn the failures a user causes while the run is built or resumed into one-line UserErrors: missing
    inputs (the data layer's MissingPathError) and, while resuming, a checkpoint whose networks do not fit the
    configured model (a changed architecture under the same run name)."""
    from hpctrain.remote.uris import MissingPathError

    try:
        yield
    except MissingPathError as exc:
        raise UserError(str(exc)) from None
    except RuntimeError as exc:
        if resuming is None or "state_dict" not in str(exc):
            raise
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        detail = lines[1] if len(lines) > 1 else lines[0]
        detail = detail if len(detail) <= 200 else detail[:197] + "..."
        raise UserError(
            f"the checkpoint in {resuming} does not fit the configured model ({detail}); continue with the "
            "config it was written with (its config.yaml), or start afresh with another run.name or "
            "checkpoint.resume=never"
        ) from None


def _teardown(clean: bool) -> None:
    from hpctrain.runtime import dist

    dist.teardown(clean)


def _close_all(steps: list[tuple[str, Callable[[], None] | None]], error: BaseException | None) -> None:
    """Run every closing step. After an error, a failing step is logged and the error stays the one raised;
    without one, the first failing step's exception is raised once all steps ran."""
    first: BaseException | None = None
    for what, close in steps:
        if close is None:
            continue
        try:
            close()
        except Exception as exc:
            if error is not None or first is not None:
                log.error("closing %s failed as well: %s: %s", what, type(exc).__name__, exc)
            else:
                first = exc
    if first is not None:
        raise first
