"""sbatch scripts from the `slurm` section, and the checks made before a node-hour is spent.

`JobShape` is what a job gets (nodes, tasks, GPUs, time, signal lead, requeue), either requested by the config
(`hpctrain submit`) or read from the running allocation (the templates' first lines). `validate_job` compares
it with the config and with earlier hops' timings. No torch here: this runs on login nodes and in batch
shells.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain.config.schema import ConfigBase, SlurmConfig, parse_duration
from hpctrain.fsutil import make_folders
from hpctrain.launch.chain import read_hops

# The signal must leave time for one more step, one save and this much slack (process exit, srun, requeue).
SIGNAL_MARGIN_SECONDS = 3.0
# Save time assumed before any hop has measured one.
DEFAULT_SAVE_SECONDS = 2.0
LOG_DIR = "logs/slurm"


@dataclass(frozen=True)
class JobShape:
    nodes: int
    tasks_per_node: int
    gpus_per_node: int
    time_seconds: float | None  # None = no limit
    signal_lead_seconds: float | None
    requeue: bool
    launcher: str = "srun"

    @property
    def processes(self) -> int:
        """World size: one process per task under srun, one per GPU (or 1) per node under torchrun."""
        if self.launcher == "torchrun":
            return self.nodes * max(self.gpus_per_node, 1)
        return self.nodes * self.tasks_per_node


def tasks_per_node(slurm: SlurmConfig) -> int:
    """Tasks per node the config asks for: one per GPU under srun, one torchrun per node under torchrun."""
    if slurm.launcher == "torchrun":
        return 1
    if slurm.tasks_per_node is not None:
        return slurm.tasks_per_node
    return max(slurm.gpus_per_node, 1)


def shape_from_config(slurm: SlurmConfig) -> JobShape:
    return JobShape(
        nodes=slurm.nodes,
        tasks_per_node=tasks_per_node(slurm),
        gpus_per_node=slurm.gpus_per_node,
        time_seconds=parse_duration(slurm.time),
        signal_lead_seconds=float(slurm.signal_lead_seconds),
        requeue=slurm.resubmit == "requeue",
        launcher=slurm.launcher,
    )


def parse_time_limit(text: str) -> float | None:
    """SLURM's TimeLimit field ("UNLIMITED", "1-00:00:00", "00:01:00") in seconds."""
    if text in ("UNLIMITED", "INFINITE", "Partition_Limit", "NONE", ""):
        return None
    return parse_duration(text)


