"""`make test`'s scheduling (pytest-xdist, --dist loadgroup), as a hook that tests/conftest.py imports.

Kept in a module of its own, importing nothing of the suite's, so that tests/test_xdist_grouping.py can load
this very hook into a throwaway test tree and check it through a real xdist run.
"""

from __future__ import annotations

from typing import Any

import pytest

INTEGRATION_PREFIX = "tests/integration/"


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`make test` runs the suite on 2 pytest-xdist workers (--dist loadgroup): the tests under
    tests/integration/ share one worker, in order, as they share machines' worth of services (one SLURM cluster
    for the session, its job ids in MASTER_PORT) and mostly wait on them; the other tests spread over both
    workers, so the waits overlap with the CPU-bound tests. The group is decided here, from the test's path,
    not by xdist_group marks: with pytest 9.2 xdist 3.8 silently dropped the marks' groups, each worker started
    its own cluster, both numbering jobs from 1, and two jobs with one id met at one MASTER_PORT (CI's rare
    start-time gloo failures; tests/test_xdist_grouping.py checks the grouping through a real xdist run)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class PathGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "integration" if nodeid.startswith(INTEGRATION_PREFIX) else nodeid

    return PathGroups(config, log)
