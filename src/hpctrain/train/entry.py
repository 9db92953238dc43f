"""One training process from start to end: the life cycle of a run in one place.

`run(cfg, env, make_task)` is what `hpctrain train` and the submitit job both call; `make_task` comes from the
workload registry (hpctrain.workloads.registry.make_task), handed down by the caller: the engine names no workload.
1. stop handlers first: `hpctrain train` installed them before anything else (runtime/signals.py), other
   callers get them here (this module imports no torch): a USR1 during the slow torch import must not kill us;
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

import datetime
import logging
import os
import socket
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from pydantic import BaseModel

from hpctrain.config.dump import differences, override_text, to_yaml
from hpctrain.config.schema import ConfigBase
from hpctrain.config.secrets import mask_handlers, mask_secrets
from hpctrain.errors import EXIT_RESUMABLE, UserError
from hpctrain.fsutil import atomic_write_text, no_room_is_user_error, open_append
from hpctrain.remote.uris import MissingPathError
from hpctrain.runtime.budget import StopSignals, TimeBudget, process_start
from hpctrain.runtime.env import ClusterEnv
from hpctrain.runtime.signals import for_run, owns_process
from hpctrain.runtime.threads import CoreProbe
from hpctrain.track.cancel import PREDECESSOR, read_mark, remove_mark
from hpctrain.track.chain import process_start_time
from hpctrain.train.preflight import check_config
from hpctrain.train.remote_ckpt import prepare_tokens

if TYPE_CHECKING:
    from hpctrain.train.outcome import RunResult
    from hpctrain.train.task import TaskFactory
    from hpctrain.train.trainer import Trainer

log = logging.getLogger(__name__)


def _logging(env: ClusterEnv) -> None:
    """`logging` records in the console lines' own form (`warning: ...`, `[rank 1] warning: ...` when there are
    several ranks), not a timestamped record among plain lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LineFormatter(f"[rank {env.rank}] " if env.world_size > 1 else ""))
    logging.basicConfig(level=logging.INFO if env.is_main else logging.WARNING, handlers=[handler])
    # whoever logs (we, fsspec, pelicanfs, torch), a token inside a URI never reaches stderr or training.log
    mask_handlers(*logging.getLogger().handlers)


class LineFormatter(logging.Formatter):
    """A record as a plain line: its message, after `warning: ` or `error: ` (info: nothing), a rank prefix."""

    def __init__(self, prefix: str = "") -> None:
        super().__init__()
        self.prefix = prefix

    def format(self, record: logging.LogRecord) -> str:
        level = "" if record.levelno < logging.WARNING else f"{record.levelname.lower()}: "
        text = f"{self.prefix}{level}{record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def run(
    cfg: ConfigBase,
    env: ClusterEnv,
    make_task: TaskFactory,
    verbose: bool = False,
    naming: str | None = None,
    config_file: str | None = None,
) -> int:
    """Train the run `cfg` names in this process; returns the exit code (0 finished, 75 stopped, resumable).
    `verbose`: print the whole config at start (config.yaml in the run folder always has it). `naming`: how an
    automatic run.name was formed (config/naming.py), said with the run folder first. `config_file`: the YAML
    it came from, whose git tree each hop records (train/what_ran.py)."""
    signals = for_run()  # `hpctrain train` installed them first thing (kept until exit); else installed here
    # Filled as soon as it exists, so that a build failing half-way is still closed.
    built: list[Trainer] = []
    # the run's last line, said once the trainer closed (its own closing lines first)
    ending: list[Callable[[], None]] = []
    error: BaseException | None = None
    _logging(env)  # first: a handler added before it would stop basicConfig from adding stderr's
    # how busy the cores are while the process starts: the thread count of a single CPU process
    probe = CoreProbe() if cfg.train.threads == 0 and env.world_size == 1 else None
    out = RunOutput(env)
    try:
        problems = check_config(cfg, writable=env.is_main)
        if problems:
            raise UserError("; ".join(problems))
        prepare_tokens(cfg)  # data.pelican.auto_token: the login (cached; a batch job without one: exit 2)
        out.say(f"run folder {cfg.run.dir} ({naming or f'run.name={cfg.run.name}'})")
        with (
            no_room_is_user_error()
        ):  # a full disk or quota (config.yaml, chain.json, a save): one line, exit 2
            return _train(cfg, env, make_task, signals, built, out, verbose, probe, ending, config_file)
    except BaseException as exc:
        error = exc
        raise
    finally:

        def close_trainer() -> None:
            if built:
                built[0].close()  # its own last lines (the data's totals of the hop) come before the run's
            for say_last in ending:
                say_last()

        _close_all(
            [
                ("the trainer", close_trainer),
                ("the stop signal handlers", signals.close),
                ("the process group", lambda: _teardown(clean=error is None)),
                ("training.log", out.close),
            ],
            error,
        )


