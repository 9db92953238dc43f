"""`hpctrain submit`: validate the config and the job settings, then queue the training through submitit.

    hpctrain submit [--config FILE] [--preset NAME] [key=value ...] [--dry-run] [--local] [--check]
    hpctrain submit [...] --sweep KEY=V1,V2,... [--sweep ...] [--sweep-file FILE] [--max-parallel N] [--yes]

`--sweep`/`--sweep-file` queue one job array of a grid instead (hpctrain.launch.sweep), with slurm/sweep.sh's
body. `--check` only validates (the sbatch templates call it first, in the batch shell, against the running
allocation) and prints the settings the templates need as shell assignments. Every mode checks the job
settings and what can be checked before queueing (inputs, token file, output folders, resume path: see
hpctrain.train.preflight). A failing sbatch or submitit is one line naming the command and its stderr, exit 2.
Never imports torch: login nodes are slow.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from hpctrain.commands.common import (
    ArgParser,
    add_config_arguments,
    announce,
    config_request,
    resolve_from_args,
)
from hpctrain.config.loading import ConfigRequest, Provenance
from hpctrain.config.provenance import Layer
from hpctrain.config.schema import ConfigBase
from hpctrain.config.secrets import mask_secrets
from hpctrain.errors import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK, UserError
from hpctrain.fsutil import atomic_write_text, private_folder
from hpctrain.launch import sbatch, sweep
from hpctrain.launch.sweep import MAX_ELEMENTS
from hpctrain.runtime.torch_build import cuda_problem
from hpctrain.train.preflight import check_config

DEFAULT_MAX_PARALLEL = 10  # a sweep's elements running at once, unless --max-parallel says otherwise


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
    sweep = parser.add_argument_group("sweeps (one job array, one run folder per element; docs/slurm.md)")
    sweep.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="KEY=V1,V2,...",
        help="a key and its values (repeat for a grid), e.g. --sweep optim.lr=1e-5,2e-5 --sweep "
        "model.hidden=[64],[128]",
    )
    sweep.add_argument("--sweep-file", metavar="FILE", help="a YAML mapping key -> list of values (a grid)")
    sweep.add_argument(
        "--max-parallel",
        type=int,
        default=DEFAULT_MAX_PARALLEL,
        metavar="N",
        help=f"elements running at once (the array's %%N; default {DEFAULT_MAX_PARALLEL})",
    )
    sweep.add_argument(
        "--yes", action="store_true", help=f"queue a sweep of more than {MAX_ELEMENTS} elements"
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
    if given is not None and given.layer is not Layer.PRESET:
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

        array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
        # An array task by its array form: its own id may be the array's, which scontrol answers for every task.
        job = f"{array}_{task}" if array and task else os.environ["SLURM_JOB_ID"]
        fields = _allocation_fields(job, os.environ)
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
        # train.requeue_exit_code: the training's exit code for a resumable stop (the template reads it as 75)
        "requeue_code": cfg.train.requeue_exit_code,
    }
    return "".join(f"hpctrain_{k}={shlex.quote(str(v))}\n" for k, v in values.items())


def _absolute(request: ConfigRequest) -> ConfigRequest:
    """The job may start in another folder than the submitter's shell: make file paths absolute."""
    config = str(Path(request.config_path).resolve()) if request.config_path else None
    # the file the submitter's shell reads, or "" (none) where the default .env is missing: never the job
    # folder's .env; a named file stays named (missing, it is refused when the request is resolved)
    env = request.env_file
    env_file = str(Path(env).resolve()) if env and (request.env_file_named or Path(env).is_file()) else ""
    return replace(request, config_path=config, overrides=list(request.overrides), env_file=env_file)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.sweep or args.sweep_file:
        return _sweep(args)
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
    request = _absolute(config_request(args))
    job = _submit(cfg, folder, args.local, TrainJob(request, registry.resolve, registry.make_task))
    print(f"job {job.job_id}; run folder {run_dir.resolve()}", flush=True)
    if args.local:
        return _wait_local(job)
    return EXIT_OK


