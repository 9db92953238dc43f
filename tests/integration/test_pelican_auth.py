"""Pelican both ways on the real command line: the OIDC device login, token refresh during a run, a batch job
whose login expired, checkpoint and TensorBoard uploads with and without the token, a kill mid-upload, and a
chain that moves to an empty scratch through the federation. Loopback servers only (127.0.0.1)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpctrain.remote.mirror import CLAIM
from tests.conftest import FAULT_HOOK, clean_env
from tests.integration.oidc_issuer import Issuer
from tests.integration.pelican_server import Federation, Namespace
from tests.integration.test_pelican_training import muon_data  # noqa: F401 (a fixture)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
RUN = [
    "run.name=r",
    "train.eval_every=0",
    "logging.log_every=1",
    "data.n_train=512",
]


@dataclass
class Setup:
    fed: Federation
    issuer: Issuer
    root: Path  # what the federation serves
    tmp: Path
    env: dict[str, str]

    def uri(self, path: str) -> str:
        return f"{self.fed.url}{path}"

    @property
    def pel(self) -> list[str]:
        """Trust the test CA; scopes leave out /ns, as the issuer's do (data.pelican.storage_prefix)."""
        return [f"data.pelican.ca_file={self.fed.ca_file}", "data.pelican.storage_prefix=/ns"]

    def cache(self) -> Path:
        return self.tmp / "config" / "hpctrain" / "pelican-tokens.json"

    def secrets(self) -> list[str]:
        """Every token the issuer handed out (none may appear in any output)."""
        return [*self.issuer.access, *self.issuer.refresh, *self.issuer.clients.values()]


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    certs = tmp_path / "certs"
    issuer = Issuer(certs, interval=1, approve_after_polls=None)
    root = tmp_path / "served"
    (root / "ns").mkdir(parents=True)
    fed = Federation(root, certs, [Namespace("/ns", issuer=issuer, storage_prefix="/ns")])
    env = clean_env(XDG_CONFIG_HOME=str(tmp_path / "config"), PYTHONPATH=str(REPO / "src"))
    try:
        yield Setup(fed, issuer, root, tmp_path, env)
    finally:
        fed.close()
        issuer.close()


