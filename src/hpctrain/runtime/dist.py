"""Process-group set-up and the few collectives the trainer needs. At world size 1 they do nothing.

Every decision that changes control flow (stop now, early stop) is a field of a `Votes` dataclass, agreed in one
collective so that all ranks take it together: a decision on one rank followed by a collective on the others is a
deadlock. Each field carries its reduction (`vote(ANY, False)`); nobody indexes a reduced tensor by position.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import datetime
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, NoReturn, TypeVar

import torch
import torch.distributed as torch_dist

from hpctrain.errors import RunError
from hpctrain.runtime.env import ClusterEnv
from hpctrain.runtime.slurm import expand_hostnames, node_address


def master_port(job_id: str | None) -> int:
    """The rendezvous port a job derives from its id (slurm/common.sh has the same formula): 12000-31999, below
    Linux's ephemeral ports (32768+), where any outgoing connection may hold it."""
    job = int(job_id) if job_id and job_id.isdigit() else 0
    return 12000 + job % 20000


def _rendezvous(env: ClusterEnv) -> None:
    """MASTER_ADDR/PORT from the environment, else derived from the SLURM node list and job id."""
    if not os.environ.get("MASTER_ADDR"):
        head = expand_hostnames(env.node_list)[0] if env.node_list else "127.0.0.1"
        os.environ["MASTER_ADDR"] = node_address(head)
    if not os.environ.get("MASTER_PORT"):
        os.environ["MASTER_PORT"] = str(master_port(env.job_id))
    os.environ.setdefault("RANK", str(env.rank))
    os.environ.setdefault("WORLD_SIZE", str(env.world_size))


def init(env: ClusterEnv, backend: str, device: torch.device, timeout_seconds: float) -> None:
    """Join the process group (no-op at world size 1)."""
    if not env.distributed or torch_dist.is_initialized():
        return
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    _rendezvous(env)
    kwargs: dict[str, Any] = {}
    if device.type == "cuda":
        kwargs["device_id"] = device
    timeout = datetime.timedelta(seconds=timeout_seconds)
    try:
        # What init_method="env://" does (torchrun's agent store included), plus a namespace of this job's own.
        store, _, _ = next(torch_dist.rendezvous("env://", env.rank, env.world_size, timeout=timeout))
        store.set_timeout(timeout)
        torch_dist.init_process_group(
            backend=backend,
            store=torch_dist.PrefixStore(store_namespace(env), store),
            rank=env.rank,
            world_size=env.world_size,
            timeout=timeout,
            **kwargs,
        )
    except RuntimeError as exc:  # torch's DistError, and gloo's failed handshake (a plain RuntimeError)
        raise RunError(_join_failure(env, exc)) from exc
    global _active, _joined
    _active = torch_dist.get_world_size() > 1
    _joined = True


def store_namespace(env: ClusterEnv) -> str:
    """The prefix of every key this job writes in the rendezvous store. Two jobs on one node can meet at one
    MASTER_PORT (job ids 20000 apart, or another user's torchrun on 29500 = 12000 + 17500): the second job's
    rank 0 cannot listen and ends (one line, `_join_failure`), but its other ranks reach the first job's store.
    Without a namespace they write its keys (its "rank 1" twice), and the first job, innocent, fails mid-run
    ("Connection reset by peer", gloo's connect timeouts: CI saw both when its two test clusters both numbered
    jobs from 1). With one they wait for their own rank 0 and time out; the first job never sees them."""
    restart = f".{env.restart_count}" if env.restart_count else ""
    return f"hpctrain/{env.job_id or 'local'}{restart}"


def _join_failure(env: ClusterEnv, exc: Exception) -> str:
    """One line for a rendezvous that failed (a port held on the node, a peer that died or never came): which
    rank, where, and torch's own first line without its C++ frames. Exit 1: the next hop (another job id, so
    another port) may well succeed."""
    where = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    reason = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
    if "EADDRINUSE" in reason:
        return (
            f"rank {env.rank} cannot listen on the rendezvous port {where}: another process on this node holds it "
            f"(MASTER_PORT: 12000 + the job id mod 20000 in a SLURM job, so the next job's differs; else the "
            f"launcher's): {reason}"
        )
    return f"rank {env.rank}/{env.world_size} could not join the process group at {where}: {reason}"


def joined() -> bool:
    """Whether this process joined a process group (it stays joined for the process's life: see end_process)."""
    return _joined


def end_process(code: int) -> NoReturn:
    """End a process that joined a process group the way a normal exit does (its non-daemon threads joined, its
    exit handlers run, its output flushed), minus the interpreter's finalization. DDP keeps the gloo group alive
    to the end of the process (torch 2.13 never frees it: destroy_process_group leaves its threads running), and
    a gloo worker thread releases the last collective's work (teardown's barrier) after the caller has moved on;
    that release takes the GIL (the work's thread-local state holds a Python object). If finalization has begun
    by then, Python 3.11 ends the thread inside a noexcept destructor: "terminate called without an active
    exception", exit 134, a job that trained every step reported FAILED (a core dump's stacks: the worker in
    AsyncBarrierWork::~AsyncBarrierWork -> take_gil -> pthread_exit, the main thread in Py_FinalizeEx; about
    one 4-rank start in 50 under load). Nothing is left to free: the process ends here. Callers: the CLI's
    `main`, and under submitit launch/submitit_launcher.py."""
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe or stream: nothing more can be said
            stream.flush()
    os._exit(code)


