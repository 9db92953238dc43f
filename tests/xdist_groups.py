"""`make test`'s scheduling (pytest-xdist, --dist loadgroup), as a hook that tests/conftest.py imports.

Kept in a module of its own, importing nothing of the suite's, so that tests/test_xdist_grouping.py can load
this very hook into a throwaway test tree and check it through a real xdist run.
"""

from __future__ import annotations

from typing import Any

import pytest

INTEGRATION_PREFIX = "tests/integration/"
# Modules whose tests share nothing costly and each run for minutes (every page's commands): each test is a
# unit of its own, handed out first, so that the worker beside the integration tests starts on them.
SPREAD = frozenset({"tests/docs/test_docs_commands.py"})
# Modules that share a session fixture (the WGAN of tests/workloads/muons/conftest.py, trained once): one unit,
# so that it is trained on one worker only.
SHARED = {
    "tests/workloads/muons/test_model_run.py": "trained_wgan",
    "tests/workloads/muons/test_evaluate_heldout.py": "trained_wgan",
    "tests/workloads/muons/test_sampling_stream.py": "trained_wgan",
}


def scope_of(nodeid: str) -> str:
    """The unit of work a test belongs to: the integration tests together, a SPREAD module's tests one by one,
    any other module whole (its module-scoped fixtures are then made once, not on every worker)."""
    if nodeid.startswith(INTEGRATION_PREFIX):
        return "integration"
    module = nodeid.split("::", 1)[0]
    if module in SPREAD:
        return nodeid
    return SHARED.get(module, module)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`make test` runs the suite on pytest-xdist workers (--dist loadgroup; one more than the cores): the tests
    under tests/integration/ share one worker, in order, as they share machines' worth of services (one SLURM
    cluster for the session, its job ids in MASTER_PORT) and mostly wait on them; the other tests spread over the
    workers, a module at a time, so the waits overlap with the CPU-bound tests. The group is decided here, from
    the test's path, not by xdist_group marks: with pytest 9.2 xdist 3.8 silently dropped the marks' groups, each
    worker started its own cluster, both numbering jobs from 1, and two jobs with one id met at one MASTER_PORT
    (CI's rare start-time gloo failures; tests/test_xdist_grouping.py checks the grouping through a real xdist
    run). Units go out largest first: the integration tests, the SPREAD tests, then modules by their number of
    tests (xdist's order)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class PathGroups(LoadScopeScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            if not self.ordered:  # the first hand-out: the queue is complete, in xdist's order
                self.ordered = True
                first = [s for s in self.workqueue if s == "integration" or s.split("::", 1)[0] in SPREAD]
                for scope in reversed(first):
                    self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return PathGroups(config, log)
