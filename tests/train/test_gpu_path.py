"""The GPU path, as far as a CPU shows it: compile modes (auto), the compiled gradient penalty, compile time kept
out of step time, GPU time shares, the CUDA checks of GPU presets, and bench/gpu.py's code paths."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hpctrain.runtime.torch_build import installed_build
from hpctrain.train.compile.policy import resolve_compile, short_hop
from hpctrain.train.outcome import Timers
from hpctrain.workloads.muons.models.losses import functional_penalty, gradient_penalty, pair_muons
from hpctrain.workloads.muons.models.networks import Critic, event_index
from tests.conftest import clean_env, hpctrain

REPO = Path(__file__).resolve().parents[2]


def test_auto_compiles_on_cuda_only_and_not_in_short_hops() -> None:
    assert resolve_compile("auto", cuda=True) == "default"
    assert resolve_compile("auto", cuda=False) == "off"
    for mode in ("off", "default", "reduce-overhead", "max-autotune"):
        assert resolve_compile(mode, cuda=False) == mode == resolve_compile(mode, cuda=True)
    assert short_hop(59.0) and short_hop(599.0)
    assert not short_hop(None) and not short_hop(3600.0)


def _critic_inputs(seed: int) -> tuple:
    gen = torch.Generator().manual_seed(seed)
    counts = torch.tensor([3, 0, 5, 1])
    total = int(counts.sum())
    real = torch.randn(total, 3, generator=gen)
    fake = torch.randn(total, 3, generator=gen)
    primaries = torch.randn(4, 4, generator=gen)
    return real, fake, primaries, counts, total


@pytest.mark.parametrize("pooling", ["max", "mean"])
def test_the_penalty_by_torch_func_equals_the_double_backward_one(pooling: str) -> None:
    torch.manual_seed(0)
    critic = Critic(16, pooling, muon_score=True)
    real, fake, primaries, counts, total = _critic_inputs(1)
    pairs = pair_muons(counts, counts, 0, True, total)
    values, grads = [], []
    for penalty in (None, functional_penalty):
        critic.zero_grad()
        rng = torch.Generator().manual_seed(7)  # the same alphas for both
        value = gradient_penalty(
            critic, real, fake, primaries, counts, counts, pairs, "tanh", 5.0, rng, penalty
        )
        value.backward()
        values.append(float(value.detach()))
        grads.append(
            [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in critic.parameters()]
        )
    assert values[0] == pytest.approx(values[1], rel=1e-6) and values[0] > 0
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert any(float(g.abs().sum()) > 0 for g in grads[0])  # the penalty does reach the weights
    assert event_index(counts, total).tolist() == pairs.event.tolist()


def test_device_timeline_rebooks_host_waits_as_step_time() -> None:
    timers = Timers()
    timers.add("data", 0.6)  # the host's view: the wait for the GPU's queue landed on the next batch's copy
    timers.add("step", 0.4)
    timers.rebook(0.9)  # the GPU was busy with steps 0.9 s of that second
    assert timers.window["step"] == pytest.approx(0.9) and timers.window["data"] == pytest.approx(0.1)
    assert timers.training_seconds == pytest.approx(1.0)  # goodput unchanged: only the split moves
    timers.rebook(5.0)  # never more step time than the host saw pass
    assert timers.window["step"] == pytest.approx(1.0) and timers.window["data"] == pytest.approx(0.0)


def test_the_torch_build_is_read_without_importing_torch() -> None:
    build = installed_build()
    assert build is not None and build[0] == torch.__version__ and build[1] == torch.version.cuda
    code = "import sys; from hpctrain.runtime.torch_build import installed_build; installed_build(); "
    code += "print('torch' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), check=True
    )
    assert done.stdout.strip() == "False"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only refusal needs a CPU-only torch")
def test_gpu_presets_on_a_cpu_only_torch_stop_at_once_naming_the_cuda_install(tmp_path: Path) -> None:
    done = hpctrain("train", "--preset", "single_gpu", "train.total_updates=2", cwd=tmp_path)
    assert done.code == 2, done.err
    line = done.err.strip().splitlines()
    assert len(line) == 1 and "CPU-only build" in line[0] and "TORCH_SPEC=" in line[0], done.err
    assert "train.device=cpu" in line[0]
    assert not (tmp_path / "logs").exists()  # nothing made before the refusal
    # the same refusal before a job is queued; a dry run still shows the plan, with the warning
    queued = hpctrain("submit", "--preset", "multi_gpu", cwd=tmp_path)
    assert queued.code == 2 and "CPU-only build" in queued.err and len(queued.err.strip().splitlines()) == 1
    plan = hpctrain("submit", "--preset", "multi_gpu", "--dry-run", cwd=tmp_path)
    assert plan.code == 0 and "#SBATCH" in plan.out and "warning: train.device=cuda" in plan.err
    # a plain CPU run and the preset with train.device=cpu are not refused
    ok = hpctrain(
        "train", "--preset", "single_gpu", "train.device=cpu", "train.total_updates=2", cwd=tmp_path
    )
    assert ok.code == 0, ok.err


def test_an_update_that_compiles_is_compile_time_not_step_time(tmp_path: Path) -> None:
    """torch.compile for real (a tiny MLP on CPU): the updates that compiled are booked as compile time, so the
    time budget's step estimate (kept in the checkpoint) holds only compiled steps."""
    # one thread: Inductor keys its CPU code on the count, which train.threads auto takes from the machine's load
    args = (
        "train",
        "train.compile=default",
        "train.total_updates=6",
        "train.eval_every=0",
        "train.threads=1",
    )
    args = (*args, "run.name=c")
    done = hpctrain(*args, "logging.log_every=3", cwd=tmp_path, timeout=600)
    assert done.code == 0, done.err
    run = tmp_path / "logs" / "c"
    summary = json.loads((run / "summary.json").read_text())
    seconds = summary["seconds"]
    assert seconds["compile"] > 0 and seconds["step"] > 0
    state = torch.load(run / "checkpoints" / "step_00000006.pt", weights_only=True)
    budget = next(v for k, v in _walk(state) if k == "budget")
    recent = budget["step"]["recent"]
    assert 0 < len(recent) < 6  # the compiling update(s) left out
    assert max(recent) < seconds["compile"]  # any one compiled step is quicker than compiling was
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("compile_share", 0) > 0 for r in rows)
    # the compiled code is kept beside the runs, for the next hop (not in node-local /tmp)
    assert any((tmp_path / "logs" / ".compile-cache").iterdir())
    assert f"compiled code kept in {tmp_path / 'logs' / '.compile-cache'}" in done.out
    # what the compiler did, said at the end and kept in summary.json: the hop compiled, and nothing hit a limit
    made = summary["compile"]
    assert made["graphs"] >= 1 and 1 <= made["updates"] < 6 and made["recompile_limit_hits"] == 0
    assert made["seconds"] == pytest.approx(seconds["compile"], abs=1e-3)
    assert f"torch.compile: {made['graphs']} graph(s) in " in done.out
    # a second run in the same folder (a next hop, a sweep's next run) loads the kept code: cache hits, no misses
    again = hpctrain(*args[:-1], "run.name=c2", "logging.log_every=3", cwd=tmp_path, timeout=600)
    assert again.code == 0, again.err
    warm = json.loads((tmp_path / "logs" / "c2" / "summary.json").read_text())["compile"]
    assert warm["inductor_cache_hits"] >= 1 and warm["inductor_cache_misses"] == 0, warm
    assert warm["aot_cache_hits"] >= 1 and warm["aot_cache_misses"] == 0, warm


