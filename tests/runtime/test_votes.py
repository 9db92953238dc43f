"""Votes (runtime/dist.py): each field carries its reduction, all agreed in one call; the stop reasons (Stop,
runtime/budget.py) are what the run's files keep and rank as the vote needs."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

from hpctrain.runtime.budget import VOTED, Stop
from hpctrain.runtime.dist import EARLIEST, MAX, Votes, vote
from hpctrain.train.cadence import STOP
from tests.conftest import clean_env, free_port


def test_a_stop_is_the_string_the_files_keep() -> None:
    assert json.dumps({"reason": Stop.TIME_BUDGET}) == '{"reason": "time_budget"}'
    assert f"stopped ({Stop.DATA_ERROR})" == "stopped (data_error)" and str(Stop.HANG) == "hang"
    assert Stop("early_stop") is Stop.EARLY_STOP and Stop.SIGNAL in {"signal"} and "signal" in {Stop.SIGNAL}


def test_early_stop_outranks_a_resumable_stop_and_a_data_error_all() -> None:
    ranks = [Stop.rank(s) for s in (Stop.DATA_ERROR, Stop.EARLY_STOP, Stop.SIGNAL, Stop.TIME_BUDGET, None)]
    assert ranks == sorted(ranks, reverse=True) and len(set(ranks)) == 5
    assert [STOP.decode(STOP.encode(s)) for s in (*VOTED, None)] == [*VOTED, None]


def test_the_earliest_update_and_none_survive_their_float_form() -> None:
    assert [EARLIEST.decode(EARLIEST.encode(u)) for u in (None, 0, 7, 2**52)] == [None, 0, 7, 2**52]
    assert EARLIEST.op == "min" and EARLIEST.encode(None) > EARLIEST.encode(2**52)


@dataclass
class Pair(Votes):
    stop: Stop | None = vote(STOP, None)
    slowest: float = vote(MAX, 0.0)


def test_at_world_size_one_the_votes_are_the_outcome() -> None:
    votes = Pair(Stop.SIGNAL, 0.5)
    assert votes.agree() is votes


RANK = textwrap.dedent(
    """
    import dataclasses, json, sys
    import torch
    from hpctrain.runtime import dist
    from hpctrain.runtime.budget import Stop
    from hpctrain.runtime.dist import ANY, EARLIEST, MAX, MIN, SUM, Votes, vote
    from hpctrain.runtime.env import ClusterEnv
    from hpctrain.train.cadence import STOP

    @dataclasses.dataclass
    class Mixed(Votes):
        flag: bool = vote(ANY, False)
        slowest: float = vote(MAX, 0.0)
        fastest: float = vote(MIN, 0.0)
        total: float = vote(SUM, 0.0)
        first: int | None = vote(EARLIEST, None)
        none_found: int | None = vote(EARLIEST, None)
        stop: Stop | None = vote(STOP, None)

    env = ClusterEnv.from_environ()
    dist.init(env, "gloo", torch.device("cpu"), 60)
    r = env.rank
    mine = Mixed(r == 1, 1.0 + r, 1.0 + r, 1.5 * (r + 1), 9 - 2 * r, None, (Stop.EARLY_STOP, Stop.TIME_BUDGET)[r])
    agreed = mine.agree()
    print(json.dumps({**dataclasses.asdict(agreed), "collective": dist.Collectives.last}), flush=True)
    dist.teardown()
    dist.end_process(0)
    """
)


def test_two_gloo_ranks_agree_each_field_by_its_own_reduction(tmp_path: Path) -> None:
    port = str(free_port())
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", RANK],
            env=clean_env(RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port),
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in (0, 1)
    ]
    outs = [proc.communicate(timeout=180) for proc in ranks]
    assert [proc.returncode for proc in ranks] == [0, 0], outs
    said = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert (
        said[0]
        == said[1]
        == {
            "flag": True,  # rank 1's
            "slowest": 2.0,
            "fastest": 1.0,
            "total": 4.5,
            "first": 7,  # rank 1's, the earlier
            "none_found": None,
            "stop": "early_stop",  # outranks rank 1's time_budget
            "collective": "Mixed vote",
        }
    )