def shape_from_allocation(
    job: Mapping[str, str], environ: Mapping[str, str], signal_lead: float | None, launcher: str
) -> JobShape:
    """The running job's shape from `scontrol show job -o` fields and the batch shell's environment."""
    nodes = int(environ.get("SLURM_JOB_NUM_NODES") or job.get("NumNodes", "1").split("-")[0])
    tasks = int(environ.get("SLURM_NTASKS") or job.get("NumTasks", "1"))
    per_node = environ.get("SLURM_NTASKS_PER_NODE") or str(max(tasks // max(nodes, 1), 1))
    gres = job.get("TresPerNode", "")
    match = re.search(r"gpu(?::[A-Za-z0-9_-]+)?:(\d+)", gres)
    gpus = int(match.group(1)) if match else int(environ.get("SLURM_GPUS_ON_NODE") or 0)
    return JobShape(
        nodes=nodes,
        # Under torchrun the template launches ONE task per node whatever the allocation's task count.
        tasks_per_node=1 if launcher == "torchrun" else int(per_node.split("(")[0].split(",")[0]),
        gpus_per_node=gpus,
        time_seconds=parse_time_limit(job.get("TimeLimit", "")),
        signal_lead_seconds=signal_lead,
        requeue=job.get("Requeue", "0") == "1",
        launcher=launcher,
    )


@dataclass(frozen=True)
class Timings:
    step_seconds: float
    save_seconds: float
    source: str


def earlier_timings(run_dir: Path, checkpoint_every: int = 0) -> Timings | None:
    """Seconds per update and per save measured by earlier hops (chain.json, summary.json), if any."""
    hops = [h for h in read_hops(run_dir) if (h.get("last_update") or 0) > (h.get("first_update") or 0)]
    if not hops:
        return None
    step = max(h.get("train_seconds", 0.0) / (h["last_update"] - h["first_update"]) for h in hops)
    save = DEFAULT_SAVE_SECONDS
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
        total = float(summary.get("seconds", {}).get("checkpoint", 0.0))
    except (OSError, ValueError, AttributeError, TypeError, RecursionError):
        total = 0.0
    if total > 0:
        # The last hop saved at every `checkpoint.every` updates and once at its stop.
        last = hops[-1]
        saves = 1 + (
            (last["last_update"] - last["first_update"]) // checkpoint_every if checkpoint_every else 0
        )
        save = total / saves
    return Timings(step, save, f"earlier hops in {run_dir}")


def validate_job(cfg: ConfigBase, shape: JobShape, run_dir: Path | None = None) -> list[str]:
    """Mistakes in the job settings, each one line naming the setting. Empty when the job may be queued."""
    errors: list[str] = []
    slurm: SlurmConfig = cfg.slurm
    if shape.time_seconds is not None and shape.time_seconds <= 0:
        errors.append(f"slurm.time={slurm.time!r}: the wall time must be positive")
    lead = shape.signal_lead_seconds
    if lead is not None and shape.time_seconds is not None and lead >= shape.time_seconds:
        errors.append(
            f"slurm.signal_lead_seconds={lead:g} is not shorter than the wall time "
            f"({shape.time_seconds:g} s): "
            "the stop signal would come at the start"
        )
    timings = earlier_timings(run_dir, cfg.checkpoint.every) if run_dir is not None else None
    step = timings.step_seconds if timings else 0.0
    save = timings.save_seconds if timings else DEFAULT_SAVE_SECONDS
    need = step + save + SIGNAL_MARGIN_SECONDS
    if lead is not None and lead < need:
        source = timings.source if timings else "no earlier hop: default save estimate"
        errors.append(
            f"slurm.signal_lead_seconds={lead:g} is too short: one step ({step:.1f} s) + one checkpoint save "
            f"({save:.1f} s) + {SIGNAL_MARGIN_SECONDS:g} s margin need {math.ceil(need)} s ({source})"
        )
    if slurm.resubmit == "requeue" and not shape.requeue:
        errors.append(
            "slurm.resubmit=requeue needs a requeueable job: add `#SBATCH --requeue` (or sbatch --requeue)"
        )
    errors += _check_tasks(shape)
    return errors


def _check_tasks(shape: JobShape) -> list[str]:
    errors = []
    if shape.launcher == "srun" and shape.gpus_per_node and shape.tasks_per_node != shape.gpus_per_node:
        errors.append(
            f"{shape.tasks_per_node} tasks per node with {shape.gpus_per_node} GPUs per node: "
            "launcher=srun runs "
            "one task per GPU (set slurm.tasks_per_node to the GPU count, or launcher=torchrun)"
        )
    if shape.launcher == "torchrun" and shape.tasks_per_node != 1:
        errors.append(
            f"launcher=torchrun with {shape.tasks_per_node} tasks per node would start tasks x GPUs "
            "processes "
            "per node: use --ntasks-per-node=1 with torchrun"
        )
    return errors


# --------------------------------------------------------------------------------------------- rendering
def sbatch_options(slurm: SlurmConfig, job_name: str, array: bool = False) -> list[str]:
    """The #SBATCH options of a job described by the slurm section, in a stable order. `array`: a job array's
    (its log per task: %A the array's job id, %a the task's index; the --array range is sbatch's argument)."""
    minutes = math.ceil(parse_duration(slurm.time) / 60)
    opts = [f"--job-name={job_name}"]
    for flag, value in (
        ("partition", slurm.partition),
        ("account", slurm.account),
        ("qos", slurm.qos),
        ("constraint", slurm.constraint),
    ):
        if value:
            opts.append(f"--{flag}={value}")
    opts += [f"--nodes={slurm.nodes}", f"--ntasks-per-node={tasks_per_node(slurm)}"]
    if slurm.gpus_per_node:
        opts.append(f"--gres=gpu:{slurm.gpus_per_node}")
    cpus = slurm.cpus_per_task * (max(slurm.gpus_per_node, 1) if slurm.launcher == "torchrun" else 1)
    opts.append(f"--cpus-per-task={cpus}")
    if slurm.mem:
        opts.append(f"--mem={slurm.mem}")
    opts += [
        f"--time={_hms(minutes * 60)}",
        f"--signal=B:USR1@{slurm.signal_lead_seconds}",
        "--requeue" if slurm.resubmit == "requeue" else "--no-requeue",
        "--open-mode=append",
        f"--output={LOG_DIR}/%x-%A_%a.out" if array else f"--output={LOG_DIR}/%x-%j.out",
    ]
    return opts + list(slurm.extra_args)


def _hms(seconds: float) -> str:
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


TEMPLATE_BODY = """\
# {summary}
# Submit from the project folder (logs go to {log_dir}/, which must exist: mkdir -p {log_dir}):
#   sbatch {path} [--config FILE] [--preset NAME] [key=value ...] [--export=LR=2e-5,...]
#   sbatch --export=ALL,LR=2e-5 {path}
# Everything after the script name goes to `hpctrain train`; see docs/slurm.md.{preset_note}
# sbatch runs a copy of this file from its spool folder: the project is found from SLURM_SUBMIT_DIR.
HPCTRAIN_HOME="${{HPCTRAIN_HOME:-${{SLURM_SUBMIT_DIR:-$PWD}}}}"{preset_line}
source "$HPCTRAIN_HOME/slurm/common.sh" || exit 2
hpctrain_job "$@"
"""
PRESET_NOTE = """
# Without --preset the job takes --preset {preset} (--preset none: the YAML alone), and so its own run folder:
# logs/<config stem>-{preset}, or logs/{preset} without --config (never the CPU debug job's logs/debug)."""


def render_script(
    slurm: SlurmConfig, job_name: str, summary: str, path: str, preset: str | None = None
) -> str:
    """A complete sbatch script: #SBATCH lines from the slurm section, then slurm/common.sh's body; `preset`
    is the one the job takes when the arguments name none."""
    header = "\n".join(f"#SBATCH {opt}" for opt in sbatch_options(slurm, job_name))
    body = TEMPLATE_BODY.format(
        summary=summary,
        log_dir=LOG_DIR,
        path=path,
        preset_note=PRESET_NOTE.format(preset=preset) if preset else "",
        preset_line=f"\nhpctrain_default_preset={preset}" if preset else "",
    )
    return f"#!/bin/bash\n{header}\n{body}"


# The checked-in templates are renderings of these settings (a test keeps them equal).
TEMPLATES: dict[str, tuple[dict[str, Any], str]] = {
    "single_gpu": (
        {"nodes": 1, "gpus_per_node": 1, "cpus_per_task": 8, "time": "04:00:00"},
        "One GPU: one task.",
    ),
    "multi_gpu": (
        {"nodes": 1, "gpus_per_node": 4, "cpus_per_task": 4, "time": "04:00:00"},
        "One node, 4 GPUs: one DDP task per GPU (launcher=torchrun: one torchrun per node).",
    ),
    "multi_node": (
        {"nodes": 2, "gpus_per_node": 4, "cpus_per_task": 4, "time": "08:00:00"},
        "2 nodes x 4 GPUs: one DDP task per GPU (launcher=torchrun: one torchrun per node, c10d rendezvous).",
    ),
}


def render_template(name: str) -> str:
    settings, summary = TEMPLATES[name]
    return render_script(
        SlurmConfig(**settings),
        f"hpctrain-{name.replace('_', '-')}",
        summary,
        f"slurm/{name}.sh",
        preset=name,
    )


SWEEP_BODY = """\
# One job array for a sweep: array task k trains element k of the plan `hpctrain submit --sweep` wrote (its own
# run folder, named from the element's values) and chains on its own: a requeued task keeps its index.
# `hpctrain submit --sweep KEY=V1,V2 ...` queues a copy of this with the config's slurm settings; by hand, e.g.
# elements 3 and 5 of a plan again:
#   sbatch --array=3,5 {path} --sweep-plan {plan}
# sbatch runs a copy of this file from its spool folder: the project is found from SLURM_SUBMIT_DIR.
HPCTRAIN_HOME="${{HPCTRAIN_HOME:-${{SLURM_SUBMIT_DIR:-$PWD}}}}"
source "$HPCTRAIN_HOME/slurm/common.sh" || exit 2
hpctrain_job "$@"
"""
# The checked-in slurm/sweep.sh: one GPU per element (a test keeps it equal to the rendering).
SWEEP_TEMPLATE = {"nodes": 1, "gpus_per_node": 1, "cpus_per_task": 8, "time": "04:00:00"}


def render_sweep_script(
    slurm: SlurmConfig,
    job_name: str,
    path: str = "slurm/sweep.sh",
    plan: str = "logs/slurm/sweeps/<sweep>/plan.json",
) -> str:
    """The job-array script of a sweep: #SBATCH lines from the slurm section, then slurm/common.sh's body,
    which turns `--sweep-plan PLAN` into the arguments of element SLURM_ARRAY_TASK_ID."""
    header = "\n".join(f"#SBATCH {opt}" for opt in sbatch_options(slurm, job_name, array=True))
    return f"#!/bin/bash\n{header}\n{SWEEP_BODY.format(path=path, plan=plan)}"


def render_sweep_template() -> str:
    return render_sweep_script(SlurmConfig(**SWEEP_TEMPLATE), "hpctrain-sweep")


def array_range(count: int, max_parallel: int | None) -> str:
    """sbatch's --array value: tasks 0..count-1, at most `max_parallel` running at once."""
    cap = f"%{max_parallel}" if max_parallel is not None and max_parallel < count else ""
    return f"0-{count - 1}{cap}"


def ensure_log_dir(root: Path | str = ".") -> Path:
    """sbatch opens --output before the script runs: the folder must exist at submission."""
    path = Path(root) / LOG_DIR
    make_folders(path)  # 0750 at most: the group may read the jobs' logs
    return path


def signal_lead_from_script(text: str) -> float | None:
    """The lead of the script's own `#SBATCH --signal=[B:]SIG@N` line (sbatch shows it nowhere else)."""
    match = re.search(r"^#SBATCH\s+--signal=(?:[A-Z]+:)?\w+@(\d+)", text, re.M)
    return float(match.group(1)) if match else None


def in_batch_shell(environ: Mapping[str, str] | None = None) -> bool:
    environ = os.environ if environ is None else environ
    return bool(environ.get("SLURM_JOB_ID")) and not (
        environ.get("SLURM_STEP_ID") or environ.get("SLURM_STEPID")
    )