def test_ragged_networks_are_traced_once_per_compile() -> None:
    """compile_network(dynamic=True) keeps Python floats constant: Dynamo otherwise makes LayerNorm's eps and the
    module constants symbols, fails to turn them into tensors and traces the whole network a second time (on the
    muon generator 5.7 of a warm compile's 8.3 s). The AOT pipeline alone (aot_eager: no code generation) shows
    the restart; the muon generator's losses and gradients stay eager's."""
    import logging

    import torch._logging

    from hpctrain.train.compile.policy import compile_network
    from hpctrain.workloads.muons.models.losses import likelihood_losses
    from hpctrain.workloads.muons.models.networks import Generator

    torch.manual_seed(0)
    net = Generator(0, 1, 16, [16], cap=2000, head="flow", flow_bins=4)
    # torch.compile is lazy: this sets what the trace reads and compiles nothing yet
    compile_network(net, "default", None, dynamic=True)
    compiled = torch.compile(net, backend="aot_eager", dynamic=True)
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    keep = Keep()
    logger = logging.getLogger("torch._dynamo")  # its children's records: tracing starts, restarts
    torch._dynamo.reset()
    torch._logging.set_logs(dynamo=logging.INFO)
    logger.addHandler(keep)
    try:
        for events, muons in ((40, 300), (37, 251)):
            counts = torch.full((events,), muons // events)
            counts[: muons - int(counts.sum())] += 1
            primaries, real = torch.randn(events, 4), torch.randn(muons, 3)
            index = event_index(counts, muons)
            results = []
            for module in (net, compiled):
                net.zero_grad()
                mult, muon = likelihood_losses(
                    module, primaries, counts, index, real, primaries.new_zeros((events, 0))
                )
                (mult + muon).backward()
                results.append(
                    (
                        mult.detach(),
                        muon.detach(),
                        [p.grad.clone() for p in net.parameters() if p.grad is not None],
                    )
                )
            (m0, u0, g0), (m1, u1, g1) = results
            torch.testing.assert_close((m1, u1), (m0, u0), rtol=1e-5, atol=1e-6)
            for a, b in zip(g1, g0, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    finally:
        logger.removeHandler(keep)
        torch._logging.set_logs()
    assert any("start tracing forward" in r for r in records)  # the log is seen
    assert not [r for r in records if "Restarting analysis" in r]
    assert sum("start tracing forward" in r for r in records) == 1  # one trace, both batch sizes


def _walk(tree: object, key: str = ""):  # type: ignore[no-untyped-def]
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield k, v
            yield from _walk(v, k)


# its compiles took ~2 minutes on CI and 431 s beside three busy loops: the suite's 600 s per test is too near
@pytest.mark.timeout(1200)
def test_gpu_bench_runs_on_cpu(tmp_path: Path) -> None:
    """bench/gpu.py's code paths on CPU (so it never rots): the compiled WGAN step equals the eager one and does
    not recompile once warm; the end-to-end runs and the loader give their figures."""
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu.py"), "--device", "cpu", "--tiny", "--repeats", "1",
         "--updates", "1", "--critic-steps", "2", "--only", "step", "--only", "e2e", "--only", "loader",
         "--workdir", str(tmp_path), "--out", str(tmp_path / "figures.json")],
        capture_output=True, text=True, env=clean_env(), timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert json.loads((tmp_path / "figures.json").read_text()) == result  # kept for a call cut off later
    assert set(result["part_seconds"]) == {"step", "data", "e2e", "loader"}
    step = result["step"]
    for label in ("gp_off", "gp_every_2"):
        eager, compiled = step["eager_fp32"][label], step["compiled_fp32"][label]
        assert compiled["recompiles_timed"] == 0 and compiled["updates_per_s"] > 0
        for key, value in eager["losses"].items():
            assert compiled["losses"][key] == pytest.approx(value, rel=1e-3, abs=1e-5), key
    assert step["eager_fp32"]["gp_every_2"]["losses"]["gradient_penalty"] > 0
    assert result["e2e"]["compile_off"]["steps"] == result["e2e"]["compile_auto"]["steps"] > 0
    assert result["loader"]["events_per_s"] > 0 and "loader_over_consumed_ratio" in result

    # the lease runs parts in separate calls: --merge joins their files, and the figure across parts comes back
    loader, rest = tmp_path / "loader.json", tmp_path / "rest.json"
    loader.write_text(json.dumps({k: v for k, v in result.items() if k not in ("e2e", "step")}))
    rest.write_text(json.dumps({k: v for k, v in result.items() if k != "loader"}))
    merged = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu.py"), "--merge", str(loader), str(rest)],
        capture_output=True, text=True, env=clean_env(), timeout=120,
    )  # fmt: skip
    assert merged.returncode == 0, merged.stderr
    assert json.loads(merged.stdout.strip().splitlines()[-1]) == result
    other = tmp_path / "other.json"  # figures of another machine do not join
    other.write_text(json.dumps({**result, "device": "NVIDIA H100 80GB HBM3"}))
    refused = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu.py"), "--merge", str(loader), str(other)],
        capture_output=True, text=True, env=clean_env(), timeout=120,
    )  # fmt: skip
    assert refused.returncode == 2 and "device 'NVIDIA H100 80GB HBM3', not 'cpu'" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    listed = tmp_path / "list.json"  # JSON, but not figures
    listed.write_text("[1, 2]")
    odd = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu.py"), "--merge", str(listed)],
        capture_output=True, text=True, env=clean_env(), timeout=120,
    )  # fmt: skip
    assert odd.returncode == 2 and "a JSON list, not an object" in odd.stderr
    assert len(odd.stderr.strip().splitlines()) == 1


