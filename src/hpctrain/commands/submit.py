"""`hpctrain submit`: validate the config and the job settings, then queue the training through submitit.

    hpctrain submit [--config FILE] [--preset NAME] [key=value ...] [--dry-run] [--local] [--check]

`--check` only validates (the sbatch templates call it first, in the batch shell, against the running
allocation) and prints the settings the templates need as shell assignments. Never imports torch:
login nodes are slow.
"""

from __future__ import annotations

import shlex
from dataclasses import replace
from pathlib import Path
from typing import Any

from hpctrain.commands.common import ArgParser, add_config_arguments, config_from_args
from hpctrain.config.loading import ConfigRequest
from hpctrain.errors import EXIT_OK, UserError
from hpctrain.launch import sbatch


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
        help="(templates) the signal lead of the running job's #SBATCH --signal line, in seconds",
    )
    return parser


def job_shape(cfg: Any, args: Any) -> sbatch.JobShape:
    """Inside a batch shell: the running allocation. Elsewhere: what the slurm section asks for."""
    if args.check and sbatch.in_batch_shell():
        import os

        from hpctrain.runtime.slurm import job_fields

        fields = job_fields(os.environ["SLURM_JOB_ID"])
        return sbatch.shape_from_allocation(fields, os.environ, args.signal_lead, cfg.slurm.launcher)
    shape = sbatch.shape_from_config(cfg.slurm)
    return shape if args.signal_lead is None else replace(shape, signal_lead_seconds=args.signal_lead)


def check(cfg: Any, args: Any) -> Path:
    """Raise UserError (exit 2) naming every mistake; return the run folder."""
    run_dir = Path(cfg.run.out_dir) / cfg.run.name
    errors = sbatch.validate_job(cfg, job_shape(cfg, args), run_dir)
    if errors:
        raise UserError("; ".join(errors))
    return run_dir


def shell_settings(cfg: Any, run_dir: Path) -> str:
    slurm = cfg.slurm
    values = {
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
    cfg = config_from_args(args)
    run_dir = check(cfg, args)
    if args.check:
        print(shell_settings(cfg, run_dir), end="")
        return EXIT_OK
    from hpctrain.launch.submitit_launcher import TrainJob, make_executor, sbatch_text

    folder = sbatch.ensure_log_dir().resolve() / "submitit"
    if args.dry_run:
        print(sbatch_text(cfg, folder), end="")
        print(f"# run folder: {run_dir.resolve()} (dry run: nothing submitted)")
        return EXIT_OK
    request = _absolute(ConfigRequest(args.config, args.preset, list(args.overrides), args.env_file))
    executor = make_executor(cfg, folder, local=args.local)
    job = executor.submit(TrainJob(request))
    print(f"job {job.job_id}; run folder {run_dir.resolve()}", flush=True)
    if args.local:
        code = int(job.result())
        print(f"local job {job.job_id} exited {code}")
        return code
    return EXIT_OK
