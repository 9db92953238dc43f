"""The faults at the edges of a run, for bench/faults.py `--edges`: not SIGKILLs but what a cluster and its other
users do at a run's start and end. Each case runs the regression job in a fresh folder through the fault, then
runs the same command again until it finishes, and checks it like any killed run (params equal to the
uninterrupted reference, every update once):

- signal:first_second   USR1 or TERM 0 to 1 s after the start (a sweep of delays): exit 75, requeue-able;
- signal:after_finished TERM and USR1 right after the "finished" line: ignored, exit 0;
- disk:startup          writes past 200 bytes fail (RLIMIT_FSIZE, SIGXFSZ ignored: EFBIG as at a quota) from the
                        start: one line, exit 2, nothing half-written;
- disk:save             a stopped run resumed under a 20 kB file size limit: its first save fails, one line,
                        exit 1, the last checkpoint kept;
- chain:damaged         a stopped run whose chain.json is then overwritten with garbage;
- owner:other           a stopped run whose folder then belongs to another user (as root: chown 65534; else
                        made writable by its group): exit 2, one line; given back, it resumes.

The children start with the stop signals blocked, as a launcher that leaves no window before Python runs (the
handlers let them through once installed: runtime/signals.py); unblocked, a signal in the interpreter's first
~50 ms still kills it.
"""

from __future__ import annotations

import os
import random
import resource
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fault_check import Job, Reference, verify
from fault_procs import child_env

STOP = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)
SWEEP = (0.0, 0.25, 0.5, 0.75, 1.0)  # seconds after the start: signal:first_second's delays
EXPECTED = {  # the exit code of the hop that meets the fault
    "signal:first_second": 75,
    "signal:after_finished": 0,
    "disk:startup": 2,
    "disk:save": 1,
    "chain:damaged": 0,
    "owner:other": 2,
}


@dataclass
class EdgeHop:
    code: int
    last_line: str
    err: str


def hop(
    job: Job,
    out: Path,
    src: Path,
    limit: int | None = None,
    signal_at: tuple[float, int] | None = None,
    on_finished: bool = False,
) -> EdgeHop:
    """One process of `job` in `out`: under a file size `limit`, signalled `signal_at` (delay, signal) after its
    start, or right after it printed "finished" (`on_finished`)."""

    def prepare() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP)
        if limit is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = subprocess.Popen(
        [sys.executable, "-m", "hpctrain", *job.args, f"run.out_dir={out}"],
        cwd=out,
        env=child_env(src),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=prepare,
    )
    if signal_at is not None:
        time.sleep(signal_at[0])
        proc.send_signal(signal_at[1])
    last = ""
    if on_finished:
        assert proc.stdout is not None
        for line in proc.stdout:
            last = line.strip() or last
            if line.startswith("finished at update"):
                proc.send_signal(signal.SIGTERM)
                proc.send_signal(signal.SIGUSR1)
                break
    rest, err = proc.communicate(timeout=300)
    lines = [line for line in rest.splitlines() if line.strip()]
    return EdgeHop(proc.returncode, lines[-1] if lines else last, err)


def until_done(job: Job, out: Path, src: Path, hops: list[EdgeHop]) -> None:
    for _ in range(4):
        if hops and hops[-1].code == 0:
            return
        hops.append(hop(job, out, src))


def one_edge(
    edge: str, job: Job, out: Path, src: Path, rng: random.Random, delay: float = 0.0
) -> dict[str, Any]:
    out.mkdir(parents=True)
    run_dir = out / job.name
    hops: list[EdgeHop] = []
    stopped = (rng.uniform(1.5, 3.0), signal.SIGUSR1)  # a first hop stopped mid-run: a checkpoint to resume
    if edge == "signal:first_second":
        hops.append(hop(job, out, src, signal_at=(delay, rng.choice([signal.SIGUSR1, signal.SIGTERM]))))
    elif edge == "signal:after_finished":
        hops.append(hop(job, out, src, on_finished=True))
    elif edge == "disk:startup":
        hops.append(hop(job, out, src, limit=200))
    elif edge == "disk:save":
        hops.append(hop(job, out, src, signal_at=stopped))
        hops.append(hop(job, out, src, limit=20_000))
    elif edge == "chain:damaged":
        hops.append(hop(job, out, src, signal_at=stopped))
        (run_dir / "chain.json").write_text("{{ not json at all")
        hops.append(hop(job, out, src))
    elif edge == "owner:other":
        hops.append(hop(job, out, src, signal_at=stopped))
        mode = run_dir.stat().st_mode
        if os.getuid() == 0:
            os.chown(run_dir, 65534, 65534)
        else:
            run_dir.chmod(mode | 0o020)
        hops.append(hop(job, out, src))
        if os.getuid() == 0:
            os.chown(run_dir, 0, 0)
        run_dir.chmod(mode)
    met = hops[-1]
    errors = [line for line in met.err.splitlines() if line.startswith("error: ")]
    clean = met.code == EXPECTED[edge] and (
        met.code in (0, 75) or (len(errors) == 1 and "Traceback" not in met.err)
    )
    until_done(job, out, src, hops)
    verdict = verify(job, run_dir, hops[-1].last_line, REF[0]) if hops[-1].code == 0 else None
    return {
        "edge": edge,
        "delay": delay if edge == "signal:first_second" else None,
        "codes": [h.code for h in hops],
        "clean": clean,
        "said": errors[0][:200] if errors else met.last_line[:120],
        "params_equal": bool(verdict and verdict["params_equal"]),
        "anomalies": (verdict or {}).get("anomalies", ["never finished"]),
    }


REF: list[Reference] = []


def run_edges(
    job: Job, ref: Reference, work: Path, src: Path, rng: random.Random, say: Any
) -> dict[str, Any]:
    """Every edge case (the signal sweep once per delay); the summary bench/faults.py prints under "edges"."""
    REF[:] = [ref]
    cases = [("signal:first_second", d) for d in SWEEP] + [
        (e, 0.0) for e in EXPECTED if e != "signal:first_second"
    ]
    results = []
    for i, (edge, delay) in enumerate(cases):
        result = one_edge(edge, job, work / f"edge{i:02d}", src, rng, delay)
        say(f"  edge {edge} {'' if result['delay'] is None else f'at {delay:.2f} s '}: {result}")
        results.append(result)
    return {
        "cases": results,
        "all_clean": all(r["clean"] for r in results),
        "all_params_equal": all(r["params_equal"] for r in results),
        "deaths_by_signal": sum(c in (-10, -15, 138, 143) for r in results for c in r["codes"]),
    }