def _sweep(args: Any) -> int:
    """One job array: every element resolved and checked first, then the plan and the script written, then
    one sbatch (or, with --dry-run, the plan and the script printed, nothing written or queued)."""
    from hpctrain.config.naming import default_run_name
    from hpctrain.workloads import registry

    if args.local or args.check:
        raise UserError("--sweep queues one SLURM job array: not with --local or --check")
    if args.max_parallel < 1:
        raise UserError(f"--max-parallel must be at least 1, not {args.max_parallel}")
    axes = sweep.parse_sweep_args(args.sweep)
    for key, values in (sweep.read_sweep_file(args.sweep_file) if args.sweep_file else {}).items():
        if key in axes:
            raise UserError(f"--sweep {key}: also in --sweep-file {args.sweep_file}; give it once")
        axes[key] = values
    sweep.check_axes(axes, registry.config_model(), list(args.overrides), args.yes)
    request = _absolute(config_request(args))
    elements, cfg = sweep.build_plan(
        request, axes, registry.resolve, lambda cfg, sources: check(cfg, args, sources)[0]
    )
    base = default_run_name(args.config, args.preset if args.config or args.preset else "debug")
    folder = _sweep_folder(base)
    plan, script = folder / "plan.json", folder / "sweep.sh"
    text = sbatch.render_sweep_script(cfg.slurm, f"hpctrain-sweep-{base}", str(script), str(plan))
    command = ["sbatch", "--parsable", f"--array={sbatch.array_range(len(elements), args.max_parallel)}"]
    command += [str(script), "--sweep-plan", str(plan)]
    cap = min(args.max_parallel, len(elements))
    print(
        f"sweep of {len(elements)} runs ({' x '.join(f'{k}: {len(v)}' for k, v in axes.items())}), ", end=""
    )
    print(f"one job array, at most {cap} at once:")
    width = max(len(str(e.run_dir)) for e in elements)
    for e in elements:
        print(mask_secrets(f"  {e.index:>3}  {e.run_dir!s:<{width}}  {' '.join(e.overrides)}"))
    if args.dry_run:
        print(f"# {shlex.join(command)}   (dry run: nothing written, nothing queued)")
        print(text, end="")
        return EXIT_OK
    sbatch.ensure_log_dir()
    # the job reads its `hpctrain train` arguments from plan.json: nobody else may write there
    private_folder(
        folder, "the sweep's folder", "choose another project folder, or fix the folder's owner and mode"
    )
    sweep.write_plan(plan, sweep.plan_record(request, axes, elements))
    atomic_write_text(script, text)
    job = _run_sbatch(command)
    print(f"job array {job} (tasks 0-{len(elements) - 1}); plan {plan}", flush=True)
    return EXIT_OK


def _sweep_folder(base: str) -> Path:
    """logs/slurm/sweeps/<base>-<time>, one that no earlier sweep uses (two in one second get -2, -3, ...)."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    folder = (Path(sbatch.LOG_DIR) / "sweeps" / f"{base}-{stamp}").resolve()
    candidate, n = folder, 1
    while candidate.exists():
        n += 1
        candidate = folder.with_name(f"{folder.name}-{n}")
    return candidate


def _run_sbatch(command: list[str]) -> str:
    """sbatch's job id; a missing or refusing sbatch is one UserError with its stderr."""
    if shutil.which("sbatch") is None:
        raise UserError(
            "sbatch not found on PATH; run `hpctrain submit --sweep` on a SLURM login node (or --dry-run)"
        )
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        raise UserError(f"sbatch failed: {type(exc).__name__}: {_one_line(str(exc))}") from None
    if done.returncode != 0:
        raise UserError(f"sbatch failed (exit {done.returncode}): {_one_line(done.stderr or done.stdout)}")
    return done.stdout.strip().split(";")[0]


def _one_line(text: str) -> str:
    return " | ".join(line.strip() for line in str(text).splitlines() if line.strip()) or "(no message)"


def _submit(cfg: ConfigBase, folder: Path, local: bool, job: Any) -> Any:
    """executor.submit, with sbatch's and submitit's failures as one UserError naming the command."""
    from submitit.core.utils import FailedJobError

    from hpctrain.launch.submitit_launcher import make_executor

    what = "submitit's local executor" if local else "sbatch (through submitit)"
    # the job unpickles what submitit writes there (the callable, its arguments): ours alone, or it would run a
    # pickle someone else planted
    private_folder(
        folder,
        "submitit's job folder",
        f"it holds only submitted jobs and their logs: remove it (`rm -rf {folder}`) or fix its owner and mode",
    )
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
    # its output is not on the terminal: say where it went (submitit's folder of the job)
    print(f"local job {job.job_id} exited {code}; its output: {job.paths.stdout} and {job.paths.stderr}")
    return code
