"""train.compile_background: torch.compile in a helper process while the hop trains eagerly, for real on CPU (the
default workload's MLP), then the switch to compiled networks that load the helper's code from the cache."""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path
from types import SimpleNamespace

import torch

from hpctrain.train.compile.ahead import own_tensors
from hpctrain.train.compile.policy import compile_in_background
from tests.conftest import clean_env, compile_ahead, hpctrain

# one thread: the auto count follows the machine's load, and a second run under another count would find no code
# of its own in the kept cache (Inductor keys its CPU code on the count), as it should, but not what is tested here
ARGS = (
    "train",
    "train.compile=default",
    "train.compile_background=true",
    "train.eval_every=0",
    "train.threads=1",
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not Path(f"/proc/{pid}/status").read_text().count("State:\tZ")


def _summary(tmp_path: Path, name: str) -> dict:
    return json.loads((tmp_path / "logs" / name / "summary.json").read_text())


def test_background_compile_is_on_for_one_cuda_process_unless_asked() -> None:
    assert compile_in_background(None, cuda=True, world_size=1)
    assert not compile_in_background(None, cuda=False, world_size=1)
    assert compile_in_background(True, cuda=False, world_size=1)
    assert not compile_in_background(False, cuda=True, world_size=1)
    assert not compile_in_background(True, cuda=True, world_size=4)  # under DDP: compiled in each rank


def test_the_hop_trains_eagerly_until_the_helper_has_compiled_then_loads_its_code(tmp_path: Path) -> None:
    """The helper compiles from nothing (its own log: cache misses); the training process, switched at the first
    check step after the helper ended (the test hook waits for it there, so the switch update is known), makes
    its graph from the helper's cached code: hits, no misses. The updates before the switch ran eagerly. The helper
    compiles under the trainer's thread count, whatever its own probe of the load would say."""
    env = clean_env(**compile_ahead("wait"))
    args = (*ARGS, "train.total_updates=30", "logging.log_every=5", "run.name=b")
    done = hpctrain(*args, cwd=tmp_path, env=env, timeout=600)
    assert done.code == 0, done.err
    assert "model: torch.compile mode default, compiled in the background (eager until then)" in done.out
    made = _summary(tmp_path, "b")["compile"]
    ahead = made["background"]
    assert ahead["outcome"] == "done" and ahead["networks"] == {"model": "default"}, ahead
    assert 1 <= ahead["eager_updates"] <= 5  # the first check step after the hop's first update
    assert made["graphs"] >= 1 and made["updates"] >= 1
    assert made["inductor_cache_hits"] >= 1 and made["inductor_cache_misses"] == 0, made
    helper = [json.loads(x) for x in Path(ahead["log"]).read_text().splitlines() if x.startswith("{")]
    assert helper and helper[-1]["compiled"] == ["model"] and helper[-1]["inductor_cache_misses"] >= 1
    assert helper[-1]["threads"] == 1  # the trainer's count
    line = f"torch.compile: compiled in the background in {ahead['seconds']:.1f} s while {ahead['eager_updates']}"
    assert line in done.out
    assert not _alive(ahead["pid"])
    # the next hop (here a second run in the same folder, as a sweep's) finds these networks compiled into the kept
    # cache: it loads them in its own process (seconds), no helper, no eager updates
    again = hpctrain(*args[:-1], "run.name=b2", cwd=tmp_path, env=env, timeout=600)
    assert again.code == 0, again.err
    assert "compiled in this process: the kept cache holds these networks' code" in again.out
    warm = _summary(tmp_path, "b2")["compile"]
    assert "background" not in warm and warm["graphs"] >= 1 and warm["updates"] >= 1
    assert warm["inductor_cache_hits"] >= 1 and warm["inductor_cache_misses"] == 0, warm


def test_a_helper_that_fails_leaves_the_compile_to_the_training_process(tmp_path: Path) -> None:
    env = clean_env(**compile_ahead("fail"))
    args = (*ARGS, "train.total_updates=12", "logging.log_every=4", "run.name=f")
    done = hpctrain(*args, cwd=tmp_path, env=env, timeout=600)
    assert done.code == 0, done.err
    made = _summary(tmp_path, "f")["compile"]
    assert made["background"]["outcome"].startswith("failed: "), made
    assert "no_such_helper" in made["background"]["outcome"]  # its last line, said
    said = [x for x in (done.out + done.err).splitlines() if "the background compile failed" in x]
    assert said and "compiling in this process" in said[0]
    assert made["graphs"] >= 1 and made["inductor_cache_misses"] >= 1  # compiled here, from nothing


def test_a_hop_that_ends_first_ran_eagerly_and_ends_the_helper(tmp_path: Path) -> None:
    """Three updates of a tiny MLP end long before a compile can: every update ran eagerly, nothing was compiled
    in the training process, and the helper does not outlive the hop."""
    done = hpctrain(*ARGS, "train.total_updates=3", "run.name=e", cwd=tmp_path, timeout=600)
    assert done.code == 0, done.err
    made = _summary(tmp_path, "e")["compile"]
    ahead = made["background"]
    assert ahead["eager_updates"] == 3 and made["graphs"] == 0, made
    assert ahead["outcome"] in ("unfinished", "done")  # "done" only on a machine that compiles in a blink
    assert not _alive(ahead["pid"])


def test_the_muon_gan_rehearses_every_phase_of_its_warm_up() -> None:
    """The helper runs one update per state: the GAN's warm-up phases run other graphs (likelihood alone, with
    the critic, adversarial), so a helper that rehearsed only the first would leave the others to compile in the
    training process later."""
    from hpctrain.workloads.muons.tasks.base import StepRng
    from hpctrain.workloads.muons.tasks.wgan import MuonWGANTask

    task = MuonWGANTask.__new__(MuonWGANTask)
    task.cfg = SimpleNamespace(
        model=SimpleNamespace(likelihood_warmup=10, critic_warmup=4, adaptive_critic=None)
    )
    task.critic_updates, task.critic_steps, task.scaler_ready = 0, 5, False
    task._rng = StepRng(0, 0)
    for done, phases in ((0, [0, 6, 10]), (7, [7, 10]), (12, [12])):
        task.updates = done
        assert [s["updates"] for s in task.compile_rehearsals()] == phases


def test_the_helper_gets_a_batch_laid_out_in_one_buffer_intact() -> None:
    """A muon batch from the workers lies in one uint8 buffer with int64 and float32 views; torch.load refused it
    as written by torch.save, so the helper died on every real run with workers. `own_tensors` copies each
    tensor apart first: the payload comes back equal."""
    from hpctrain.train.task import MicroBatch
    from hpctrain.workloads.muons.data_verbs import synthetic_events
    from hpctrain.workloads.muons.events.batch import MuonBatch, split_by_muon_cap

    ev = synthetic_events(50, 4, 0)
    whole = MuonBatch.from_numpy(ev.primaries, ev.muons, ev.counts, ev.ids)
    joined = MuonBatch.concat(split_by_muon_cap(whole, 500))
    assert joined.buffer() is not None  # one buffer, the layout that broke
    payload = {
        "micro": [MicroBatch(joined, 1.0, len(joined))],
        "states": [{"rng": torch.ones(3)}],
        "n": (1, 2),
    }
    buffer = io.BytesIO()
    torch.save(own_tensors(payload), buffer)
    back = torch.load(io.BytesIO(buffer.getvalue()), weights_only=False)
    got = back["micro"][0]
    assert isinstance(got, MicroBatch) and got.weight == 1.0 and got.samples == len(joined)
    for name in ("primaries", "muons", "counts", "offsets", "ids", "positions"):
        assert torch.equal(getattr(got.data, name), getattr(whole, name)), name
    assert torch.equal(back["states"][0]["rng"], torch.ones(3)) and back["n"] == (1, 2)


def test_a_helper_still_compiling_at_the_hop_end_gets_the_idle_time_then_is_ended(tmp_path: Path) -> None:
    """After a stop for the time budget the trainer grants the helper the time before the deadline that would
    pass idle (`close(grace)`): one that finishes in it is not killed, one that does not is. Stand-in helpers:
    Python processes that sleep."""
    import subprocess
    import sys

    from hpctrain.train.compile.ahead import CompileAhead

    def helper(sleep: float) -> CompileAhead:
        ahead = CompileAhead({"model": "default"}, tmp_path / "log")
        ahead._begun, ahead.outcome = True, "running"
        ahead.proc = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({sleep})"])
        return ahead

    quick = helper(0.5)
    quick.hop_ended(eager_updates=7)
    assert quick.outcome == "unfinished" and quick.eager_updates == 7
    quick.close(grace=60.0)
    assert quick.proc is not None and quick.proc.returncode == 0  # finished on its own in the grace
    slow = helper(60.0)
    slow.close(grace=0.5)
    assert slow.proc is not None and slow.proc.returncode == -9  # ended
    never = helper(60.0)
    never.close()  # no grace (a finished run, a signal): ended at once
    assert never.proc is not None and never.proc.returncode == -9


def test_a_short_hop_never_blocks_on_a_cold_compile(tmp_path: Path) -> None:
    """Nothing stops a compile at the deadline: in a hop with under 10 minutes left whose networks are not in the
    kept cache, an explicit train.compile compiles in the background (the helper is ended with the hop); if the
    helper fails there, the networks stay eager for the hop instead of compiling in the training process. With
    train.compile_background=false the user keeps the in-process compile, warned."""
    env = clean_env(**compile_ahead("fail"))
    # under 10 minutes left: a short hop (3 minutes, counted from the process start, leave a loaded machine room
    # for its 12 eager updates)
    short = ("train", "train.compile=default", "train.eval_every=0", "budget.time_limit=3:00")
    done = hpctrain(
        *short, "train.total_updates=12", "logging.log_every=4", "run.name=s", cwd=tmp_path, env=env
    )
    assert done.code == 0, done.err
    # the limit counts from the process start: what is left when the networks are wrapped is less
    assert re.search(r"compiled in the background: \d+ s left in this hop and nothing of these", done.out)
    made = _summary(tmp_path, "s")["compile"]
    assert made["graphs"] == 0 and made["background"]["kept_eager"], made
    assert made["background"]["eager_updates"] == 12
    assert "compile-ahead.log): all 12 update(s) ran eagerly" in done.out
    asked = hpctrain(
        *short,
        "train.compile_background=false",
        "train.total_updates=2",
        "run.name=f",
        cwd=tmp_path,
        timeout=600,
    )
    assert asked.code in (0, 75), asked.err  # 75: the compile took the time for a second update
    assert re.search(r"compiled in this process although only \d+ s are left", asked.out)
    assert "train.compile_background=false): a cold compile can outlast the deadline" in asked.out
    assert _summary(tmp_path, "f")["compile"]["graphs"] >= 1


def test_a_helper_done_too_late_to_load_leaves_the_hop_eager_and_the_next_hop_warm(tmp_path: Path) -> None:
    """The switch's first compiled call loads the helper's code, seconds that no stop can cut: with less than
    that left before the margin the hop stays eager; the helper's code is marked, so the next hop loads it in its
    own process. The test hook holds the trainer until the helper ends, which a 100-s margin of a 2-minute limit
    (counted from the process start) does not leave room after: the helper starts when the first update comes
    within 60 s of the start (a loaded machine's imports and build), and its code is too late to load when the
    start and the helper took over 10 s."""
    env = clean_env(**compile_ahead("wait"))
    args = (
        *ARGS,
        "budget.time_limit=2:00",
        "budget.margin_seconds=100",
        "train.total_updates=100000",
        "run.name=k",
    )
    done = hpctrain(*args, cwd=tmp_path, env=env, timeout=600)
    assert done.code == 75, done.err
    assert "torch.compile: compiled in the background; the networks stay eager for the" in done.out
    made = _summary(tmp_path, "k")["compile"]
    assert made["graphs"] == 0 and made["background"]["outcome"] == "done", made
    assert made["background"]["kept_eager"] and "too late in the hop to load" in done.out
    assert list((tmp_path / "logs" / ".compile-cache" / "hpctrain-compiled").iterdir())  # the mark
    again = hpctrain(*args, cwd=tmp_path, timeout=600)
    assert again.code in (0, 75), again.err
    assert "compiled in this process: the kept cache holds these networks' code" in again.out


def test_the_helper_ends_with_its_trainer_even_before_it_ran_and_ignores_the_warning_signals() -> None:
    """The helper's watchdog knows the trainer's PID from its environment: a trainer gone while the helper still
    imported torch (its parent already another) ends it. SLURM's warning signals reach every process of the job
    step: the helper ignores them (the trainer acts on them; the helper's grace may still finish the compile)."""
    import signal
    import subprocess
    import sys
    import time

    from hpctrain.train.compile.ahead import HELPER, PARENT_VARIABLE, helper_environ

    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    env = {**clean_env(), **helper_environ(), PARENT_VARIABLE: gone.stdout.strip()}
    orphan = subprocess.Popen([sys.executable, "-m", HELPER], env=env, stdin=subprocess.PIPE)
    assert orphan.wait(timeout=300) == 3  # ended on its own, never fed
    env[PARENT_VARIABLE] = str(os.getpid())
    helper = subprocess.Popen([sys.executable, "-m", HELPER], env=env, stdin=subprocess.PIPE)
    try:
        usr1 = 1 << (signal.SIGUSR1 - 1)
        deadline = time.monotonic() + 300
        while not int(_status(helper.pid, "SigIgn"), 16) & usr1:  # main() has begun
            assert helper.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        helper.send_signal(signal.SIGUSR1)
        helper.send_signal(signal.SIGUSR2)
        time.sleep(1.0)
        assert helper.poll() is None
    finally:
        helper.kill()
        helper.wait()


def _status(pid: int, field: str) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return line.split()[1]
    raise AssertionError(field)


def test_a_planted_link_or_an_unusable_compile_cache_is_one_line(tmp_path: Path) -> None:
    """The helper's log is never written through a symbolic link (the file it points at stays whole); a compile
    cache that cannot hold files (a file in its place, TORCHINDUCTOR_CACHE_DIR under a file) is one line naming
    it, exit 2, before anything trains."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / "logs" / "l").mkdir(parents=True)
    (tmp_path / "logs" / "l" / "compile-ahead.log").symlink_to(victim)
    linked = hpctrain(*ARGS, "train.total_updates=3", "run.name=l", cwd=tmp_path)
    assert linked.code == 2 and victim.read_text() == "precious"
    assert "compile-ahead.log is a symbolic link" in linked.err and len(linked.err.strip().splitlines()) == 1
    (tmp_path / "other" / ".compile-cache").parent.mkdir()
    (tmp_path / "other" / ".compile-cache").write_text("not a folder")
    filed = hpctrain(*ARGS, "train.total_updates=3", "run.out_dir=other", cwd=tmp_path)
    assert filed.code == 2 and len(filed.err.strip().splitlines()) == 1, filed.err
    assert "compile cache (run.out_dir): " in filed.err and ".compile-cache is not a folder" in filed.err
    env = clean_env(TORCHINDUCTOR_CACHE_DIR=str(victim / "cache"))
    under = hpctrain(*ARGS, "train.total_updates=3", "run.name=u", cwd=tmp_path, env=env)
    assert under.code == 2 and len(under.err.strip().splitlines()) == 1, under.err
    assert f"TORCHINDUCTOR_CACHE_DIR={victim / 'cache'}: cannot be a folder" in under.err
    assert victim.read_text() == "precious"
    # compile off too: torch makes that folder when the optimizer imports its compiler (a traceback before)
    for value in (victim, victim / "cache"):
        off = hpctrain(
            "train",
            "train.compile=off",
            "train.total_updates=3",
            "run.name=off",
            cwd=tmp_path,
            env=clean_env(TORCHINDUCTOR_CACHE_DIR=str(value)),
        )
        assert off.code == 2 and len(off.err.strip().splitlines()) == 1, off.err
        assert f"error: TORCHINDUCTOR_CACHE_DIR={value}: cannot be a folder" in off.err
        assert not (tmp_path / "logs" / "off").exists()  # refused before anything was made
    assert victim.read_text() == "precious"


def test_the_compile_mark_is_the_networks_with_their_batch_and_settings(tmp_path: Path) -> None:
    """A mark says 'these networks' code is in the kept cache': a run of another batch size (other shapes for a
    network compiled with static ones) or other model settings is not warm from it."""
    from hpctrain.config.loading import ConfigRequest, load_config
    from hpctrain.runtime.env import ClusterEnv
    from hpctrain.train.compile.compiler import Compiler
    from hpctrain.train.setup import Setup
    from hpctrain.workloads.registry import config_model, fill_default_types, make_task

    def key(*overrides: str) -> str:
        over = [
            f"run.out_dir={tmp_path}",
            "train.compile=default",
            "train.compile_background=true",
            "train.threads=1",  # auto would follow the load, and Inductor's CPU code is keyed on the count
            *overrides,
        ]
        cfg = load_config(ConfigRequest(None, None, over, None), config_model(), {}, fill_default_types)
        task = make_task(cfg, ClusterEnv())
        setup = Setup(cfg, task, ClusterEnv())
        compiler = Compiler(cfg, task, ClusterEnv(), setup.device)
        setup.wrap(task.build_modules(), compiler, None)
        return compiler.key

    base = key()
    assert base and key() == base
    assert key("data.batch_size=64") != base
    assert key("train.precision=bf16") != base
    assert key("model.dropout=0.25") != base
    assert key("train.threads=2") != base  # code compiled under one thread count is a miss under another


def test_the_compile_mark_changes_with_the_networks_source(tmp_path: Path) -> None:
    """A scientist edits the forward of their own network in place (no version bump, same repr): the code in
    the kept cache is not that network's any more, so the mark of the old source must not count as warm."""
    import importlib.util

    from torch import nn

    from hpctrain.train.compile.cache import compile_key

    def network(forward: str) -> nn.Module:
        path = tmp_path / "my_net.py"
        path.write_text(
            "from torch import nn\n\n"
            "class Net(nn.Module):\n"
            "    def __init__(self):\n"
            "        super().__init__()\n"
            "        self.lin = nn.Linear(3, 3)\n\n"
            f"    def forward(self, x):\n        return {forward}\n"
        )
        spec = importlib.util.spec_from_file_location("my_net", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.Net()

    def key(net: nn.Module) -> str:
        return compile_key({"model": net}, {"model": "default"}, "fp32")

    original = network("self.lin(x)")
    before = key(original)
    assert key(network("self.lin(x)")) == before  # the same source: the same key, in any process
    edited = network("self.lin(x).relu()")
    assert repr(edited) == repr(original)  # what the key held before could not tell them apart
    assert key(edited) != before
    plain = nn.Sequential(
        nn.Linear(3, 3), nn.ReLU()
    )  # torch's own classes: the torch version stands for them
    assert key(plain) == key(nn.Sequential(nn.Linear(3, 3), nn.ReLU()))


def test_the_compile_line_says_whether_the_networks_were_switched(tmp_path: Path) -> None:
    """A helper that ends after the hop's last check step (or in the grace after it) was never switched to: the
    line says every update ran eagerly, not 'compiled in this process'; one that compiled every network marks
    nothing by itself but says so (`compiled_all`), which the trainer's close turns into the mark."""
    import subprocess
    import sys

    from hpctrain.train.compile.ahead import CompileAhead

    def ended(code: int, last: str) -> CompileAhead:
        ahead = CompileAhead({"model": "default"}, tmp_path / f"log{code}")
        ahead.log_path.write_text(last + "\n")
        ahead._begun, ahead.outcome, ahead.started = True, "running", 0.0
        ahead.proc = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"])
        ahead.proc.wait()
        ahead.hop_ended(eager_updates=42)
        return ahead

    failed = ended(1, "RuntimeError: boom")
    assert failed.outcome == "failed: RuntimeError: boom" and not failed.compiled_all()
    assert "all 42 update(s) ran eagerly" in failed.said() and "compiled in this process" not in failed.said()
    done = ended(0, json.dumps({"compiled": ["model"], "recompile_limit_hits": 0}))
    assert done.outcome == "done" and done.compiled_all()
    assert "too late in the hop to load: the networks stayed eager for all 42 update(s)" in done.said()
    done.switched = True
    assert (
        done.said().startswith("compiled in the background in")
        and "while 42 update(s) ran eagerly" in done.said()
    )
    partial = ended(0, json.dumps({"compiled": [], "recompile_limit_hits": 0}))
    assert not partial.compiled_all()  # nothing compiled: no mark
