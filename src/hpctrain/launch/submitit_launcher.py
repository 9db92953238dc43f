"""`hpctrain submit` through submitit: a checkpointable training callable and the executor built from `slurm`.

How a stop works under submitit (never a save inside a signal handler):
1. submitit asks SLURM for `--signal=USR2@<slurm.signal_lead_seconds>`, which reaches every task.
2. While the trainer runs, its own StopSignals handler (installed by `hpctrain.train.entry.run`, the same life
   cycle `hpctrain train` runs, on every rank, over submitit's) only sets a flag; all ranks agree at the next
   step boundary, save once, and return 75.
3. Then, on global rank 0, `TrainJob` hands over to submitit's own requeue path
   (`SignalHandler.checkpoint_and_try_requeue`): it calls `checkpoint()`, which saves nothing and returns the
   same callable (the run folder holds the state), counts the timeout against `max_num_timeout` (set from
   slurm.max_resubmits) and runs `scontrol requeue`. The no-progress cap (chain.json) is checked first.
If the signal comes while no trainer runs (start-up, teardown), submitit's handler calls `checkpoint()` itself
and requeues: there is nothing to save then either.

The job is handed what it needs from the workloads by `hpctrain submit`: the config resolution and the task
factory of the workload registry (pickled by reference). This module imports no command and no workload.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctrain.config.loading import ConfigRequest, Provenance
from hpctrain.config.schema import ConfigBase, SlurmConfig, parse_duration
from hpctrain.errors import EXIT_BAD_INPUT, EXIT_OK, EXIT_RESUMABLE, UserError
from hpctrain.launch.chain import cancelled, decide, read_hops
from hpctrain.launch.sbatch import tasks_per_node
from hpctrain.track.cancel import read_mark

if TYPE_CHECKING:
    from hpctrain.runtime.env import ClusterEnv
    from hpctrain.train.task import TaskFactory

log = logging.getLogger(__name__)


class JobInputError(RuntimeError):
    """A user mistake found inside the job (the config or data changed since submission): one line."""


@dataclass
class TrainJob:
    """The training of one run folder, resumable any number of times. Pickled by submitit."""

    request: ConfigRequest  # paths made absolute at submission; the job inherits the submitter's environment
    resolve: Callable[[ConfigRequest], tuple[Any, Provenance]]  # the same resolution as `hpctrain train`
    make_task: TaskFactory  # the workload's task for a config

    def __call__(self) -> int:
        from hpctrain.config.provenance import announce
        from hpctrain.runtime.env import ClusterEnv
        from hpctrain.train import entry

        try:
            cfg, sources = self.resolve(self.request)
            announce(sources)  # the job's log names what came from the environment, as `hpctrain train` does
            env = ClusterEnv.from_environ()
            code = entry.run(
                cfg, env, self.make_task, naming=sources.naming, config_file=self.request.config_path
            )
        except UserError as exc:
            # The job fails (submitit and SLURM see it), its log ends with the one line that says why.
            raise JobInputError(f"error: {exc} (exit code {EXIT_BAD_INPUT})") from None
        if code == EXIT_RESUMABLE and env.is_main:
            self._requeue(cfg, env)
        if code not in (EXIT_OK, EXIT_RESUMABLE):
            raise RuntimeError(f"training failed with exit code {code}; see the job's log")
        _end_without_finalization()
        return code

    def _requeue(self, cfg: ConfigBase, env: ClusterEnv) -> None:
        """After the trainer saved and stopped: submitit's requeue path, unless a chain cap says stop."""
        slurm = cfg.slurm
        stop = cancelled(read_mark(cfg.run.dir), env.scheduler_job, None)
        if stop is not None:  # `hpctrain cancel`: the hop saved and stopped; nothing follows it
            log.warning("not requeued: %s", stop.reason)
            return
        verdict = decide(
            read_hops(cfg.run.dir), "start", 0, slurm.max_resubmits, slurm.max_hops_without_progress
        )
        if not verdict.go:
            raise RuntimeError(f"not requeued: {verdict.reason}")
        if slurm.resubmit == "none" or not env.job_id or os.environ.get("SUBMITIT_EXECUTOR") != "slurm":
            return  # stopped and resumable: `hpctrain submit` again continues
        from submitit.core.job_environment import JobEnvironment, SignalHandler
        from submitit.core.utils import DelayedSubmission

        job_env = JobEnvironment()
        paths = job_env.paths
        delayed = DelayedSubmission.load(paths.submitted_pickle)
        SignalHandler(job_env, paths, delayed).checkpoint_and_try_requeue(signal.SIGUSR2)

    def checkpoint(self) -> Any:
        """submitit's hook: the trainer has saved already (or never started); continue with the same job."""
        from submitit.core.utils import DelayedSubmission

        return DelayedSubmission(TrainJob(self.request, self.resolve, self.make_task))


