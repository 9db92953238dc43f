"""`hpctrain submit`: validate the config and the job settings, then queue the training through submitit.

    hpctrain submit [--config FILE] [--preset NAME] [key=value ...] [--dry-run] [--local] [--check]

`--check` only validates (the sbatch templates call it first, in the batch shell, against the running
allocation) and prints the settings the templates need as shell assignments. Every mode checks the job
settings and what can be checked before queueing (inputs, token file, output folders, resume path: see
hpctrain.train.preflight). A failing sbatch or submitit is one line naming the command and its stderr, exit 2.
Never imports torch: login nodes are slow.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from hpctrain.commands.common import ArgParser, add_config_arguments, announce, resolve_from_args
from hpctrain.config.loading import ConfigRequest, Provenance
from hpctrain.config.schema import ConfigBase
from hpctrain.errors import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK, UserError
from hpctrain.launch import sbatch
from hpctrain.runtime.torch_build import cuda_problem
from hpctrain.train.preflight import check_config


def _parser() -> ArgParser:
    parser = ArgParser(prog="hpctrain submit", description="Submit a training to SLURM (submitit).")
    add_config_arguments(parser)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--dry-run", action="store_true", help="validate and print the sbatch script; submit nothing"
    )
    mode.add_argument("--local", action="store_true", help="run the same path on this machine (waits for it)")
    mode.add_argument(
        "--check", action="store_true", help="validate only; print shell settings for the templates"
    )
    parser.add_argument(
        "--signal-lead",
        type=float,
        default=None,
        help="(templates) the signal lead of the running job's #SBATCH --signal line, in seconds (used when "
        "slurm.signal_lead_seconds is not given: SLURM does not show a job's --signal)",
    )
    return parser


def job_signal_lead(cfg: ConfigBase, args: Any, sources: Provenance) -> float | None:
    """The running job's signal lead. SLURM shows it nowhere (no field in `scontrol show job` on 22.05, no
    variable), and sbatch's own --signal beats the script's #SBATCH line: use slurm.signal_lead_seconds when the
    user gave it (not a default, not a preset), else the script's line; say in ONE line that it is unconfirmed."""
    given = sources.source("slurm.signal_lead_seconds")
    if given is not None and not given.startswith("preset "):
        lead: float | None = float(cfg.slurm.signal_lead_seconds)
        how = f"slurm.signal_lead_seconds={lead:g} (from {given})"
    elif args.signal_lead is not None:
        lead = args.signal_lead
        how = f"the script's #SBATCH --signal line ({lead:g} s)"
    else:
        return None
    print(
        f"warning: SLURM does not show this job's --signal; checking with {how}, which could not be confirmed "
        "(after sbatch --signal=B:USR1@N pass slurm.signal_lead_seconds=N too)",
        file=sys.stderr,
        flush=True,
    )
    return lead


def _allocation_fields(job_id: str, environ: Any) -> dict[str, str]:
    """`scontrol show job` fields; the time limit from SLURM_JOB_END_TIME - SLURM_JOB_START_TIME without it."""
    from hpctrain.runtime.slurm import job_fields

    fields = dict(job_fields(job_id))
    start, end = environ.get("SLURM_JOB_START_TIME"), environ.get("SLURM_JOB_END_TIME")
    if not fields.get("TimeLimit") and start and end and start.isdigit() and end.isdigit():
        fields["TimeLimit"] = f"{(int(end) - int(start)) // 60}"  # SLURM's limits are whole minutes
    return fields


def job_shape(cfg: ConfigBase, args: Any, sources: Provenance | None = None) -> sbatch.JobShape:
    """Inside a batch shell: the running allocation (its real time limit, GPUs, tasks; sbatch's own options
    win over the script's lines). Elsewhere: what the slurm section asks for."""
    if args.check and sbatch.in_batch_shell():
        import os

        fields = _allocation_fields(os.environ["SLURM_JOB_ID"], os.environ)
        lead = job_signal_lead(cfg, args, sources or Provenance())
        return sbatch.shape_from_allocation(fields, os.environ, lead, cfg.slurm.launcher)
    shape = sbatch.shape_from_config(cfg.slurm)
    return shape if args.signal_lead is None else replace(shape, signal_lead_seconds=args.signal_lead)


def check(cfg: ConfigBase, args: Any, sources: Provenance | None = None) -> tuple[Path, sbatch.JobShape]:
    """Raise UserError (exit 2) naming every mistake; return the run folder and the job's shape."""
    run_dir = cfg.run.dir
    shape = job_shape(cfg, args, sources)
    dry_run = bool(getattr(args, "dry_run", False))
    errors = sbatch.validate_job(cfg, shape, run_dir) + check_config(cfg, device=not dry_run)
    cuda = cuda_problem(cfg.train.device) if dry_run else None
    if cuda:  # a plan is still worth seeing; queueing it would be refused
        print(f"warning: {cuda} (queueing this job is refused until then)", file=sys.stderr)
    if errors:
        raise UserError("; ".join(errors))
    return run_dir, shape


