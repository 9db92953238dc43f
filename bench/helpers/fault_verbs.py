"""Damaged inputs and late faults for every verb, for bench/faults.py `--verbs`: not the training's kills but what
a run folder, a shared disk or a scheduler does to the verbs that read and copy runs (status, report, export,
sweep, supervise, tb merge, sync, the checkpoint mirror, data inspect, train itself).

One real finished regression run (a checkpoint every 5 updates, TensorBoard on) is made first; each case copies
it, damages one small file (or sets up one fault) and runs the real command line (`python -m hpctrain ...`).
A case is met cleanly when the command exits with an expected code, prints no traceback, and an exit other than
0 says one `error:` line. The families:

- damaged:<file>:<how>  a small file of the run (metrics.jsonl, chain.json, summary.json, config.yaml, run.lock,
                        wandb.json, wandb_sync.json, checkpoints/latest, a checkpoint's sidecar, evaluate.json)
                        holding JSON that is no record ([1, 2], NaN, 1e300, nesting 100,000 deep, an alias bomb,
                        values of the wrong kind, a `dir` of `/`), read by each verb that reads it;
- names:<how>           a config file named `my run.yaml`, `...yaml`, 246 characters: `config show`, a sweep;
- secrets:masked        a saved config.yaml (secrets as '**********') given back with --config;
- lock:reused           a stale run.lock naming a pid that now runs another process: status says finished;
- counts:overflow       an HDF5 muon file whose int64 counts sum to the muons only modulo 2**64: data inspect;
- mirror:fails          checkpoint.mirror_to under a file: the finished run exits 1 saying so, summary.json
                        names it; fixed, the same command copies and exits 0;
- restart:finished      a new run restoring everything from another run's final checkpoint: one line, exit 2;
- late:<verb>           USR1 and TERM during the interpreter's finalization (tests/faulthook), for train,
                        train --until-done and supervise: exit 0, never 138/143;
- tb:<how>, supervise:<how>, export:<how>: the new verbs on damaged trees and files.

Also measured: how long after exec `hpctrain train`'s stop handlers are in place (`handlers_after_s`: process
start from /proc to the handlers' install, the window a signal to an unblocked process would kill it).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fault_procs import child_env

REPO = Path(__file__).resolve().parents[2]
FAULT_HOOK = REPO / "tests" / "faulthook"
NOT_RECORDS = {
    "list": "[1, 2]\n",
    "nan": "NaN\n",
    "huge": "1e300\n",
    "text": '"x"\n',
    "empty": "",
    "garbage": "{{ not json",
    "deep": "[" * 100_000,
}
BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdef", "bcdefg")
)
SPECIFIC = {
    "chain.json": {
        "hop_nan": '[{"start": NaN, "end": 1e300}]',
        "hop_huge": '[{"start": 1.0, "last_update": 1e300}, {"start": 2.0, "first_update": [1]}]',
    },
    "summary.json": {"kinds": '{"status": ["x"], "step": NaN, "total_updates": 1e300, "hops": "3"}'},
    "metrics.jsonl": {"mixed": '[1, 2]\n{"step": "x"}\n{"step": 5, "time": NaN, "loss": 1e300}\n42\n'},
    "config.yaml": {"bomb": BOMB, "kinds": "train: [1]\ncheckpoint: 5\nslurm: x\nmodel: [1]\n"},
    "run.lock": {
        "numbers": json.dumps(
            {"pid": 10**30, "host": socket.gethostname(), "started": 1e300, "heartbeat": 1e300}
        )
    },
    "wandb.json": {
        "slash": json.dumps({"hops": [{"dir": "/", "run_id": "abc"}]}),
        "kinds": '{"hops": [1, {"dir": 5}, {"run_id": []}]}',
        "hops_number": '{"hops": 5}',
    },
    "wandb_sync.json": {"synced_list": '{"synced": []}'},
    "checkpoints/latest": {"outside": "../../../etc/passwd\n"},
    "checkpoints/step_00000010.json": {"kinds": '{"sha256": 5, "seq": NaN, "step": 1e300}'},
    "evaluate.json": {"kinds": '{"metrics": [1], "distributions": {"x": 5}, "info": "y"}'},
}
# file -> the verbs that read it (each a function of the case's run folder and work folder)
READERS = {
    "summary.json": ("status", "table", "report", "compare", "supervise", "sync_watch"),
    "chain.json": ("status", "table", "report", "compare", "supervise"),
    "metrics.jsonl": ("status", "table", "report", "compare", "train"),
    "config.yaml": ("status", "table", "compare"),
    "run.lock": ("status", "table"),
    "wandb.json": ("sync",),
    "wandb_sync.json": ("sync",),
    "checkpoints/latest": ("status", "export"),
    "checkpoints/step_00000010.json": ("status", "export"),
    "evaluate.json": ("report",),
}
OK_CODES = {  # what a verb may exit with on a damaged file: it goes without it, or refuses in one line
    "status": (0,),
    "table": (0,),
    "report": (0, 2),
    "compare": (0, 2),
    "sync": (0,),
    "sync_watch": (0,),
    "supervise": (0, 1, 2),
    "export": (0, 2),
    "train": (0,),
}


@dataclass
class Case:
    family: str
    verb: str
    code: int
    clean: bool
    said: str
    seconds: float
    traceback: bool = False


@dataclass
class Bench:
    work: Path
    src: Path
    say: Any
    base: Path = field(init=False)
    cases: list[Case] = field(default_factory=list)

    def run(
        self, args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 300
    ) -> tuple:
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "hpctrain", *args],
            cwd=cwd,
            env={**child_env(self.src), **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return done.returncode, done.stdout, done.stderr, time.monotonic() - started

    def record(self, family: str, verb: str, result: tuple, codes: tuple[int, ...]) -> Case:
        code, _out, err, seconds = result
        errors = [line for line in err.splitlines() if line.startswith("error: ")]
        # a supervisor passes on its child's exit code, and says why in its own last line
        said_why = code == 0 or len(errors) == 1 or (verb == "supervise" and not errors)
        clean = code in codes and "Traceback" not in err and said_why
        said = errors[0][:160] if errors else ""
        case = Case(family, verb, code, clean, said, round(seconds, 2), "Traceback" in err)
        self.cases.append(case)
        if not clean:
            self.say(f"  NOT CLEAN {family} {verb}: exit {code}; {err.strip()[-400:]}")
        return case


def train_args(out: Path, name: str, *extra: str) -> list[str]:
    return ["train", f"run.out_dir={out}", f"run.name={name}", "train.total_updates=10", "checkpoint.every=5",
            "train.threads=1", "data.n_train=256", "data.n_val=64", *extra]  # fmt: skip


def verb_args(verb: str, run: Path, case: Path, base: Path) -> tuple[list[str], dict[str, str]]:
    if verb == "status":
        return ["status", str(run)], {}
    if verb == "table":
        return ["status", str(run.parent)], {}
    if verb == "report":
        return ["report", str(run), "--out", str(case / "report")], {}
    if verb == "compare":
        return ["report", "--compare", str(run), str(base), "--out", str(case / "compare")], {}
    if verb == "sync":
        return ["sync", str(run), "--dry-run"], {}
    if verb == "sync_watch":
        return ["sync", str(run), "--watch", "1", "--dry-run"], {}
    if verb == "supervise":
        return ["supervise", "--run-dir", str(run), "--max-idle", "1", "--", sys.executable, "-c",
                "raise SystemExit(1)"], {}  # fmt: skip
    if verb == "export":
        return ["export", str(run), "--out", str(case / "export")], {}
    if verb == "train":  # the same command again: a resume reads metrics.jsonl back
        return train_args(run.parent, run.name, "train.total_updates=15"), {}
    raise ValueError(verb)


def damaged(b: Bench) -> None:
    for name, readers in READERS.items():
        kinds = {**NOT_RECORDS, **SPECIFIC.get(name, {})}
        for kind, text in kinds.items():
            for verb in readers:
                if verb not in ("status", "sync") and kind in ("text", "empty", "garbage"):
                    continue  # the slower verbs: the kinds that say most
                case = b.work / "damaged" / f"{name.replace('/', '_')}-{kind}-{verb}"
                run = case / "runs" / "r"
                shutil.copytree(b.base, run, symlinks=True)
                (run / name).write_text(text)
                if verb == "train":
                    (run / "checkpoints" / "latest").write_text("step_00000005.pt\n")  # resume mid-run
                args, env = verb_args(verb, run, case, b.base)
                b.record(f"damaged:{name}:{kind}", verb, b.run(args, case, env, timeout=120), OK_CODES[verb])


def names(b: Bench) -> None:
    folder = b.work / "names"
    folder.mkdir()
    config = (REPO / "configs" / "debug.yaml").read_text()
    for how, file_name in (("space", "my run.yaml"), ("dots", "...yaml"), ("long", "a" * 246 + ".yaml")):
        path = folder / file_name
        path.write_text(config)
        b.record(f"names:{how}", "config", b.run(["config", "show", "--config", str(path)], folder), (0,))
        sweep = ["submit", "--config", str(path), "--sweep", "optim.lr=1e-3,2e-3", "--dry-run",
                 f"run.out_dir={folder / 'runs'}"]  # fmt: skip
        b.record(f"names:{how}", "sweep", b.run(sweep, folder), (0,))
    bad_sweep = folder / "sweep.yaml"
    for how, text in (("bomb", BOMB), ("list", "[1, 2]"), ("nan", "optim.lr: [.nan, 1e300]")):
        bad_sweep.write_text(text)
        args = ["submit", "--sweep-file", str(bad_sweep), "--dry-run", f"run.out_dir={folder / 'runs'}"]
        b.record(f"sweep-file:{how}", "sweep", b.run(args, folder), (0, 2))


def secrets_and_lock(b: Bench) -> None:
    folder = b.work / "secrets"
    folder.mkdir()
    saved = folder / "saved.yaml"
    saved.write_text((b.base / "config.yaml").read_text() + "")
    text = (
        saved.read_text()
        .replace("api_key: null", "api_key: '**********'")
        .replace("token: null", "token: '**********'")
    )
    saved.write_text(text)
    result = b.run(["config", "show", "--config", str(saved)], folder)
    case = b.record("secrets:masked", "config", result, (0,))
    case.clean = case.clean and "masked value" in result[2]

    run = b.work / "lock" / "runs" / "r"
    shutil.copytree(b.base, run, symlinks=True)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        taken = time.time() - 60
        record = {"pid": stranger.pid, "host": socket.gethostname(), "job_id": None, "started": taken,
                  "heartbeat": taken}  # fmt: skip
        (run / "run.lock").write_text(json.dumps(record))
        result = b.run(["status", str(run)], run.parent)
        case = b.record("lock:reused", "status", result, (0,))
        case.clean = case.clean and "finished" in result[1].splitlines()[0]
    finally:
        stranger.kill()
        stranger.wait()


def counts(b: Bench) -> None:
    import h5py
    import numpy as np

    folder = b.work / "counts"
    folder.mkdir()
    path = folder / "overflow.h5"
    with h5py.File(path, "w") as fh:
        fh["primaries"] = np.ones((5, 7), np.float32)
        fh["muons"] = np.ones((5, 6), np.float32)
        fh["counts"] = np.array([2**62, 2**62, 2**62, 2**62, 5], np.int64)
    result = b.run(["data", "inspect", str(path), "--kind", "muons"], folder)
    b.record("counts:overflow", "data", result, (2,))


def mirror_and_restart(b: Bench) -> None:
    folder = b.work / "mirror"
    folder.mkdir()
    blocker = folder / "blocker"
    blocker.write_text("a file where the mirror's folder should be")
    args = train_args(folder, "m", f"checkpoint.mirror_to={blocker / 'copy'}")
    result = b.run(args, folder)
    case = b.record("mirror:fails", "train", result, (1,))
    summary = json.loads((folder / "m" / "summary.json").read_text())
    case.clean = case.clean and bool(summary.get("copy_failures")) and "checkpoints uploaded" not in result[2]
    status = b.run(["status", str(folder / "m")], folder)
    case = b.record("mirror:fails", "status", status, (0,))
    case.clean = case.clean and "NOT copied" in status[1]
    blocker.unlink()
    result = b.run(args, folder)
    case = b.record("mirror:fixed", "train", result, (0,))
    case.clean = case.clean and (blocker / "copy" / "checkpoints" / "step_00000010.pt").is_file()

    other = b.work / "restart"
    result = b.run(train_args(other, "b", f"checkpoint.resume={b.base}"), b.work)
    case = b.record("restart:finished", "train", result, (2,))
    case.clean = case.clean and "killed" not in result[2] and not (other / "b" / "summary.json").exists()


def late_signals(b: Bench) -> None:
    env = {"_HPCTRAIN_TEST_LATE_SIGNALS": "1", "PYTHONPATH": f"{FAULT_HOOK}{os.pathsep}{b.src}"}
    folder = b.work / "late"
    folder.mkdir()
    for verb, args in (
        ("train", train_args(folder, "t")),
        ("train --until-done", ["train", "--until-done", *train_args(folder, "u")[1:]]),
        ("supervise", ["supervise", "--run-dir", str(folder / "t"), "--", sys.executable, "-c", "pass"]),
    ):
        b.record("late:signals", verb, b.run(args, folder, env), (0,))


def new_verbs(b: Bench) -> None:
    """tb merge, export and supervise on damaged trees and files of their own."""
    folder = b.work / "tb"
    src = folder / "src"
    shutil.copytree(b.base, src / "runs" / "r", symlinks=True)
    garbage = src / "runs" / "junk" / "tb"
    garbage.mkdir(parents=True)
    (garbage / "events.out.tfevents.1.host").write_bytes(b"\x00" * 100)
    odd = src / "runs" / "odd name ünï" / "tb"
    odd.mkdir(parents=True)
    shutil.copy(next((b.base / "tb").rglob("events.out.tfevents.*")), odd)
    for how, args in (
        ("garbage", ["tb", "merge", "--out", str(folder / "merged"), "--src-root", str(src)]),
        ("copy", ["tb", "merge", "--out", str(folder / "copied"), "--src-root", str(src), "--mode", "copy"]),
        (
            "since",
            ["tb", "merge", "--out", str(folder / "m2"), "--src-root", str(src), "--since", "nonsense"],
        ),
        ("match", ["tb", "merge", "--out", str(folder / "m3"), "--src-root", str(src), "--match", "(("]),
        ("out_file", ["tb", "merge", "--out", str(b.base / "summary.json"), "--src-root", str(src)]),
    ):
        b.record(f"tb:{how}", "tb merge", b.run(args, folder), (0, 2))
    export = b.work / "export"
    export.mkdir()
    (export / "out").mkdir()
    (export / "out" / "export.json").write_text("[1, 2]")
    args = ["export", str(b.base), "--out", str(export / "out")]
    b.record("export:damaged_export_json", "export", b.run(args, export), (0, 2))
    for which in ("best", "step_5", "step_99", "../x"):
        args = ["export", str(b.base), "--which", which, "--out", str(export / f"w{len(b.cases)}")]
        b.record(f"export:which={which}", "export", b.run(args, export), (0, 2))
    sup = b.work / "supervise"
    sup.mkdir()
    args = ["supervise", "--run-dir", str(sup / "none"), "--", "no-such-program-xyz"]
    b.record("supervise:no_program", "supervise", b.run(args, sup), (2,))


def handler_latency(src: Path, runs: int = 10) -> dict[str, Any]:
    """Seconds from a process's start (/proc, to 10 ms) to `hpctrain train`'s stop handlers being in place, as
    `python -m hpctrain train` gets there (the interpreter, `hpctrain.cli` imported, `install_early`), beside the
    interpreter's own start (site and the venv's .pth files) alone: the window before the handlers."""
    bare = "import time\nt = time.time()\n"
    code = "import time\nimport hpctrain.cli\nhpctrain.cli.install_early()\nt = time.time()\n"
    after = (
        "import os\nfrom hpctrain.fsutil import process_started\nprint(t - process_started(os.getpid()))\n"
    )
    # as an installed hpctrain starts: its bytecode cached (a first run writes it), whatever this shell says
    env = {k: v for k, v in child_env(src).items() if k != "PYTHONDONTWRITEBYTECODE"}
    found: dict[str, list[float]] = {"interpreter": [], "handlers": []}
    for attempt in range(runs + 1):
        for key, text in (("interpreter", bare), ("handlers", code)):
            done = subprocess.run(
                [sys.executable, "-c", text + after], env=env, capture_output=True, text=True
            )
            if attempt:
                found[key].append(float(done.stdout.strip()))
    summary: dict[str, Any] = {
        f"{key}_after_s": {
            "median": round(statistics.median(values), 3),
            "min": round(min(values), 3),
            "max": round(max(values), 3),
        }
        for key, values in found.items()
    }
    return {**summary, "runs": runs}


def run_verbs(work: Path, src: Path, say: Any) -> dict[str, Any]:
    """Every family above; the summary bench/faults.py prints under "verbs"."""
    work.mkdir(parents=True, exist_ok=True)
    b = Bench(work, src, say)
    base_out = work / "base"
    base_out.mkdir()
    tb = f"logging.tensorboard.dir={base_out / 'r' / 'tb'}"
    made = b.run(train_args(base_out, "r", tb), base_out)
    if made[0] != 0:
        raise RuntimeError(f"the base run failed: {made[2][-2000:]}")
    b.base = base_out / "r"
    load = os.getloadavg()[0]
    for family in (damaged, names, secrets_and_lock, counts, mirror_and_restart, late_signals, new_verbs):
        started = time.monotonic()
        before = len(b.cases)
        family(b)
        done = b.cases[before:]
        say(
            f"  {family.__name__}: {sum(c.clean for c in done)}/{len(done)} clean "
            f"({time.monotonic() - started:.0f} s)"
        )
    by_verb: dict[str, list[int]] = {}
    for case in b.cases:
        by_verb.setdefault(case.verb, [0, 0])
        by_verb[case.verb][0] += case.clean
        by_verb[case.verb][1] += 1
    return {
        "cases": len(b.cases),
        "clean": sum(c.clean for c in b.cases),
        "all_clean": all(c.clean for c in b.cases),
        "tracebacks": sum(c.traceback for c in b.cases),
        "deaths_by_signal": sum(c.code in (-10, -15, 138, 143) for c in b.cases),
        "by_verb": {verb: f"{clean}/{n}" for verb, (clean, n) in sorted(by_verb.items())},
        "not_clean": [vars(c) for c in b.cases if not c.clean],
        "handler_latency": handler_latency(src),
        "load_at_start": round(load, 2),
        "load_at_end": round(os.getloadavg()[0], 2),
    }