def _end_without_finalization() -> None:
    """A rank that joined a process group ends without the interpreter's finalization (dist.end_process says
    why). Under submitit the process ends after submitit records this call's result: at exit, once that record
    exists, the process ends as submitit would have ended it (exit 0, every exit handler run) minus the
    finalization; without the record, submitit's own exit stands."""
    from hpctrain.runtime import dist  # loaded already: the training ran in this process

    if not dist.joined() or not os.environ.get("SUBMITIT_FOLDER"):
        return
    from submitit.core.job_environment import JobEnvironment

    result = JobEnvironment().paths.result_pickle

    def at_exit() -> None:
        atexit.unregister(at_exit)
        if result.exists():
            dist.end_process(EXIT_OK)

    atexit.register(at_exit)


def job_comment(run_dir: Path, via: str) -> str:
    """The job's SLURM comment: how `hpctrain cancel --job ID` finds its run folder, and how the job is signalled
    (`via`: sbatch = a template, whose batch shell passes signals on; submitit = steps only)."""
    return f"hpctrain:{via}:{Path(run_dir).resolve()}"


def executor_parameters(slurm: SlurmConfig, job_name: str, run_dir: Path | None = None) -> dict[str, Any]:
    """submitit SlurmExecutor parameters from the slurm section (the same request as the templates)."""
    params: dict[str, Any] = {
        "job_name": job_name,
        "nodes": slurm.nodes,
        "ntasks_per_node": tasks_per_node(slurm),
        "cpus_per_task": slurm.cpus_per_task,
        "time": math.ceil(parse_duration(slurm.time) / 60),
        "signal_delay_s": slurm.signal_lead_seconds,
    }
    if slurm.gpus_per_node:
        params["gpus_per_node"] = slurm.gpus_per_node
    if run_dir is not None:
        params["comment"] = job_comment(run_dir, "submitit")
    for key in ("partition", "account", "qos", "constraint", "mem"):
        value = getattr(slurm, key)
        if value:
            params[key] = value
    extra: dict[str, Any] = {"requeue": True} if slurm.resubmit == "requeue" else {}
    for arg in slurm.extra_args:
        key, sep, value = arg.lstrip("-").partition("=")
        extra[key.replace("-", "_")] = value if sep else True
    if extra:
        params["additional_parameters"] = extra
    return params


def make_executor(cfg: ConfigBase, folder: Path, local: bool = False) -> Any:
    import submitit

    slurm: SlurmConfig = cfg.slurm
    name = f"hpctrain-{cfg.run.name}"
    if local:
        executor = submitit.LocalExecutor(folder=folder)
        executor.update_parameters(
            timeout_min=math.ceil(parse_duration(slurm.time) / 60),
            tasks_per_node=1,
            signal_delay_s=slurm.signal_lead_seconds,
        )
        return executor
    # submitit counts any signal in a job under ~50 min as a timeout, 3 at most by default: our cap instead.
    slurm_executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=slurm.max_resubmits)
    slurm_executor.update_parameters(**executor_parameters(slurm, name, cfg.run.dir))
    return slurm_executor


def sbatch_text(cfg: ConfigBase, folder: Path) -> str:
    """The sbatch script submitit would submit for this config (for --dry-run)."""
    from submitit.slurm.slurm import _make_sbatch_string

    params = executor_parameters(cfg.slurm, f"hpctrain-{cfg.run.name}", cfg.run.dir)
    command = "python -u -m submitit.core._submit " + str(folder)
    return _make_sbatch_string(command=command, folder=str(folder), **params)
