"""The report page in a real browser: headless Chromium (Debian's package, installed by `make test` through
hpc/install-browser) loads it with the network cut off, every image must have loaded and be readable (no text
cut or overprinted, not shrunk), the tables must be there; a screenshot is saved next to the page."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image as PILImage

from tests.conftest import hpctrain
from tests.track.report_runs import fields_run

# Reads the page from a same-folder iframe once it has loaded (file:// pages may read each other with
# --allow-file-access-from-files) and writes what the browser rendered into <pre id="result">.
PROBE = """<!DOCTYPE html><html><body><pre id="result">not loaded</pre>
<iframe id="page" src="index.html" width="1200" height="900"></iframe>
<script>
document.getElementById("page").addEventListener("load", function () {
  var doc = this.contentDocument, out = {images: [], tables: {}};
  doc.querySelectorAll("img").forEach(function (img) {
    out.images.push({src: img.getAttribute("src"), complete: img.complete, width: img.naturalWidth,
                     shown: img.getBoundingClientRect().width});
  });
  out.unreadable = [];
  doc.querySelectorAll("figure[data-unreadable]").forEach(function (f) {
    out.unreadable.push(f.id + ": " + f.getAttribute("data-unreadable"));
  });
  doc.querySelectorAll("table").forEach(function (t) { out.tables[t.id] = t.rows.length; });
  document.getElementById("result").textContent = JSON.stringify(out);
});
</script></body></html>
"""


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.fail("chromium is missing: `make test` installs it with hpc/install-browser")
    return exe


def _browser(exe: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    offline = [
        "--proxy-server=127.0.0.1:9",  # nothing listens there: any http(s) request fails
        "--host-resolver-rules=MAP * ~NOTFOUND",
        "--proxy-bypass-list=<-loopback>",  # not even 127.0.0.1 bypasses that proxy
    ]
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", f"--user-data-dir={profile}"]
    return subprocess.run([*cmd, *offline, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("workload", ["muons", "fields"])
def test_the_report_renders_offline_in_chromium(tmp_path: Path, workload: str, request) -> None:
    exe = _chromium()
    out = tmp_path / "report"
    if workload == "muons":
        # `hpctrain report RUN --out OUT` of report_runs.muon_run, drawn once for tests/track (conftest.py); a
        # copy, as the probe and the screenshot go beside the page
        shutil.copytree(request.getfixturevalue("muon_report"), out)
    else:
        run = fields_run(tmp_path / "run")
        done = hpctrain("report", str(run), "--out", str(out), cwd=tmp_path)
        assert done.code == 0, done.err
    (out / "probe.html").write_text(PROBE)
    seen = _browser(
        exe,
        tmp_path / "profile",
        "--allow-file-access-from-files",
        "--virtual-time-budget=15000",
        "--dump-dom",
        (out / "probe.html").as_uri(),
    )
    found = re.search(r'<pre id="result">(.*?)</pre>', seen.stdout, re.S)
    assert found and found.group(1) != "not loaded", seen.stdout[-2000:] + seen.stderr[-2000:]
    rendered = json.loads(found.group(1))
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert sorted(i["src"] for i in rendered["images"]) == pngs and len(pngs) >= 4
    broken = [i["src"] for i in rendered["images"] if not (i["complete"] and i["width"] > 0)]
    assert not broken, f"images the browser could not show: {broken}"
    # readable as shown: no figure's text cut or overprinted (the report checks each figure as it saves it,
    # panels.text_problems), and none shrunk much below its own size in a 1200-pixel window
    assert rendered["unreadable"] == [], rendered["unreadable"]
    shrunk = [i["src"] for i in rendered["images"] if i["shown"] < 0.9 * i["width"]]
    assert not shrunk, f"images shown at under 90 % of their size: {shrunk}"
    assert rendered["tables"]["summary"] >= 6 and rendered["tables"]["hops"] == 3  # header + 2 hops
    assert len(rendered["tables"]) >= 3  # + the evaluation or the workload's (pivot) tables

    shot = out / "screenshot.png"
    _browser(exe, tmp_path / "profile", "--hide-scrollbars", "--window-size=1200,1600",
             f"--screenshot={shot}", (out / "index.html").as_uri())  # fmt: skip
    with PILImage.open(shot) as image:
        assert image.size == (1200, 1600)
        assert np.asarray(image.convert("L"), dtype=float).std() > 10  # not a blank page


def test_the_comparison_renders_offline_in_chromium(tmp_path: Path) -> None:
    exe = _chromium()
    logs = tmp_path / "logs"
    for name in ("lr1", "lr2", "lr3"):
        fields_run(logs / name)
    config = json.loads((logs / "lr2" / "config.yaml").read_text())
    (logs / "lr2" / "config.yaml").write_text(json.dumps({**config, "optim": {"lr": 2e-5}}))
    out = tmp_path / "compare"
    done = hpctrain("report", "--compare", str(logs), "--out", str(out), cwd=tmp_path)
    assert done.code == 0, done.err
    (out / "probe.html").write_text(PROBE)
    seen = _browser(
        exe,
        tmp_path / "profile",
        "--allow-file-access-from-files",
        "--virtual-time-budget=15000",
        "--dump-dom",
        (out / "probe.html").as_uri(),
    )
    found = re.search(r'<pre id="result">(.*?)</pre>', seen.stdout, re.S)
    assert found and found.group(1) != "not loaded", seen.stdout[-2000:] + seen.stderr[-2000:]
    rendered = json.loads(found.group(1))
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert sorted(i["src"] for i in rendered["images"]) == pngs and len(pngs) >= 5  # loss, R², RMSE, ..., LR
    broken = [i["src"] for i in rendered["images"] if not (i["complete"] and i["width"] > 0)]
    assert not broken, f"images the browser could not show: {broken}"
    assert rendered["tables"] == {"figures": 4, "config": 2}  # header + 3 runs; header + optim.lr

    shot = out / "screenshot.png"
    _browser(exe, tmp_path / "profile", "--hide-scrollbars", "--window-size=1200,1600",
             f"--screenshot={shot}", (out / "index.html").as_uri())  # fmt: skip
    with PILImage.open(shot) as image:
        assert image.size == (1200, 1600)
        assert np.asarray(image.convert("L"), dtype=float).std() > 10  # not a blank page
