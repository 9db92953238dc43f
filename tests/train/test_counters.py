"""Counters: the counters a checkpoint carries, and what a resume makes of them."""

from __future__ import annotations

from hpctrain.train.counters import Counters


def test_counters_round_trip_and_a_resume_remembers_where_it_started() -> None:
    saved = Counters(step=40, samples=1280, total_updates=100, best=0.25, evals_without_improvement=2)
    counters = saved.state_dict()
    assert counters == {
        "step": 40,
        "samples": 1280,
        "total_updates": 100,
        "finished": False,
        "best": 0.25,
        "evals_without_improvement": 2,
    }
    resumed = Counters(total_updates=200)  # this hop asks for more updates
    resumed.load_state_dict(counters)
    assert (resumed.step, resumed.samples, resumed.best, resumed.evals_without_improvement) == (
        40,
        1280,
        0.25,
        2,
    )
    assert resumed.total_updates == 200 and resumed.resumed_step == 40 and resumed.finished_total == 0


def test_a_finished_run_and_counters_of_an_older_version() -> None:
    state = Counters()
    # An older hpctrain also wrote the world size (now read from the per-rank RNG states) and no patience count.
    state.load_state_dict({"step": 10, "samples": 80, "total_updates": 10, "finished": True, "world_size": 2})
    assert state.finished and state.finished_total == 10 and state.best is None
    assert state.evals_without_improvement == 0