def _train(
    cfg: ConfigBase,
    env: ClusterEnv,
    make_task: TaskFactory,
    signals: StopSignals,
    built: list[Trainer],
    out: RunOutput,
    verbose: bool,
    probe: CoreProbe | None,
    ending: list[Callable[[], None]],
    config_file: str | None = None,
) -> int:
    say = out.say
    run_dir = cfg.run.dir
    if verbose:
        say(to_yaml(cfg), end="")
    else:  # the whole of it goes to the run folder (config.yaml), here the keys set away from the defaults
        say(_config_summary(cfg, run_dir))
    # torch comes in here (seconds; the lines above were said first), after run() put the stop handlers in (a USR1
    # during its import is a requeue)
    from hpctrain.train.first_update import on_first_update
    from hpctrain.train.trainer import Trainer

    mark = read_mark(run_dir)
    if mark is not None and (
        mark.names(env.scheduler_job, os.environ.get(PREDECESSOR)) or mark.time >= process_start_time()
    ):
        # `hpctrain cancel` named this job (or came after this process started): the chain ends here
        say(f"the run was {mark.said()}: not training; it is resumable (submit or run it again to continue)")
        return EXIT_RESUMABLE
    # budget.time_limit counts from the process start when the process is this run's (`hpctrain train`)
    budget = TimeBudget(
        cfg.budget, env, signals, started=process_start(env) if owns_process(signals) else None
    )
    with _user_mistakes():
        task = make_task(cfg, env)
        built.append(Trainer(cfg, task, env, run_dir, budget, config_file, probe))
        trainer = built[0]
        trainer.build()
    if mark is not None and env.is_main:  # a start the cancel did not name: the run goes on, the mark goes
        remove_mark(run_dir)
        say(f"continuing the run that was {mark.said()}")
    # chain.json's startup_seconds: the hop's start to its first update (chain is read when that comes: the
    # resume may replace it).
    on_first_update(trainer.optimizers, lambda: trainer.chain.first_update_done())
    _describe(env, trainer, budget, run_dir, say)
    with _user_mistakes(resuming=run_dir):
        resumed = trainer.resume()
    if env.is_main:
        # Only now: the run really starts with this config (a failed resume above left config.yaml alone).
        atomic_write_text(run_dir / "config.yaml", to_yaml(cfg))
    # Like config.yaml, only once the resume succeeded (a refused one changes nothing in the folder): from here on
    # every hop's lines also go to its training.log, the lines said so far first.
    out.open(run_dir)
    say(resumed)
    say(_batch_and_lr(cfg, env, trainer))
    trainer.start_tracking(out.file)
    result = trainer.fit()
    ending.append(lambda: _last_line(result, cfg, env, trainer, out))
    return result.exit_code


def _last_line(result: RunResult, cfg: ConfigBase, env: ClusterEnv, trainer: Trainer, out: RunOutput) -> None:
    """The run's last line: finished, stopped (resumable) or already finished, with its params_sha256; or the
    failure (exit 1), on stderr."""
    say, total = out.say, trainer.counters.total_updates
    if result.status == "already_finished":
        say(
            f"run {cfg.run.name!r} already finished at update {result.step} ({cfg.run.dir}); "
            "raise train.total_updates to train further (with checkpoint.accept_changes=[train.total_updates] "
            f"where the LR schedule depends on the length). params_sha256={result.params_sha256}"
        )
    elif result.status == "failed":  # e.g. a non-finite loss: one line, exit 1, `latest` the last good state
        if env.is_main:
            print(f"error: {mask_secrets(result.message)}", file=sys.stderr, flush=True)
            out.note(f"error: {result.message}")
    elif result.status == "stopped":
        say(
            f"stopped ({result.reason}) at update {result.step}/{total}; run the same command again to "
            f"continue. params_sha256={result.params_sha256}"
        )
    else:
        say(f"finished at update {result.step}/{total}. params_sha256={result.params_sha256}")
    if result.copy_failures and env.is_main:
        done = result.status in ("finished", "already_finished")  # nothing will send them but a new start
        _say_copies(result.copy_failures, cfg.run.dir, failed=done, out=out)


def _say_copies(failures: dict[str, str], run_dir: Path, failed: bool, out: RunOutput) -> None:
    """One line per checkpoint copy that did not arrive: an error when it fails the start (a finished run),
    a warning when the next start sends it anyway (a stopped one)."""
    for dest, why in failures.items():
        again = (
            "run the same command again to copy them (nothing is trained again)"
            if failed
            else "the next start copies them again"
        )
        line = (
            f"the checkpoints were not copied to {dest} ({why}); those in {run_dir / 'checkpoints'} are "
            f"complete: {again}"
        )
        text = f"{'error' if failed else 'warning'}: {line}"
        print(text, file=sys.stderr, flush=True)
        out.note(text)


