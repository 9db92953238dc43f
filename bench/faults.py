"""Nothing lost: SIGKILL training runs at many precise points, resume them, compare with an uninterrupted run.

    python bench/faults.py [--kills 38] [--seed 0] [--jobs regression,muons] [--quick] [--edges] [--workdir DIR]
    python bench/faults.py --kills 0 --jobs regression --edges   # only the edge faults (fault_edges.py)
    python bench/faults.py --kills 0 --jobs "" --verbs   # only damaged inputs and late faults of every verb
    python bench/faults.py --verify RUN_DIR --reference REF_DIR --job regression   # check one run folder

Two jobs, each made tiny (single CPU thread, a few dozen updates, a checkpoint every 4-5 updates): the default
regression job (`hpctrain train`, dropout on so the RNG state matters) and the muon WGAN (`--config
configs/muons_wgan.yaml` on a few hundred generated events, 2 DataLoader workers). For each job an uninterrupted
reference run comes first. Then runs of the same command are killed with SIGKILL, several times each, and the
same command is run again after each kill until it finishes. Kill points:
- inside the commit protocol, exactly (bench/helpers/fault_child.py arms the Nth matching `torch.save`,
  `os.fsync`, `os.replace` or `os.unlink` of the child: serializing, a torn `.pt` temporary, before its fsync,
  before/after its rename, the folder fsync, the sidecar, before/after the `latest` move, `best.pt`, pruning;
  and start-up's config.yaml / metrics.jsonl rewrites, and the final summary.json);
- from outside after a random delay (start-up), or a random delay after the child logged a chosen update
  (during updates) or an update after which an evaluation runs (during evaluation); where such a kill landed is
  read back from the run folder.
The whole process group dies (DataLoader workers too) and is checked gone before the next start. Each finished
run is checked: its final `params_sha256=` (last stdout line) equals the reference's, metrics.jsonl holds every
logged update and evaluation exactly once, and each update's loss equals the reference's (bit-exact resume);
also whether summary.json, chain.json and `best.pt` (same networks as the reference's) came out right.
The LAST line printed is one JSON object: kills, kills_by_point, resumed_ok, params_equal, all_params_equal,
steps_repeated_or_lost (goals: all resumed, all equal, 0 lost), and what did not go as promised (`failures`,
`anomalies`); with `--edges`, `edges`: the edge faults (signals in the first and last second, a full disk at
start-up and in a save, a damaged chain.json, a folder of another owner), each met cleanly and then resumed to
params equal to the reference's (`all_clean`, `all_params_equal`, `deaths_by_signal`: goal 0); with `--verbs`,
`verbs`: damaged small files, odd names, masked secrets, a reused lock pid, overflowing counts, a failing mirror,
a restart of a finished run and late signals, met by every verb (status, report, export, sweep, supervise, tb
merge, sync, the mirror, data, train: fault_verbs.py), each cleanly (`all_clean`, `tracebacks` and
`deaths_by_signal`: goal 0), and `handler_latency` (exec to `hpctrain train`'s stop handlers).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CHILD = REPO / "bench" / "helpers" / "fault_child.py"
sys.path.insert(0, str(CHILD.parent))
from fault_check import (  # noqa: E402
    HASH_LINE,
    Job,
    Reference,
    checkpoint_digest,
    latest_step,
    read_metrics,
    reference_from_dir,
    verify,
)
from fault_child import POINTS  # noqa: E402 (the child's own table: both sides agree on the names)
from fault_edges import run_edges  # noqa: E402
from fault_procs import Watch, child_env, kill_group  # noqa: E402
from fault_verbs import run_verbs  # noqa: E402

TIME_POINTS = ("time:startup", "time:update", "time:eval")
# One cycle of kill points per job: every exact point once, kills from outside a little more often.
CYCLE = [*POINTS, "time:startup", "time:update", "time:update", "time:eval", "time:eval"]
QUICK = {
    "regression": ["time:startup", "save:torn_write", "time:update", "save:sidecar", "save:latest"],
    "muons": ["time:eval", "save:rename", "start:metrics_truncate"],
}
ONCE = ("start:config", "start:metrics_truncate", "exit:summary")  # once per process: always the 1st call
HOP_TIMEOUT = 300.0


def make_jobs(data: Path) -> dict[str, Job]:
    common = ["logging.log_every=1", "train.threads=1", "checkpoint.keep_last=2"]
    regression = [
        "train",
        "run.name=regression",
        "train.total_updates=60",
        "checkpoint.every=5",
        "train.eval_every=20",
        "data.n_train=512",  # 16 batches an epoch: kills land mid-epoch and across epochs
        "data.n_val=2048",
        "model.dropout=0.1",  # draws from the torch RNG every update: its state must survive
        *common,
    ]
    muons = [
        "train",
        "--config",
        str(REPO / "configs" / "muons_wgan.yaml"),
        "run.name=muons",
        f"data.paths=[{data / 'train'}]",
        f"data.val_paths=[{data / 'val'}]",
        "data.num_workers=2",
        "data.batch_size=8",
        "data.max_muons_per_event=100",
        "data.shuffle_window=32",
        "model.latent_global=4",
        "model.latent_local=2",
        "model.hidden=8",
        "model.critic_hidden=8",
        "model.multiplicity.hidden=[8]",
        "model.critic_steps=1",
        "model.gp_max_pairs=20",
        "train.total_updates=40",
        "train.eval_every=10",
        "train.eval_batches=1",
        "checkpoint.every=4",
        *common,
    ]
    return {
        "regression": Job("regression", regression, total=60, log_every=1, eval_every=20),
        "muons": Job("muons", muons, total=40, log_every=1, eval_every=10),
    }


def make_muon_data(root: Path) -> None:
    for sub, files, events, seed in (("train", 2, 200, 1), ("val", 1, 60, 2)):
        subprocess.run(
            [
                *(sys.executable, "-m", "hpctrain", "data", "generate", "--kind", "muons"),
                *("--out", str(root / sub), "--files", str(files), "--events-per-file", str(events)),
                *("--row-group-size", "50", "--seed", str(seed)),
            ],
            env=child_env(REPO / "src"),
            check=True,
            capture_output=True,
            timeout=120,
        )


# ---- one process ------------------------------------------------------------------------------------------


@dataclass
class Hop:
    """One process of a run: started, then killed (or not) at a point."""

    point: str | None  # planned kill point (None: run to the end)
    landed: str | None = None  # where the kill landed; None: not killed
    code: int = 0
    seconds: float = 0.0
    detail: str = ""
    first_record: float | None = None  # seconds from start to the first update logged
    last_line: str = ""
    stderr_tail: str = ""
    latest_after: int | None = None  # the update `latest` named when it was over
    command: list[str] = field(default_factory=list)


@dataclass
class Trigger:
    """A kill from outside: `at` seconds after the start (or as soon as an update is logged, if sooner), or
    `delay` seconds after update `after` is logged."""

    at: float | None = None
    after: int = 0
    delay: float = 0.0


class Campaign:
    def __init__(self, work: Path, rng: random.Random) -> None:
        self.work, self.rng = work, rng
        self.refs: dict[str, Reference] = {}
        self.processes = 0

    def run_hop(self, job: Job, out: Path, point: str | None, extra: list[str] | None = None) -> Hop:
        run_dir = out / job.name
        log = out / f"hop{self.processes:03d}"
        self.processes += 1
        resumed = latest_step(run_dir) or 0
        marker = log.with_suffix(".marker")
        armed = (
            ["--point", point, "--nth", str(self.pick_nth(job, point, resumed))] if point in POINTS else []
        )
        cmd = [sys.executable, str(CHILD), *armed, *(extra or []), "--marker", str(marker), "--"]
        hop = Hop(point, command=[*cmd, *job.args, f"run.out_dir={out}"])
        watch = Watch(run_dir / "metrics.jsonl")
        trigger = self.trigger(job, point, resumed)
        start = time.monotonic()
        with open(log.with_suffix(".out"), "wb") as out_f, open(log.with_suffix(".err"), "wb") as err_f:
            proc = subprocess.Popen(
                hop.command,
                cwd=self.work,
                env=child_env(REPO / "src"),
                stdout=out_f,
                stderr=err_f,
                start_new_session=True,
            )
            killed_at = watch_child(proc, watch, resumed, trigger, start, hop)
            kill_group(proc)  # also after a normal exit or a self-kill: no worker may outlive its trainer
        hop.seconds, hop.code = time.monotonic() - start, proc.returncode
        lines = log.with_suffix(".out").read_text(errors="replace").strip().splitlines()
        hop.last_line = lines[-1] if lines else ""
        hop.stderr_tail = "\n".join(log.with_suffix(".err").read_text(errors="replace").splitlines()[-5:])
        if killed_at is not None:
            hop.landed, hop.detail = (
                where_killed(job, run_dir, watch, resumed),
                f"{killed_at:.2f} s after start",
            )
        elif hop.code == -signal.SIGKILL and marker.exists():
            hit = json.loads(marker.read_text())
            hop.landed, hop.detail = hit["point"], f"call {hit['nth']} on {hit['target']}"
        hop.latest_after = latest_step(run_dir)
        return hop

    def remaining(self, job: Job, point: str, resumed: int) -> float:
        """How often an exact point still comes in a run resumed at update `resumed` (from the reference)."""
        return self.refs[job.name].counts.get(point, 0) * (job.total - resumed) / job.total

    def pick_nth(self, job: Job, point: str | None, resumed: int) -> int:
        if point is None or point in ONCE:
            return 1
        return self.rng.randint(1, max(1, math.floor(self.remaining(job, point, resumed))))

    def feasible(self, job: Job, point: str, run_dir: Path) -> bool:
        resumed = latest_step(run_dir)
        done = resumed or 0
        if point == "start:metrics_truncate":
            return resumed is not None  # only a resumed run rewrites its metrics file
        if point in ONCE or point == "time:startup":
            return True
        if point == "time:update":
            return done + 1 <= job.total - 1
        if point == "time:eval":
            return any(e > done for e in job.eval_steps)
        return self.remaining(job, point, done) >= 1

    def trigger(self, job: Job, point: str | None, resumed: int) -> Trigger | None:
        if point not in TIME_POINTS:
            return None
        ref = self.refs[job.name]
        if point == "time:startup":
            return Trigger(at=self.rng.uniform(0.2, max(0.3, 0.9 * ref.startup)))
        if point == "time:update":
            return Trigger(
                after=self.rng.randint(resumed + 1, job.total - 1), delay=self.rng.uniform(0, ref.step)
            )
        # An update after which an evaluation runs: kill within the evaluation's duration after it is logged.
        target = self.rng.choice(sorted(e for e in job.eval_steps if e > resumed))
        return Trigger(after=target, delay=self.rng.uniform(0, ref.eval))


def watch_child(
    proc: subprocess.Popen[bytes], watch: Watch, resumed: int, trigger: Trigger | None, start: float, hop: Hop
) -> float | None:
    """Wait for the child; kill it (whole group) when the trigger fires. Returns when it was killed."""
    fire_at = start + trigger.at if trigger and trigger.at is not None else None
    while proc.poll() is None:
        now = time.monotonic()
        if now - start > HOP_TIMEOUT:
            kill_group(proc)
            hop.detail = f"timeout: still running after {HOP_TIMEOUT:.0f} s"
            return None
        watch.refresh()
        last = watch.trained_beyond(resumed)
        if last is not None and hop.first_record is None:
            hop.first_record = now - start
        if trigger and last is not None:
            if trigger.at is not None:
                fire_at = now  # start-up is over sooner than in the reference: kill at once, not at the end
            elif fire_at is None and last >= trigger.after:
                fire_at = now + trigger.delay
        if fire_at is not None and now >= fire_at:
            kill_group(proc)
            return now - start
        time.sleep(0.002)
    return None


def where_killed(job: Job, run_dir: Path, watch: Watch, resumed: int) -> str:
    """Where a kill from outside landed, read back from what the child left behind."""
    watch.refresh()
    last = watch.trained_beyond(resumed)
    if last is None:
        return "time:startup"
    if last in job.eval_steps and last not in watch.evals:
        return "time:eval"
    if latest_step(run_dir) == job.total:
        return "time:exit"  # the final checkpoint was committed: summary.json and chain.json were next
    folder = run_dir / "checkpoints"
    if folder.is_dir() and any("tmp" in p.name for p in folder.iterdir()):
        return "time:save"
    return "time:update"


# ---- the campaign ------------------------------------------------------------------------------------------


def reference(c: Campaign, job: Job) -> Reference:
    """An uninterrupted run of the same command; it also counts how often each exact kill point occurs."""
    out = c.work / job.name / "reference"
    counts = out / "counts.json"
    out.mkdir(parents=True)
    hop = c.run_hop(job, out, None, ["--counts", str(counts)])
    if hop.code != 0:
        raise RuntimeError(f"the reference {job.name} run failed ({hop.code}): {hop.stderr_tail}")
    run_dir = out / job.name
    summary = json.loads((run_dir / "summary.json").read_text())
    records = read_metrics(run_dir / "metrics.jsonl")
    found = HASH_LINE.search(hop.last_line)
    if found is None or found.group(1) != summary["params_sha256"]:
        raise RuntimeError(f"the reference {job.name} run printed no (or another) hash: {hop.last_line!r}")
    return Reference(
        run_dir=run_dir,
        digest=found.group(1),
        counts=json.loads(counts.read_text()),
        startup=hop.first_record or 3.0,
        step=summary["seconds"]["step"] / job.total,
        eval=summary["seconds"]["eval"] / len(job.eval_steps),
        losses={r["step"]: r["loss"] for r in records if "loss" in r},
        best_digest=checkpoint_digest(run_dir / "checkpoints" / "best.pt"),
    )


def plan(jobs: list[str], kills: int, quick: bool, rng: random.Random) -> dict[str, list[list[str]]]:
    """Per job, the kill points of each run (a run is killed several times before it may finish)."""
    if quick:
        return {name: [list(QUICK[name])] for name in jobs}
    out: dict[str, list[list[str]]] = {}
    for i, name in enumerate(jobs):
        share = kills // len(jobs) + (i < kills % len(jobs))
        points: list[str] = []
        while len(points) < share:
            cycle = list(CYCLE)
            rng.shuffle(cycle)
            points += cycle
        points = points[:share]
        runs = []
        while points:
            size = rng.randint(3, 5)
            chunk, points = points[:size], points[size:]
            # The final summary is written once, at the very end: that kill goes last in its run.
            chunk.sort(key=lambda p: p == "exit:summary")
            runs.append(chunk)
        out[name] = runs
    return out


@dataclass
class RunOutcome:
    job: Job
    index: int
    hops: list[Hop]
    verdict: dict[str, Any] | None
    failure: dict[str, Any] | None
    leftover: list[str]

    @property
    def culprit(self) -> str:
        """The kill an anomaly of the finished run comes from: the first one after the final commit (the
        run was finished from then on), else the last one."""
        kills = [h for h in self.hops if h.landed]
        late = [h for h in kills if h.latest_after == self.job.total]
        return str((late or kills)[-1 if not late else 0].landed) if kills else "no kill"


def campaign_run(c: Campaign, job: Job, index: int, queue: list[str]) -> RunOutcome:
    out = c.work / job.name / f"run{index:02d}"
    out.mkdir(parents=True)
    run_dir = out / job.name
    hops: list[Hop] = []
    queue = list(queue)
    failure = None
    while True:
        point = next((p for p in queue if c.feasible(job, p, run_dir)), None)
        if point is not None:
            queue.remove(point)
        hop = c.run_hop(job, out, point)
        hops.append(hop)
        say(f"  {job.name} run {index} hop {len(hops) - 1}: {describe(hop)}")
        if hop.landed is not None:
            continue
        if hop.code != 0:
            failure = {
                "job": job.name,
                "run": index,
                "hop": len(hops) - 1,
                "after": hops[-2].landed if len(hops) > 1 else None,
                "code": hop.code,
                "detail": hop.detail,
                "command": " ".join(hop.command),
                "stderr": hop.stderr_tail,
            }
            break
        if point is not None:
            queue.insert(0, point)  # the run finished before that point came: try it on the next run
        break
    verdict = None if failure else verify(job, run_dir, hops[-1].last_line, c.refs[job.name])
    return RunOutcome(job, index, hops, verdict, failure, queue)


def describe(hop: Hop) -> str:
    if hop.landed:
        return f"killed at {hop.landed} ({hop.detail}), {hop.seconds:.1f} s"
    if hop.point:
        return f"exit {hop.code} before {hop.point} came, {hop.seconds:.1f} s: {hop.last_line[:100]}"
    return f"exit {hop.code}, {hop.seconds:.1f} s: {hop.last_line[:100]} {hop.detail}"


def say(text: str) -> None:
    print(text, flush=True)


def summarize(
    outcomes: list[RunOutcome], refs: dict[str, Reference], extra: dict[str, Any]
) -> dict[str, Any]:
    kills = [h for o in outcomes for h in o.hops if h.landed]
    resumed_ok = 0
    for o in outcomes:
        for before, after in zip(o.hops, o.hops[1:]):
            if before.landed and (after.landed or after.code == 0):
                resumed_ok += 1
    verdicts = [o.verdict for o in outcomes if o.verdict is not None]
    anomalies: Counter[str] = Counter()
    for o in outcomes:
        for text in (o.verdict or {}).get("anomalies", []):
            anomalies[text if text.startswith("temporary") else f"{text} (kill at {o.culprit})"] += 1
    return {
        "kills": len(kills),
        "kills_by_point": dict(sorted(Counter(h.landed for h in kills).items())),
        "runs": len(outcomes),
        "runs_finished": len(verdicts),
        "resumed_ok": resumed_ok,
        "all_resumed": resumed_ok == len(kills) and len(verdicts) == len(outcomes),
        "params_equal": sum(v["params_equal"] for v in verdicts),
        "all_params_equal": bool(outcomes) and sum(v["params_equal"] for v in verdicts) == len(outcomes),
        "steps_repeated_or_lost": sum(v["steps_repeated_or_lost"] for v in verdicts),
        "evals_repeated_or_lost": sum(v["evals_repeated_or_lost"] for v in verdicts),
        "loss_mismatches": sum(v["loss_mismatches"] for v in verdicts),
        "best_equal": sum(v["best_equal"] for v in verdicts),
        "not_reached": sum(1 for o in outcomes for h in o.hops if h.point and not h.landed),
        "failures": [o.failure for o in outcomes if o.failure],
        "anomalies": dict(anomalies),
        "reference_sha256": {name: ref.digest for name, ref in refs.items()},
        **extra,
    }


def campaign(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    start = time.monotonic()
    rng = random.Random(args.seed)
    names = [n for n in args.jobs.split(",") if n]
    if "muons" in names:
        make_muon_data(work / "data")
    jobs = make_jobs(work / "data")
    unknown = [n for n in names if n not in jobs]
    if unknown:
        raise SystemExit(f"error: --jobs: unknown job(s) {unknown} (choose from {', '.join(jobs)})")
    c = Campaign(work, rng)
    outcomes: list[RunOutcome] = []
    for name, runs in plan(names, args.kills, args.quick, rng).items():
        job = jobs[name]
        c.refs[name] = reference(c, job)
        say(f"{name}: reference params_sha256={c.refs[name].digest} counts={c.refs[name].counts}")
        leftover: list[str] = []
        for index, points in enumerate(runs):
            outcomes.append(campaign_run(c, job, index, leftover + points))
            leftover = outcomes[-1].leftover
        for index in range(len(runs), len(runs) + 2):  # points no run reached yet: at most two more runs
            if leftover:
                outcomes.append(campaign_run(c, job, index, leftover))
                leftover = outcomes[-1].leftover
    if args.edges:  # signals in the first and last second, a full disk, damaged chain.json, another owner
        if "regression" not in c.refs:
            c.refs["regression"] = reference(c, jobs["regression"])
        edges = run_edges(jobs["regression"], c.refs["regression"], work / "edges", REPO / "src", rng, say)
    if args.verbs:  # damaged inputs and late faults for every verb that reads or copies runs
        verbs = run_verbs(work / "verbs", REPO / "src", say)
    extra = {
        **({"edges": edges} if args.edges else {}),
        **({"verbs": verbs} if args.verbs else {}),
        "processes": c.processes,
        "seconds": round(time.monotonic() - start, 1),
        "seed": args.seed,
        "quick": args.quick,
        "jobs": names,
        "commands": {n: ["python", "-m", "hpctrain", *jobs[n].args] for n in names},
    }
    if args.workdir:
        extra["reference_dirs"] = {n: str(ref.run_dir) for n, ref in c.refs.items()}
        extra["run_dirs"] = [str(work / o.job.name / f"run{o.index:02d}" / o.job.name) for o in outcomes]
        details = [
            {"job": o.job.name, "run": o.index, "verdict": o.verdict, "hops": [vars(h) for h in o.hops]}
            for o in outcomes
        ]
        (work / "faults.json").write_text(json.dumps(details, indent=1, default=str) + "\n")
    return summarize(outcomes, c.refs, extra)


def verify_only(args: argparse.Namespace) -> dict[str, Any]:
    """Check one run folder against a finished reference folder (hashes from their summary.json)."""
    job = make_jobs(Path("data"))[args.job]
    return verify(job, Path(args.verify), None, reference_from_dir(Path(args.reference)))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kills", type=int, default=38, help="kills over all jobs (default 38: 2 cycles)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill plan, delays and Nth calls")
    parser.add_argument("--jobs", default="regression,muons", help="comma-separated: regression,muons")
    parser.add_argument("--quick", action="store_true", help="8 fixed kill points (for the test)")
    parser.add_argument(
        "--edges", action="store_true", help="also the edge faults (bench/helpers/fault_edges.py)"
    )
    parser.add_argument(
        "--verbs",
        action="store_true",
        help="also damaged inputs and late faults for every verb (bench/helpers/fault_verbs.py)",
    )
    parser.add_argument("--workdir", help="keep run folders here (default: a temporary folder, removed)")
    parser.add_argument("--verify", help="only check this run folder (with --reference and --job)")
    parser.add_argument("--reference", help="reference run folder for --verify")
    parser.add_argument("--job", default="regression", help="job of the run folder for --verify")
    args = parser.parse_args()
    if args.verify:
        print(json.dumps(verify_only(args)))
        return 0
    if args.workdir:
        work = Path(args.workdir).resolve()
        work.mkdir(parents=True, exist_ok=True)
        result = campaign(args, work)
    else:
        work = Path(tempfile.mkdtemp(prefix="hpctrain-faults-"))
        try:
            result = campaign(args, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