def test_the_gpu_benchs_flags_are_checked_before_anything_runs(tmp_path: Path) -> None:
    """A flag a user gets wrong is one line, exit 2, before data or compiling are spent (a traceback before, or
    figures computed and then lost to an --out that is a folder)."""
    (tmp_path / "afile").write_text("x")
    (tmp_path / "stranger.json").write_text('{"a": 1}')
    cases = {
        ("--repeats", "0"): "error: --repeats must be at least 1, not 0",
        ("--updates", "-1"): "error: --updates must be at least 1, not -1",
        ("--critic-steps", "0"): "error: --critic-steps must be at least 1, not 0",
        ("--cap", "-3"): "error: --cap must be at least 1, not -3",
        ("--hop-seconds", "-5"): "error: --hop-seconds must be at least 15, not -5",
        ("--workdir", str(tmp_path / "afile")): f"error: --workdir {tmp_path / 'afile'} is not a folder",
        ("--out", str(tmp_path)): f"error: --out {tmp_path} is a folder: name the JSON file to write",
        ("--merge", str(tmp_path / "stranger.json")): "not its keys device, torch, part_seconds",
    }
    for flags, message in cases.items():
        done = subprocess.run(
            [sys.executable, str(REPO / "bench" / "gpu.py"), "--device", "cpu", "--tiny", *flags],
            capture_output=True, text=True, env=clean_env(), timeout=120,
        )  # fmt: skip
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, (flags, done.stderr)
        assert message in done.stderr, (flags, done.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "stranger.json"]  # nothing made


