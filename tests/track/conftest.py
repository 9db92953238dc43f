"""One muon run folder and its report page for the report tests: drawing the muon page is the slow part of them
(some forty figures), and several tests check the same page for different things."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import hpctrain
from tests.track.report_runs import muon_run


@pytest.fixture(scope="session")
def muon_run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """report_runs.muon_run, made once: read it, or copy it before changing it."""
    return muon_run(tmp_path_factory.mktemp("muon_run") / "run")


@pytest.fixture(scope="session")
def muon_report(muon_run_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder `hpctrain report RUN --out OUT` wrote for that run, drawn once: read it, or copy it before
    adding to it."""
    out = tmp_path_factory.mktemp("muon_report") / "report"
    # some forty figures: 20 s on 2 idle cores, over 3 minutes on a loaded machine (load 13)
    done = hpctrain("report", str(muon_run_folder), "--out", str(out), cwd=out.parent, timeout=600)
    assert done.code == 0, done.err
    return out