def cli(s: Setup, *args: str, timeout: float = 480, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpctrain", *args],
        cwd=s.tmp,
        env={**s.env, **extra},
        stdin=subprocess.DEVNULL,  # no terminal: a batch job's situation
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def login(s: Setup, uri: str, *extra: str) -> str:
    """`hpctrain auth login URI` with a scripted approval: the test reads the code it prints and approves it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpctrain", "auth", "login", uri, *s.pel, *extra],
        cwd=s.tmp,
        env=s.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(r"open (\S+) and enter the code (\S+)", line)
    assert match, line + proc.communicate(timeout=30)[1]
    assert match.group(1).startswith(s.issuer.url)
    deadline = time.time() + 120
    while "authorization_pending" not in s.issuer.log.answers and time.time() < deadline:
        time.sleep(0.05)  # the user takes a moment: the client is told authorization_pending meanwhile
    s.issuer.approve(match.group(2))
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return line + out + err


def no_secrets(s: Setup, *texts: str, folders: tuple[Path, ...] = ()) -> None:
    tokens = s.secrets()
    assert tokens
    for text in texts:
        for token in tokens:
            assert token not in text
    for folder in folders:
        for path in folder.rglob("*"):
            if path.is_file():
                data = path.read_bytes()
                assert not any(t.encode() in data for t in tokens), path


def remote_latest_is_complete(folder: Path) -> str:
    """The remote `latest` names a step file whose SHA-256 matches its sidecar; returns its name."""
    name = (folder / "latest").read_text().strip()
    sidecar = json.loads((folder / name).with_suffix(".json").read_text())
    digest = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    assert digest == next(v for k, v in sidecar.items() if "sha" in k), sidecar
    return name


def test_login_device_flow_caches_tokens_privately(setup: Setup) -> None:
    s = setup
    s.issuer.slow_down = 1  # the first poll is told to slow down
    out = login(s, s.uri("/ns/runs/"))
    assert s.issuer.log.grants == ["urn:ietf:params:oauth:grant-type:device_code"]
    assert s.issuer.log.answers[0] == "slow_down" and "authorization_pending" in s.issuer.log.answers
    # the scopes name the folder minus data.pelican.storage_prefix
    assert "storage.read:/runs storage.modify:/runs" in out
    cache = s.cache()
    assert cache.stat().st_mode & 0o777 == 0o600 and cache.parent.stat().st_mode & 0o777 == 0o700
    entry = json.loads(cache.read_text())["logins"][0]
    assert entry["oidc_url"] == s.issuer.url and entry["refresh_token"] in s.issuer.refresh
    no_secrets(s, out)
    shown = cli(s, "auth", "show", *s.pel)
    assert shown.returncode == 0 and "storage.modify:/runs" in shown.stdout
    no_secrets(s, shown.stdout, shown.stderr)


def test_run_uploads_checkpoints_and_tensorboard_with_a_refreshed_token(setup: Setup) -> None:
    s = setup
    login(s, s.uri("/ns/runs/"))
    s.issuer.access_ttl = 2  # tokens from now on live 2 s: the run must refresh them
    cache = json.loads(s.cache().read_text())
    cache["logins"][0]["expires_at"] = 0  # and the login's own token ran out: the first use refreshes
    s.cache().write_text(json.dumps(cache))
    done = cli(
        s,
        "train",
        *RUN,
        "train.total_updates=60",
        "checkpoint.every=20",
        f"run.out_dir={s.tmp / 'scratch'}",
        "data.pelican.auto_token=true",
        *s.pel,
        f"checkpoint.dir={s.uri('/ns/runs/r')}",
        f"checkpoint.mirror_to={s.uri('/ns/runs/copy')}",  # a second federation copy, uploaded too
        f"logging.tensorboard.dir={s.tmp / 'tb'}",
        "logging.tensorboard.run_name=tb1",
        f"logging.tensorboard.mirror_to={s.uri('/ns/runs/tb')}",
        "logging.tensorboard.mirror_every_seconds=1",
        # each save pauses 0.5 s: saves 40 and 60 alone outlast a token's fresh life (2/3 of 2 s)
        _HPCTRAIN_TEST_SAVE_PAUSE="0.5",
        PYTHONPATH=f"{FAULT_HOOK}{os.pathsep}{REPO / 'src'}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    remote = s.root / "ns" / "runs" / "r"
    assert remote_latest_is_complete(remote) == "step_00000060.pt"
    # no temporary left; the claim names the run whose checkpoints the folder holds
    assert [p.name for p in remote.iterdir() if p.name.startswith(".")] == [CLAIM], "a temporary was left"
    assert json.loads((remote / CLAIM).read_text())["run"] == "r"
    assert (
        remote_latest_is_complete(s.root / "ns" / "runs" / "copy" / "r" / "checkpoints") == "step_00000060.pt"
    )
    events = list((s.root / "ns" / "runs" / "tb" / "tb1").glob("events.out.tfevents.*"))
    local = list((s.tmp / "tb" / "tb1").glob("events.out.tfevents.*"))
    assert events and events[0].read_bytes() == local[0].read_bytes()
    assert s.issuer.log.grants.count("refresh_token") >= 2  # the first use, and again during the run
    puts = [r for r in s.fed.requests if r.method == "PUT"]
    assert puts and all(r.has_auth and r.status == 201 for r in puts)
    assert not [r for r in s.fed.requests if r.server == "director" and r.has_auth]  # the origin's only
    no_secrets(s, done.stdout, done.stderr, folders=(s.tmp / "scratch", s.tmp / "tb"))


def test_uploads_without_a_token_are_refused_and_reported(setup: Setup) -> None:
    s = setup
    done = cli(
        s,
        "train",
        *RUN,
        "train.total_updates=10",
        "checkpoint.every=5",
        f"run.out_dir={s.tmp / 'scratch'}",
        *s.pel,
        f"checkpoint.mirror_to={s.uri('/ns/runs/r')}",
        f"logging.tensorboard.dir={s.tmp / 'tb'}",
        f"logging.tensorboard.mirror_to={s.uri('/ns/runs/tb')}",
    )
    # the run itself is not lost: it finishes, the local checkpoints stand, the refusal is reported; but a copy
    # that never arrived is never called uploaded: the exit code, the last line and summary.json say it failed
    run = s.tmp / "scratch" / "r"
    assert done.returncode == 1, done.stderr[-3000:]
    assert (run / "checkpoints" / "step_00000010.pt").exists()
    assert "access denied (HTTP 403)" in done.stderr
    assert "Traceback" not in done.stderr
    assert "checkpoints uploaded" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and s.uri("/ns/runs/r") in errors[0] and "403" in errors[0], done.stderr[-2000:]
    failures = json.loads((run / "summary.json").read_text())["copy_failures"]
    copies = s.uri("/ns/runs/r") + "/r/checkpoints"  # <mirror_to>/<run name>/checkpoints
    assert list(failures) == [copies] and "403" in failures[copies]
    # the failure is said before the run's last line, never after it
    log = (run / "training.log").read_text()
    assert log.index("access denied (HTTP 403)") < log.index("finished at update 10/10")
    puts = [r for r in s.fed.requests if r.method == "PUT"]
    assert puts and all(r.status == 403 and not r.has_auth for r in puts)
    assert not (s.root / "ns" / "runs").exists() or not list((s.root / "ns" / "runs").rglob("*.pt"))


def test_batch_job_whose_login_expired_stops_with_the_hint(setup: Setup) -> None:
    s = setup
    login(s, s.uri("/ns/runs/"))
    s.issuer.expire_refresh_tokens()
    s.issuer.access.clear()
    cache = json.loads(s.cache().read_text())
    cache["logins"][0]["expires_at"] = 0  # the cached access token ran out too
    s.cache().write_text(json.dumps(cache))
    done = cli(
        s,
        "train",
        *RUN,
        "train.total_updates=5",
        f"run.out_dir={s.tmp / 'scratch'}",
        "data.pelican.auto_token=true",
        *s.pel,
        f"checkpoint.dir={s.uri('/ns/runs/r')}",
    )
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("error: the Pelican token cannot be refreshed (invalid_grant")
    assert f"hpctrain auth login {s.uri('/ns/runs/r')}` on a login node" in lines[0]
    assert not (s.tmp / "scratch" / "r" / "checkpoints").exists()  # nothing started
    # and without any login at all: the same hint
    s.cache().unlink()
    again = cli(s, "train", *RUN, f"run.out_dir={s.tmp / 'x'}", "data.pelican.auto_token=true", *s.pel,
                f"checkpoint.dir={s.uri('/ns/runs/r')}")  # fmt: skip
    assert again.returncode == 2 and "no cached Pelican login covers" in again.stderr
    assert "hpctrain auth login" in again.stderr
    # `hpctrain submit` logs in before it submits (here: no terminal, so the hint), nothing is queued
    sub = cli(s, "submit", "--local", *RUN, f"run.out_dir={s.tmp / 'y'}", "data.pelican.auto_token=true",
              *s.pel, f"checkpoint.dir={s.uri('/ns/runs/r')}")  # fmt: skip
    assert sub.returncode == 2 and "no cached Pelican login covers" in sub.stderr, sub.stderr[-2000:]
    assert not (s.tmp / "y").exists()


def test_kill_mid_upload_leaves_the_remote_latest_complete(setup: Setup) -> None:
    s = setup
    login(s, s.uri("/ns/runs/"))
    # The last checkpoint's upload hangs after its first 16 KiB from the start, so the kill lands in it however
    # loaded the machine (slowing uploads only once the first had arrived raced the run: it could be sending
    # the last one already). Each save pauses 1 s before its rename: the uploader takes step 20's `latest`
    # before step 40's replaces it (an upload not started yet gives way to a newer one).
    s.fed.faults.stall_puts.add(".step_00000040.pt.upload-")
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpctrain", "train", *RUN, "train.total_updates=40", "checkpoint.every=20",
         f"run.out_dir={s.tmp / 'scratch'}", "data.pelican.auto_token=true", *s.pel,
         f"checkpoint.dir={s.uri('/ns/runs/r')}"],
        cwd=s.tmp, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**s.env, "_HPCTRAIN_TEST_SAVE_PAUSE": "1", "PYTHONPATH": f"{FAULT_HOOK}{os.pathsep}{REPO / 'src'}"},
    )  # fmt: skip
    remote = s.root / "ns" / "runs" / "r"
    temps: list[Path] = []
    try:
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None and not temps:
            temps = [p for p in remote.glob(".step_00000040.pt.upload-*") if p.stat().st_size > 0]
            time.sleep(0.05)
        assert temps, f"no upload of the last checkpoint was seen: {proc.poll()=}"
        first = remote_latest_is_complete(remote)  # what the remote side says while the last upload hangs
        proc.kill()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
        s.fed.faults.stall_puts.clear()
    assert remote_latest_is_complete(remote) == first == "step_00000020.pt"
    assert not (remote / "step_00000040.pt").exists()  # the cut file is only a temporary
    # the same command again: the run is finished, but its last upload is redone, the dead temporary removed
    again = cli(s, "train", *RUN, "train.total_updates=40", "checkpoint.every=20",
                f"run.out_dir={s.tmp / 'scratch'}", "data.pelican.auto_token=true", *s.pel,
                f"checkpoint.dir={s.uri('/ns/runs/r')}")  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    assert remote_latest_is_complete(remote) == "step_00000040.pt"
    assert [p.name for p in remote.iterdir() if p.name.startswith(".")] == [CLAIM]  # no temporary


def test_a_slow_upload_never_holds_the_run_past_its_walltime(setup: Setup) -> None:
    """The run ends within budget.time_limit although its checkpoint uploads hang: the wait for the last upload
    stops 5 s before the deadline, and the remote folder has no `latest` (no upload completed)."""
    s = setup
    login(s, s.uri("/ns/runs/"))
    # Every checkpoint upload hangs after its first 16 KiB until released (after the run ended): the run's end
    # cannot wait for it, however fast or loaded the machine. 60 s of budget: the start (imports, token, claim,
    # build) took ~16 s at load 15 and can pass 30 s, and the warning must come before the deadline.
    limit = 60  # budget.time_limit below
    s.fed.faults.stall_puts.add(".pt.upload-")
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpctrain", "train", *RUN, "train.total_updates=40", "checkpoint.every=5",
         "budget.time_limit=0:01:00", "budget.margin_seconds=1", f"run.out_dir={s.tmp / 'scratch'}",
         "data.pelican.auto_token=true", *s.pel, f"checkpoint.dir={s.uri('/ns/runs/r')}"],
        cwd=s.tmp, env=s.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    said: list[tuple[float, str]] = []  # stderr's lines with the time each arrived (they carry none)
    reader = threading.Thread(target=lambda: said.extend((time.time(), line) for line in proc.stderr))
    reader.start()
    deadline = None
    try:
        # "deadline in N s (budget.time_limit=0:01:00)": where the deadline lies, seen live
        for line in proc.stdout:
            match = re.match(r"deadline in (-?\d+) s", line)
            if match:
                deadline = time.time() + int(match.group(1)) + 0.5  # N was rounded
        proc.wait(timeout=120)
        ended = time.time()
        reader.join(timeout=120)
    finally:
        proc.kill()
        s.fed.faults.stall_puts.clear()
    err = "".join(line for _, line in said)
    # 1: it finished, but its last upload was cut at the deadline, which it says (never "uploaded"); 75: a loaded
    # machine made the budget stop it first (its next hop uploads again)
    assert proc.returncode in (1, 75), err[-3000:]
    assert "checkpoints uploaded" not in err
    if proc.returncode == 1:
        assert "error: the checkpoints were not copied to" in err and "deadline" in err, err[-3000:]
    assert deadline is not None, err[-3000:]
    # What must hold on any machine: the wait for the hanging upload was given up BEFORE the walltime, and the
    # process ended while the upload still hung (not the walltime over again: its own exit, seconds at most).
    gave_up = [
        when for when, line in said if re.match(r"warning: .*did not finish before the deadline", line)
    ]
    assert gave_up, err[-3000:]
    assert gave_up[0] < deadline, gave_up[0] - deadline
    assert ended < deadline + limit, ended - deadline
    assert not (s.root / "ns" / "runs" / "r" / "latest").exists()


def test_a_checkpoint_dir_holding_another_runs_checkpoints_is_refused(setup: Setup) -> None:
    """A second run (another name: another learning rate) given the first's checkpoint.dir: one line, exit 2,
    before anything is uploaded; the first run's remote checkpoints stay as they were (its uploads would have
    replaced `latest` and pruned the other's step files)."""
    s = setup
    login(s, s.uri("/ns/runs/"))
    args = ["train.total_updates=10", "checkpoint.every=5", f"run.out_dir={s.tmp / 'scratch'}"]
    args += ["data.pelican.auto_token=true", *s.pel, f"checkpoint.dir={s.uri('/ns/runs/shared')}"]
    first = cli(s, "train", *RUN, *args)
    assert first.returncode == 0, first.stderr[-3000:]
    remote = s.root / "ns" / "runs" / "shared"
    before = {p.name: p.read_bytes() for p in remote.iterdir()}
    assert json.loads(before[CLAIM])["run"] == "r" and "step_00000010.pt" in before
    puts = len([r for r in s.fed.requests if r.method == "PUT"])
    second = cli(s, "train", *RUN, "run.name=other", "optim.lr=0.01", *args)
    assert second.returncode == 2, second.stderr[-3000:]
    errors = [line for line in second.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "holds the checkpoints of run 'r'" in errors[0], second.stderr[-3000:]
    assert {p.name: p.read_bytes() for p in remote.iterdir()} == before
    assert len([r for r in s.fed.requests if r.method == "PUT"]) == puts


def test_chain_moves_to_an_empty_scratch_through_the_federation(setup: Setup) -> None:
    """Hop 1 on scratch A is stopped by SIGTERM; hop 2 starts on an empty scratch B from the remote checkpoint
    and ends bit-identical to an uninterrupted run."""
    s = setup
    login(s, s.uri("/ns/runs/"))
    common = [*RUN, "train.total_updates=600", "checkpoint.every=0"]
    remote_args = ["data.pelican.auto_token=true", *s.pel, f"checkpoint.dir={s.uri('/ns/runs/chain')}"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpctrain", "train", *common, f"run.out_dir={s.tmp / 'A'}", *remote_args],
        cwd=s.tmp, env=s.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    # chain.json notes the hop's first update once it is done (progress lines come about once a second)
    chain = s.tmp / "A" / "r" / "chain.json"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if chain.exists() and "startup_seconds" in chain.read_text():
            proc.terminate()
            break
        time.sleep(0.01)
    out, err = proc.communicate(timeout=120)
    # stopped after its first of 600 updates (0: not stopped in time)
    assert proc.returncode == 75, err[-3000:]
    remote_latest_is_complete(s.root / "ns" / "runs" / "chain")
    # 600 updates each: the limit only guards against a hang (a loaded 2-core machine took over 120 s)
    hop2 = cli(s, "train", *common, f"run.out_dir={s.tmp / 'B'}", *remote_args, timeout=480)
    assert hop2.returncode == 0, hop2.stderr[-3000:]
    assert "resumed from" in hop2.stdout
    ref = cli(s, "train", *common, f"run.out_dir={s.tmp / 'C'}", timeout=480)
    assert ref.returncode == 0, ref.stderr[-3000:]
    sha = [p.stdout.strip().rsplit("params_sha256=", 1)[1] for p in (hop2, ref)]
    assert sha[0] == sha[1]
    assert remote_latest_is_complete(s.root / "ns" / "runs" / "chain") == "step_00000600.pt"
    no_secrets(s, out, err, hop2.stdout, hop2.stderr, folders=(s.tmp / "A", s.tmp / "B"))


def test_resume_from_a_remote_checkpoint_file(setup: Setup) -> None:
    """checkpoint.resume=pelican://.../step_X.pt: staged to scratch, hash checked, then used; a corrupt copy
    on the federation is refused in one line."""
    s = setup
    folder = s.root / "ns" / "runs" / "given"
    local = s.tmp / "seed"
    first = cli(s, "train", *RUN, "train.total_updates=10", f"run.out_dir={local}")
    assert first.returncode == 0, first.stderr[-2000:]
    folder.mkdir(parents=True)
    for name in ("step_00000010.pt", "step_00000010.json"):
        (folder / name).write_bytes((local / "r" / "checkpoints" / name).read_bytes())
    given = s.uri("/ns/runs/given/step_00000010.pt")
    args = [*RUN, "train.total_updates=12", *s.pel, f"data.staging.dir={s.tmp / 'stage'}"]
    done = cli(s, "train", *args, f"run.out_dir={s.tmp / 'D'}", f"checkpoint.resume={given}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "restored everything from" in done.stdout and "finished at update 12/12" in done.stdout
    data = bytearray((folder / "step_00000010.pt").read_bytes())
    data[-100] ^= 0xFF
    (folder / "step_00000010.pt").write_bytes(bytes(data))
    bad = cli(s, "train", *args, f"run.out_dir={s.tmp / 'E'}", f"checkpoint.resume={given}")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr[-2000:]
    assert bad.stderr.strip().splitlines()[-1].startswith("error: checkpoint.resume=")


def test_uploader_never_waits_past_its_deadline() -> None:
    """A stop gives the upload under way only the time left; the newest pending job replaces older ones."""
    import threading

    from hpctrain.remote.upload import Uploader

    ran: list[int] = []
    started, release = threading.Event(), threading.Event()

    def slow() -> None:  # an upload under way until the test releases it
        started.set()
        release.wait(120)
        ran.append(0)

    up = Uploader("test", retries=0)
    up.submit(slow)
    assert started.wait(60)
    for i in (1, 2, 3):
        up.submit(lambda i=i: ran.append(i))  # type: ignore[misc]
    assert up.close(timeout=0.2) is False  # gave up on the upload under way (it is still running)
    assert ran == []
    release.set()
    deadline = time.monotonic() + 60
    while len(ran) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ran == [0, 3]  # 1 and 2 were replaced before they started


def test_muon_training_reads_a_protected_namespace_with_the_login(setup: Setup, muon_data: Path) -> None:  # noqa: F811
    """Inputs staged with the OIDC token (refreshed: the cached one ran out), read scope only where read."""
    s = setup
    shutil.copytree(muon_data, s.root / "ns" / "muons")
    s.fed.namespaces[0].require_token = True
    (s.tmp / "stage").mkdir()
    login(s, s.uri("/ns/"))
    cache = json.loads(s.cache().read_text())
    cache["logins"][0]["expires_at"] = 0
    s.cache().write_text(json.dumps(cache))
    done = cli(
        s,
        "train",
        "model.type=muon_multiplicity",
        f"data.paths=[{s.uri('/ns/muons/*.parquet')}]",
        f"data.staging.dir={s.tmp / 'stage'}",
        "data.batch_size=64",
        "train.total_updates=4",
        "train.eval_every=0",
        f"run.out_dir={s.tmp / 'runs'}",
        "run.name=m",
        "data.pelican.auto_token=true",
        *s.pel,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "finished at update 4/4" in done.stdout
    reads = [r for r in s.fed.requests if r.server.startswith("cache") and r.method in ("GET", "HEAD")]
    assert reads and all(r.has_auth and r.status in (200, 206) for r in reads)
    assert "refresh_token" in s.issuer.log.grants
    no_secrets(s, done.stdout, done.stderr, folders=(s.tmp / "runs",))