def test_a_function_past_the_recompile_limit_is_counted() -> None:
    """Past torch's recompile limit a function runs eagerly for the rest of the process, which torch only warns
    about: the hop's compile line counts it (compile_stats)."""
    import torch._dynamo

    from hpctrain.train.compile.stats import compile_stats, compile_summary, watch_compiles

    watch_compiles()
    watch_compiles()  # once per process, however often asked
    before = compile_stats()

    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    compiled = torch.compile(double, backend="eager", dynamic=False)
    with torch._dynamo.config.patch(recompile_limit=1, automatic_dynamic_shapes=False):
        for n in (2, 3, 4):
            assert torch.equal(compiled(torch.ones(n)), torch.full((n,), 2.0))
    entry, line = compile_summary(before, updates=1, seconds=0.5)
    assert entry["recompile_limit_hits"] >= 1 and entry["graphs"] == 1
    assert "hit torch's recompile limit and ran eagerly" in line
    assert (
        compile_stats()["recompile_limit_hits"]
        == before["recompile_limit_hits"] + entry["recompile_limit_hits"]
    )


def test_the_lease_script_keeps_each_parts_figures(tmp_path: Path) -> None:
    """bench/gpu_lease.sh (the GPU machine's command): each part's figures and log land under $OUT as the part
    ends, the last line joins them; an unknown part is one line and exit 2, before anything runs."""
    env = {**clean_env(), "PYTHON": sys.executable, "OUT": str(tmp_path / "out"),
           "GPU_WORKDIR": str(tmp_path / "work")}  # fmt: skip
    script = str(REPO / "bench" / "gpu_lease.sh")
    done = subprocess.run(
        ["bash", script, "loader", "--", "--device", "cpu", "--tiny"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out = tmp_path / "out"
    figures = json.loads((out / "gpu-loader.json").read_text())
    assert figures["loader"]["events_per_s"] > 0 and figures["device"] == "cpu"
    assert "loader alone:" in (out / "gpu-loader.log").read_text()
    assert "torch" in (out / "machine.txt").read_text()
    assert json.loads(done.stdout.strip().splitlines()[-1])["loader"] == figures["loader"]
    bad = subprocess.run(["bash", script, "loadr"], capture_output=True, text=True, env=env, timeout=60)
    assert bad.returncode == 2 and "unknown part 'loadr'" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
