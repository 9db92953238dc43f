"""What a run shows and keeps: a short config line (the whole config goes to the run folder) and on a terminal
one bar (few redraws, our rate, closed before the last line); plain lines in a log file, `logging` records in
the same form; every hop's lines in training.log; profiling and hardware figures when asked for."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

from hpctrain.runtime.threads import usable_cores
from tests.conftest import clean_env, hpctrain, read_jsonl


def on_terminal(*args: str, cwd: Path, timeout: float = 180) -> tuple[int, str, float]:
    """Run `hpctrain ARGS` with stdout and stderr on a pseudo-terminal, as a user at a shell would."""
    master, slave = pty.openpty()
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpctrain", *args], cwd=cwd, env=clean_env(), stdout=slave, stderr=slave
    )
    os.close(slave)
    chunks = []
    while True:
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
        assert time.monotonic() - started < timeout
    proc.wait(timeout=30)
    os.close(master)
    return proc.returncode, b"".join(chunks).decode(errors="replace"), time.monotonic() - started


def test_terminal_gets_a_short_config_and_one_calm_bar(tmp_path: Path) -> None:
    code, text, seconds = on_terminal("train", "train.total_updates=300", "model.hidden=[8]", cwd=tmp_path)
    assert code == 0, text[-3000:]
    assert text.startswith("run folder logs/debug-hidden8 (automatic run.name: debug + model.hidden=[8])\r\n")
    assert "config (logs/debug-hidden8/config.yaml; --verbose prints it): " in text
    assert "model.hidden=[8]" in text and "\nrun:\n" not in text.replace("\r", "")  # not the 130-line dump
    redraws = text.count("\r") - text.count("\r\n")
    assert redraws <= 12 + 4 * seconds, (redraws, seconds)  # was one per update (305 for 300)
    assert "upd/s" not in text and "it/s" not in text  # one rate: ours
    assert "\r\nfinished at update 300/300" in text  # the bar's line ended before the last line
    verbose = on_terminal("train", "--verbose", "run.name=v", "train.total_updates=5", cwd=tmp_path)[1]
    assert "run:\r\n  name: v\r\n" in verbose


def test_training_log_keeps_every_hop(tmp_path: Path) -> None:
    # No validation data with eval_every set: a warning, which goes to the log too.
    args = ("logging.log_every=10", "data.n_val=0", "train.eval_every=10")
    first = hpctrain("train", "train.total_updates=20", *args, cwd=tmp_path)
    assert first.code == 0, first.err
    second = hpctrain("train", "train.total_updates=40", *args, cwd=tmp_path)
    assert second.code == 0, second.err
    log = (tmp_path / "logs" / "debug-n_val0" / "training.log").read_text()  # data.n_val names the run
    assert log.count("==== ") == 2  # one header per hop
    assert "\nrun:\n" not in log and "config (logs/debug-n_val0/config.yaml; --verbose prints it): " in log
    assert "run:\n  name: debug-n_val0" in (tmp_path / "logs" / "debug-n_val0" / "config.yaml").read_text()
    assert "\nrun:\n" not in first.out  # nor the job's log (not a terminal)
    for line in (
        "update 10/20 |",
        "update 20/20 |",
        "update 30/40 |",
        "update 40/40 |",
        "finished at update 40/40.",
    ):
        assert line in log, line
    assert log.index("update 20/20") < log.index("==== ", 1) < log.index("update 30/40")
    # a `logging` record reads like the other lines (no time stamp, level or module name before it)
    assert log.count("\nwarning: train.eval_every=10 is ignored") == 2
    assert first.err.startswith("warning: train.eval_every=10 is ignored: this data has no validation set")
    # the run's last line is its last line, on every hop
    assert first.out.splitlines()[-1].startswith("finished at update 20/20. params_sha256=")
    # train.threads=0 chose a count from how busy the cores were at the first start; the second hop keeps it
    # (another count changes the arithmetic), whatever the load is now
    hops = json.loads((tmp_path / "logs" / "debug-n_val0" / "chain.json").read_text())
    if usable_cores() > 1:  # one core: one thread, nothing to choose or keep
        assert (
            hops[0]["threads"] == hops[1]["threads"] >= 1 and hops[0]["threads_cores"] >= hops[0]["threads"]
        )
        assert "as in this run's earlier hops on the same cores" in second.out


def test_profile_window_and_hardware_figures_through_the_cli(tmp_path: Path) -> None:
    done = hpctrain(
        "train",
        "train.total_updates=30",
        "logging.log_every=10",
        "train.profile.start=5",
        "train.profile.warmup=1",
        "train.profile.active=2",
        "logging.gpu_every_seconds=0.2",
        cwd=tmp_path,
    )
    assert done.code == 0, done.err
    # a CPU run asked for no GPU: nothing said about GPU monitoring (NVML is not even tried)
    assert "GPU monitoring" not in done.out + done.err
    profile = tmp_path / "logs" / "debug" / "profile"
    traces = list(profile.glob("debug_rank0.*.pt.trace.json"))
    assert len(traces) == 1
    steps = {
        e["name"]
        for e in json.loads(traces[0].read_text())["traceEvents"]
        if "ProfilerStep#" in e.get("name", "")
    }
    assert len(steps) == 2
    assert "aten::" in (profile / "top_ops_rank0.txt").read_text()
    logged = [r for r in read_jsonl(tmp_path / "logs" / "debug" / "metrics.jsonl") if "loss" in r]
    assert logged and all(0.01 < r["rss_gb"] < 20 and r["workers"] == 0 for r in logged)


def test_bf16_on_a_cpu_without_bf16_units_is_said() -> None:
    """Measured, not assumed: where the CPU has no bf16 units (no avx512_bf16 / amx_bf16 flag) the measured layer
    is slower in bf16, and the note says so and names fp32; elsewhere it may say nothing."""
    import torch

    from hpctrain.train.context import bf16_on_cpu_note

    note = bf16_on_cpu_note(torch.get_num_threads())
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else "avx512_bf16"
    if "avx512_bf16" not in flags and "amx_bf16" not in flags:
        assert note.startswith("note: train.precision=bf16 is slow on this CPU (a bf16 layer took ")
        assert note.endswith("train.precision=fp32 trains faster here") and "\n" not in note
    assert note == "" or "fp32" in note