class RunOutput:
    """Rank 0's console lines, also appended to `<run folder>/training.log` (every hop, each under a header
    line, with the warnings of the `logging` module) once the run folder is locked: users `tail -f` it on a
    cluster whatever the scheduler does with stdout. What is said before the lock is written when it opens."""

    def __init__(self, env: ClusterEnv) -> None:
        self.env = env
        self.file: TextIO | None = None
        self._pending: list[str] = []
        self._handler = _LogLines(self._write)
        mask_handlers(self._handler)
        if env.is_main:
            logging.getLogger().addHandler(self._handler)

    def _write(self, text: str) -> None:
        if self.file is not None:
            self.file.write(text)
            self.file.flush()
        else:
            self._pending.append(text)

    def say(self, text: str, end: str = "\n") -> None:
        if self.env.is_main:
            text = mask_secrets(text)  # a URI with its token in a line (the config printed, a path)
            print(text, end=end, flush=True)
            self._write(text + end)

    def note(self, text: str) -> None:
        """A line for training.log only (already shown elsewhere, e.g. on stderr)."""
        self._write(mask_secrets(text) + "\n")

    def open(self, run_dir: Path) -> None:
        if not self.env.is_main:
            return
        self.file = open_append(run_dir / "training.log")  # a planted link is refused, never followed
        when = datetime.datetime.now().isoformat(timespec="seconds")
        self.file.write(f"==== {when} on {socket.gethostname()} ({self.env.job_id or 'no job'}) ====\n")
        self._write("".join(self._pending))
        self._pending.clear()

    def close(self) -> None:
        logging.getLogger().removeHandler(self._handler)
        if self.file is not None:
            self.file.close()
            self.file = None


class _LogLines(logging.Handler):
    """Warnings and errors of the `logging` module, as lines for training.log."""

    def __init__(self, write: Callable[[str], None]) -> None:
        super().__init__(logging.WARNING)
        self.setFormatter(LineFormatter())
        self._write = write

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._write(self.format(record) + "\n")
        except Exception:  # never let the log file break the run (a full disk is handled where it matters)
            self.handleError(record)


def _config_summary(cfg: ConfigBase, run_dir: Path) -> str:
    """One line: where the whole config is written, and the keys set away from their defaults as overrides
    (`optim.lr=0.003`), the run's name left out (said with its folder). `--verbose` prints it all."""
    changed = {k: _without_defaults(cfg, k, v) for k, v in differences(cfg).items() if k != "run.name"}
    shown = " ".join(f"{k}={override_text(v)}" for k, v in list(changed.items())[:16])
    more = f" ... ({len(changed) - 16} more)" if len(changed) > 16 else ""
    return f"config ({run_dir / 'config.yaml'}; --verbose prints it): {shown or 'the defaults'}{more}"


def _without_defaults(cfg: ConfigBase, key: str, value: Any) -> Any:
    """A list of sections (schedule.stages) with each item's own defaults left out, its `type` kept."""
    held: Any = cfg
    for part in key.split("."):
        held = getattr(held, part, None)
    if not isinstance(held, list) or not all(isinstance(item, BaseModel) for item in held):
        return value
    kept = []
    for item in held:
        short = item.model_dump(mode="json", exclude_defaults=True)
        kind = getattr(item, "type", None)
        kept.append({"type": kind, **short} if kind is not None else short)
    return kept


def _describe(
    env: ClusterEnv,
    trainer: Trainer,
    budget: TimeBudget,
    run_dir: Path,
    say: Callable[..., None],
) -> None:
    setup = trainer.setup
    threads = f"{setup.threads} CPU thread{'s' if setup.threads > 1 else ''} ({setup.threads_source})"
    say(f"{env.describe()}; device {trainer.device}; {threads}; run folder {run_dir}")
    if setup.precision_note:
        say(setup.precision_note)
    if budget.deadline is not None:
        say(f"deadline in {budget.remaining():.0f} s ({budget.deadline_source})")


def _batch_and_lr(cfg: ConfigBase, env: ClusterEnv, trainer: Trainer) -> str:
    """The global batch and the LR, said once the resume put the update count back: the LR the next update uses
    (the schedule's at the resumed update), not only the effective optim.lr it scales."""
    step = trainer.counters.step
    factor = trainer.schedule.factor(step)
    said = (
        f"batch {cfg.data.batch_size} per process x {env.world_size} processes x "
        f"{cfg.train.grad_accum_steps} accumulation = global batch {trainer.setup.global_batch}; "
        f"effective lr {', '.join(f'{k} {v:.3g}' for k, v in trainer.base_lrs.items())} "
        f"(optim.lr_scaling={cfg.optim.lr_scaling})"
    )
    if trainer.already_finished:
        return said
    scheduled = "" if factor == 1.0 else f" (schedule factor {factor:.3g} at update {step})"
    lrs = ", ".join(f"{k} {v * factor:.3g}" for k, v in trainer.base_lrs.items())
    return f"{said}; update {step + 1} trains at lr {lrs}{scheduled}"


@contextmanager
def _user_mistakes(resuming: Path | None = None) -> Iterator[None]:
    """Turn the failures a user causes while the run is built or resumed into one-line UserErrors: missing
    inputs (the data layer's MissingPathError) and, while resuming, a checkpoint whose networks do not fit the
    configured model (a changed architecture under the same run name)."""
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
    """Leave the process group, if this process ever loaded the module that joins one: a run refused before the
    trainer was built (a config mistake, a missing checkpoint.resume) ends in a second, not after torch's import."""
    dist = sys.modules.get("hpctrain.runtime.dist")
    if dist is not None:
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
