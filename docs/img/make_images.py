"""Make the pictures in docs/ from the current default models, as the README's commands make them.

    python docs/img/make_images.py [--muons-run RUN] [--fields-run RUN] [--out docs/img]

Without a run folder it runs the commands itself in a temporary folder: README.md's quick start (the default
muon model, `configs/muons_quick.yaml`: data, training, evaluation, report; about 5 minutes on 2 cores) and
docs/tracking.md's fields report (`configs/fields.yaml`, shortened to 200 updates). From each run's report it
takes the page as headless Chromium draws it (1100 x 1500, offline) and the muon quality figures. `images.json`
beside the pictures says where each came from (the run's model.type and config, the commit, the date):
tests/docs/test_docs_images.py checks that the muon pictures show the model configs/muons.yaml trains, and the
README's docs test runs this script on its own quick-start run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
# picture -> the file of a run folder it is copied from ("<page>" is the report page drawn by Chromium)
MUONS = {
    "report_muons.png": "<page>",
    "muons_quality_overview.png": "report/quality_overview.png",
    "muons_quality_bins_energy.png": "report/quality_bins_energy.png",
}
FIELDS = {"report_fields.png": "<page>"}
QUICK_START = [
    "hpctrain data generate --kind muons --out data/muons/train --files 1 --events-per-file 10000 --seed 1",
    "hpctrain data generate --kind muons --out data/muons/val --files 1 --events-per-file 2000 --seed 2",
    "hpctrain train --config configs/muons_quick.yaml",
    "hpctrain evaluate logs/muons_quick",
    "hpctrain report logs/muons_quick",
]
FIELDS_RUN = [
    "hpctrain train --config configs/fields.yaml train.total_updates=200 train.eval_every=100",
    "hpctrain evaluate logs/fields",
    "hpctrain report logs/fields",
]


def _fail(message: str) -> None:
    """One line on stderr and exit 2, as every hpctrain command does for a mistake."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def _run(lines: list[str], where: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPCTRAIN_", "SLURM_"))}
    env.pop("TOTAL_UPDATES", None)
    env.update(MPLBACKEND="Agg", PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}")
    for line in lines:
        print(f"$ {line}", flush=True)
        done = subprocess.run(["bash", "-c", line], cwd=where, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            _fail(f"{line}: exit {done.returncode}\n{done.stderr[-2000:]}")


def _page(run: Path, picture: Path) -> None:
    """The run's report page as headless Chromium draws it, with the network cut off."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        _fail("chromium is missing: `hpc/install-browser` (as root) installs it")
    page = run / "report" / "index.html"
    with tempfile.TemporaryDirectory(prefix="hpctrain-chromium-") as profile:
        cmd = [
            exe,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            "--proxy-server=127.0.0.1:9",
            "--host-resolver-rules=MAP * ~NOTFOUND",
            "--window-size=1100,1500",
            f"--screenshot={picture}",
            page.absolute().as_uri(),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if not picture.is_file():
        _fail(f"chromium drew no {picture.name} from {page}: {done.stderr[-500:]}")


def _take(run: Path, pictures: dict[str, str], out: Path) -> dict[str, dict[str, str]]:
    missing = [name for name in ("config.yaml", "report/index.html") if not (run / name).is_file()]
    if missing:
        _fail(f"{run}: no {missing[0]} (a trained, evaluated and reported run folder is needed)")
    config = yaml.safe_load((run / "config.yaml").read_text())
    where: dict[str, dict[str, str]] = {}
    for name, source in pictures.items():
        if source == "<page>":
            _page(run, out / name)
        else:
            shutil.copyfile(run / source, out / name)
        where[name] = {"model_type": config["model"]["type"], "run": run.name, "from": source}
    return where


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--muons-run", type=Path, help="a finished, evaluated and reported quick-start run")
    parser.add_argument("--fields-run", type=Path, help="a finished, evaluated and reported fields run")
    parser.add_argument("--no-fields", action="store_true", help="leave the fields page out")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "img")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    listed = args.out / "images.json"
    made = json.loads(listed.read_text())["images"] if listed.is_file() else {}
    with tempfile.TemporaryDirectory(prefix="hpctrain-images-") as tmp:
        work = Path(tmp)
        shutil.copytree(REPO / "configs", work / "configs")
        muons = args.muons_run
        if muons is None:
            _run(QUICK_START, work)
            muons = work / "logs" / "muons_quick"
        made.update(_take(muons, MUONS, args.out))
        if not args.no_fields:
            fields = args.fields_run
            if fields is None:
                _run(FIELDS_RUN, work)
                fields = work / "logs" / "fields"
            made.update(_take(fields, FIELDS, args.out))
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    for entry in made.values():
        entry.setdefault("made", when)
    stamp = {"commit": _commit(), "made": when, "images": made}
    listed.write_text(json.dumps(stamp, indent=1) + "\n")
    print(f"{len(made)} pictures in {args.out} (images.json says where each came from)")


if __name__ == "__main__":
    main()