def teardown(clean: bool = True) -> None:
    """Leave the process group. After a clean end every rank first waits for the others: rank 0 may still be
    writing the final checkpoint, and a rank that destroys its group and exits while peers are in another phase
    can abort in gloo's threads ("terminate called without an active exception", seen on a 2-node job; the exit
    itself: end_process). After an error nobody waits: the peers may be gone."""
    global _active
    was_active, _active = _active, False
    if not torch_dist.is_initialized():
        return
    try:
        if clean and was_active:
            Collectives.enter("teardown barrier")
            torch_dist.barrier()
            Collectives.leave()
    finally:
        torch_dist.destroy_process_group()


_active = False  # cached: asked several times per update
_joined = False


class Collectives:
    """This process's record of the collectives it entered through this module (the hang watchdog reads it from
    its thread: train/watchdog.py). A few assignments per collective, none at world size 1."""

    entered = 0  # how many it entered
    left = 0  # how many it came out of
    last = ""  # the name of the last one entered
    since = 0.0  # when it entered that one (time.monotonic)

    @classmethod
    def enter(cls, name: str) -> None:
        cls.entered += 1
        cls.last, cls.since = name, time.monotonic()

    @classmethod
    def leave(cls) -> None:
        cls.left = cls.entered


def active() -> bool:
    return _active


def _device() -> torch.device:
    if torch_dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@dataclass(frozen=True)
class Reduction:
    """How the ranks combine one vote field: `op` over the field's float form (`encode`), read back by `decode`."""

    op: Literal["max", "min", "sum"]
    encode: Callable[[Any], float] = float
    decode: Callable[[float], Any] = float


ANY = Reduction("max", float, bool)  # a flag set on any rank is set on all
MAX = Reduction("max")
MIN = Reduction("min")
SUM = Reduction("sum")
_INF = float("inf")
# The earliest update any rank names (None: no rank names one): e.g. the first non-finite loss.
EARLIEST = Reduction(
    "min", lambda u: _INF if u is None else float(u), lambda v: None if v == _INF else int(v)
)

T = TypeVar("T")


def vote(how: Reduction, default: T) -> T:
    """A field of a Votes dataclass, agreed as `how` says."""
    return dataclasses.field(default=default, metadata={"reduce": how})


V = TypeVar("V", bound="Votes")


@dataclass
class Votes:
    """What every rank says at one decision point; `agree()` returns what all ranks agree on, every field reduced
    as its `vote(...)` says, in one collective (a second only when both sums and maxima/minima are voted)."""

    def agree(self: V) -> V:
        if not active():  # one process: its votes are the outcome
            return self
        fields = dataclasses.fields(self)
        hows: list[Reduction] = [f.metadata["reduce"] for f in fields]
        values = [how.encode(getattr(self, f.name)) for f, how in zip(fields, hows, strict=True)]
        agreed = _reduce(values, [how.op for how in hows], type(self).__name__)
        return type(self)(**{f.name: how.decode(a) for f, how, a in zip(fields, hows, agreed, strict=True)})


def _reduce(values: list[float], ops: list[str], name: str) -> list[float]:
    """Each value reduced over ranks by its op: maxima and minima (negated) in one max-reduction, sums in one
    sum-reduction."""
    Collectives.enter(f"{name} vote")
    sign = [-1.0 if op == "min" else 1.0 for op in ops]
    extreme = [i for i, op in enumerate(ops) if op != "sum"]
    summed = [i for i, op in enumerate(ops) if op == "sum"]
    agreed = list(values)
    for at, op in ((extreme, torch_dist.ReduceOp.MAX), (summed, torch_dist.ReduceOp.SUM)):
        if at:
            tensor = torch.tensor([sign[i] * values[i] for i in at], dtype=torch.float64, device=_device())
            torch_dist.all_reduce(tensor, op=op)
            for i, value in zip(at, tensor.tolist(), strict=True):  # (on CUDA this waits for the all-reduce)
                agreed[i] = sign[i] * value
    Collectives.leave()
    return agreed


@dataclass
class _Any(Votes):
    flag: bool = vote(ANY, False)


def any_rank(flag: bool) -> bool:
    """Whether `flag` is set on any rank (one collective; `flag` itself at world size 1)."""
    return _Any(flag).agree().flag if active() else flag


def sum_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Sum each tensor over ranks (one collective for all of them)."""
    if not active() or not tensors:
        return tensors
    Collectives.enter("sum_tensors")
    keys = sorted(tensors)
    flat = torch.stack([tensors[k].detach().double().reshape(()) for k in keys]).to(_device())
    torch_dist.all_reduce(flat, op=torch_dist.ReduceOp.SUM)
    summed = {k: flat[i].cpu() for i, k in enumerate(keys)}
    Collectives.leave()
    return summed


def barrier() -> None:
    if active():
        Collectives.enter("barrier")
        torch_dist.barrier()
        Collectives.leave()


def gather_objects(obj: T, what: str = "objects") -> list[T]:
    """Every rank's `obj` (each rank gives one of the same type) in rank order, on every rank (one collective;
    [obj] at world size 1)."""
    if not active():
        return [obj]
    Collectives.enter(f"all_gather_object ({what})")
    every: list[Any] = [None] * torch_dist.get_world_size()
    torch_dist.all_gather_object(every, obj)
    Collectives.leave()
    return every


def broadcast_object(obj: object, src: int = 0) -> object:
    if not active():
        return obj
    Collectives.enter("broadcast_object")
    holder = [obj]
    torch_dist.broadcast_object_list(holder, src=src)
    Collectives.leave()
    return holder[0]