def shell_settings(cfg: ConfigBase, run_dir: Path, shape: sbatch.JobShape | None = None) -> str:
    slurm = cfg.slurm
    lead = shape.signal_lead_seconds if shape is not None else None
    values = {
        # The lead the checks used: the template defers an early walltime warning to it.
        "signal_lead": "" if lead is None else f"{lead:g}",
        "run_dir": str(run_dir.resolve()),
        "resubmit": slurm.resubmit,
        "max_resubmits": slurm.max_resubmits,
        "max_idle": slurm.max_hops_without_progress,
        "launcher": slurm.launcher,
        "dist_timeout": int(cfg.distributed.timeout_seconds),
    }
    return "".join(f"hpctrain_{k}={shlex.quote(str(v))}\n" for k, v in values.items())


def _absolute(request: ConfigRequest) -> ConfigRequest:
    """The job may start in another folder than the submitter's shell: make file paths absolute."""
    config = str(Path(request.config_path).resolve()) if request.config_path else None
    env_file = str(Path(request.env_file).resolve()) if request.env_file else None
    return ConfigRequest(config, request.preset, list(request.overrides), env_file)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    cfg, sources = resolve_from_args(args)
    run_dir, shape = check(cfg, args, sources)
    if not args.check:  # the templates' check is followed by `hpctrain train`, which says it once
        announce(sources)
    if args.check:
        print(shell_settings(cfg, run_dir, shape), end="")
        return EXIT_OK
    from hpctrain.launch.submitit_launcher import TrainJob, sbatch_text
    from hpctrain.workloads import registry

    folder = sbatch.ensure_log_dir().resolve() / "submitit"
    if args.dry_run:
        print(sbatch_text(cfg, folder), end="")
        print(f"# run folder: {run_dir.resolve()} (dry run: nothing submitted)")
        return EXIT_OK
    from hpctrain.train.remote_ckpt import prepare_tokens

    prepare_tokens(cfg)  # data.pelican.auto_token: the device login happens here, where someone can type
    request = _absolute(ConfigRequest(args.config, args.preset, list(args.overrides), args.env_file))
    job = _submit(cfg, folder, args.local, TrainJob(request, registry.resolve, registry.make_task))
    print(f"job {job.job_id}; run folder {run_dir.resolve()}", flush=True)
    if args.local:
        return _wait_local(job)
    return EXIT_OK


def _one_line(text: str) -> str:
    return " | ".join(line.strip() for line in str(text).splitlines() if line.strip()) or "(no message)"


def _submit(cfg: ConfigBase, folder: Path, local: bool, job: Any) -> Any:
    """executor.submit, with sbatch's and submitit's failures as one UserError naming the command."""
    from submitit.core.utils import FailedJobError

    from hpctrain.launch.submitit_launcher import make_executor

    what = "submitit's local executor" if local else "sbatch (through submitit)"
    missing = [] if local else [cmd for cmd in ("sbatch", "srun") if shutil.which(cmd) is None]
    if missing:
        raise UserError(
            f"{what} failed: {' and '.join(missing)} not found on PATH; run `hpctrain submit` on a SLURM "
            "login node (or use --local, or --dry-run to see the script)"
        )
    # submitit prints sbatch's stderr itself before raising: keep it for our one line instead.
    noise = io.StringIO()
    try:
        with contextlib.redirect_stderr(noise), contextlib.redirect_stdout(noise):
            executor = make_executor(cfg, folder, local=local)
            return executor.submit(job)
    except FileNotFoundError as exc:
        name = Path(exc.filename).name if exc.filename else "sbatch"
        raise UserError(
            f"{what} failed: {name!r} was not found on PATH; run `hpctrain submit` on a SLURM login node "
            "(or use --local / --dry-run)"
        ) from None
    except FailedJobError as exc:
        raise UserError(f"{what} failed: {_one_line(str(exc) or noise.getvalue())}") from None
    except (OSError, subprocess.SubprocessError, RuntimeError, ValueError) as exc:
        raise UserError(f"{what} failed: {type(exc).__name__}: {_one_line(str(exc))}") from None


def _wait_local(job: Any) -> int:
    """The local job's exit code; a failed job is one line (its error), with the log to look at."""
    try:
        code = int(job.result())
    except Exception as exc:
        errors = re.findall(r"^\S*(?:Error|Exception): (.*)$", str(exc), flags=re.MULTILINE)
        cause = errors[-1] if errors else _one_line(str(exc))[-300:]
        bad_input = cause.startswith("error: ")
        print(
            f"error: local job {job.job_id} failed: {cause.removeprefix('error: ')} (log: {job.paths.stderr})",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT if bad_input else EXIT_FAILURE
    print(f"local job {job.job_id} exited {code}")
    return code
