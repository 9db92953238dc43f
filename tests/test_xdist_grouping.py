"""`make test`'s scheduling, checked through a real pytest-xdist run: every test under tests/integration/ runs on
one worker (they share one SLURM cluster whose job ids make MASTER_PORT), the others spread a module at a time
(a module's fixtures made once), the documentation commands first."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, clean_env

_RECORD = """
import json, os, time
from pathlib import Path


def record(name: str, pause: float) -> None:
    started = time.time()
    time.sleep(pause)
    out = Path(os.environ["GROUPING_OUT"]) / f"{name}.json"
    out.write_text(json.dumps({"test": name, "worker": os.environ["PYTEST_XDIST_WORKER"], "started": started}))
"""


def _tree(root: Path) -> None:
    (root / "tests" / "integration").mkdir(parents=True)
    (root / "tests" / "__init__.py").write_text("")
    (root / "tests" / "integration" / "__init__.py").write_text("")
    (root / "tests" / "record.py").write_text(_RECORD)
    # The suite's own hook, not a copy of it.
    (root / "tests" / "conftest.py").write_text(
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('xdist_groups', {str(ROOT / 'tests' / 'xdist_groups.py')!r})\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "pytest_xdist_make_scheduler = module.pytest_xdist_make_scheduler\n"
    )
    (root / "pytest.ini").write_text("[pytest]\n")
    for f in range(3):
        tests = "\n".join(f"def test_i{f}_{t}():\n    record('i{f}_{t}', 0.4)\n" for t in range(2))
        (root / "tests" / "integration" / f"test_svc{f}.py").write_text(
            f"from tests.record import record\n\n{tests}"
        )
    for m in range(3):
        tests = "\n".join(f"def test_u{m}_{t}():\n    record('u{m}_{t}', 0.2)\n" for t in range(3))
        (root / "tests" / f"test_unit{m}.py").write_text(f"from tests.record import record\n\n{tests}")
    (root / "tests" / "docs").mkdir()
    (root / "tests" / "docs" / "__init__.py").write_text("")
    tests = "\n".join(f"def test_d{t}():\n    record('d{t}', 0.2)\n" for t in range(2))
    (root / "tests" / "docs" / "test_docs_commands.py").write_text(
        f"from tests.record import record\n\n{tests}"
    )


def test_integration_tests_share_one_worker_and_the_rest_spread(tmp_path: Path) -> None:
    root, out = tmp_path / "proj", tmp_path / "out"
    _tree(root)
    out.mkdir()
    env = clean_env(GROUPING_OUT=str(out), PYTHONPATH="")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider", "-q"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    runs = [json.loads(p.read_text()) for p in out.glob("*.json")]
    assert len(runs) == 17, runs
    integration = {r["worker"] for r in runs if r["test"].startswith("i")}
    assert len(integration) == 1, runs
    # The unit tests are not held to the integration worker: the other worker ran some of them.
    other = {r["worker"] for r in runs if r["test"][0] in "ud"} - integration
    assert other, runs
    for m in range(3):  # a module's tests on one worker (its module-scoped fixtures made there only)
        assert len({r["worker"] for r in runs if r["test"].startswith(f"u{m}_")}) == 1, runs
    # the documentation commands went out before any module: the other worker began with them
    (worker,) = other
    first = min((r for r in runs if r["worker"] == worker), key=lambda r: r["started"])
    assert first["test"].startswith("d"), runs
