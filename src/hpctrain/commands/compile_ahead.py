"""The background compile's helper process (train/compile_ahead.py): `python -m hpctrain.commands.compile_ahead`,
fed by the trainer through stdin. It builds the run's networks with the trainer's weights, compiles them as the
trainer will (`Setup.wrap`, the same `Compiler.compiled` call), and runs one update per rehearsed task state on the
trainer's first batch: torch.compile's caches (<run.out_dir>/.compile-cache, named by the inherited
TORCHINDUCTOR_CACHE_DIR) then hold what the trainer's own first compiled call looks up. Nothing else is written."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import signal
import sys
import threading
import time

import torch

from hpctrain.config.validation import validate
from hpctrain.runtime.env import ClusterEnv
from hpctrain.runtime.seeding import seed_everything
from hpctrain.train.compile.ahead import PARENT_VARIABLE
from hpctrain.train.compile.compiler import Compiler
from hpctrain.train.compile.policy import is_compiled
from hpctrain.train.compile.stats import compile_stats
from hpctrain.train.nonfinite import NonFiniteGuard
from hpctrain.train.setup import Setup
from hpctrain.workloads.registry import config_model, make_task


def _end_with(parent: int) -> None:
    """The trainer is gone (killed without closing us): nothing will use what we compile now. `parent` is the
    trainer's PID as it said it: this process's parent may already be another when we get here, or a launcher
    between the two."""
    while True:
        try:
            os.kill(parent, 0)
        except ProcessLookupError:
            os._exit(3)
        except PermissionError:  # another user's process under that PID: ours (the trainer) is gone
            os._exit(3)
        time.sleep(1.0)


def main() -> int:
    parent = int(os.environ.get(PARENT_VARIABLE) or os.getppid())
    threading.Thread(target=_end_with, args=(parent,), daemon=True).start()
    # the scheduler's warning signals reach every process of the job step: the trainer acts on them; here they
    # would end a compile that the grace after the trainer's stop may still finish for the next hop
    for name in ("SIGUSR1", "SIGUSR2"):
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    start = time.monotonic()
    payload = torch.load(io.BytesIO(sys.stdin.buffer.read()), weights_only=False)
    cfg, device = validate(config_model(), payload["config"]), torch.device(payload["device"])
    cfg.train.compile_background = False  # compile here, in this process
    # the trainer's count, not one probed here (train.threads auto): Inductor keys its CPU code on the count, so
    # code compiled under another would be a cache miss in the trainer
    cfg.train.threads = int(payload.get("threads") or cfg.train.threads)
    env = ClusterEnv()  # one process, whatever the job's variables say
    task = make_task(cfg, env)
    setup = Setup(cfg, task, env)
    setup.device = device
    compiler = Compiler(cfg, task, env, device)  # no run folder: no helper of its own
    if device.type == "cuda":
        torch.cuda.set_device(device)
    seed_everything(cfg.run.seed)
    raw = task.build_modules()
    for name, module in raw.items():
        module.to(device)
        module.load_state_dict(payload["weights"][name])
    modules = setup.wrap(raw, compiler)
    optimizers, _ = setup.optimizers(raw)
    ctx = setup.context(modules, raw, optimizers, NonFiniteGuard(cfg.train))
    micro = [dataclasses.replace(m, data=task.to_device(m.data, device)) for m in payload["micro"]]
    for state in payload["states"]:
        task.load_state_dict(state)
        task.train_step(micro, ctx)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    compiled = [name for name, module in modules.items() if is_compiled(module)]
    print(
        json.dumps(
            {
                "compiled": compiled,
                "seconds": time.monotonic() - start,
                "threads": torch.get_num_threads(),
                **compile_stats(),
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
