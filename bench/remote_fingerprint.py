"""The cost of remote files' content evidence (workloads/muons/events/remote_index.py) on many files.

    python bench/remote_fingerprint.py [--files 1000] [--repeat 3]

Serves `--files` copies of a small muon Parquet file from the loopback Pelican federation of the tests (one
folder, HTTPS on 127.0.0.1) and times the remote index as a run builds it, each `--repeat` times (interleaved,
best kept: the machine is shared):
- bare: the first index without content evidence, as before it existed (a HEAD and a footer GET per file): the
  baseline;
- first: the first index of a run (the same, plus the folder's listing and five 4 KiB sample GETs per file);
- resume: a resumed run's index (its run folder's cache checked against one listing of the folder, nothing read);
- touched: a resume after every file got a new modification time (each file indexed and sampled again).
Requests are counted at the server. On a real federation each request costs a round trip to a cache or an
origin instead of ~1 ms on loopback: the counts carry over, the times do not.

The last line printed is one JSON object: files, the seconds of each, requests per file of each, and
first_ratio (bare over first: what the evidence costs a first start, higher is better) and resume_ratio (first
over resume: what a resume saves against indexing again).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hpctrain.data.stream.staged import StagingSpec
from hpctrain.workloads.muons.events import remote_index as ri
from tests.integration.pelican_fixtures import pelican_federation
from tests.workloads.muons.conftest import write_set


def timed(fed: object, run: object) -> tuple[float, int]:
    before = len(fed.fed.requests)  # type: ignore[attr-defined]
    start = time.perf_counter()
    run()  # type: ignore[operator]
    return time.perf_counter() - start, len(fed.fed.requests) - before  # type: ignore[attr-defined]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="hpctrain-bench-rfp-") as tmp,
        pelican_federation(Path(tmp), n_files=0) as fed,
    ):
        folder = fed.root / "ns" / "many"
        one = write_set(Path(tmp) / "src", files=1, events=200, seed=1)[0]
        folder.mkdir(parents=True)
        for i in range(args.files):
            shutil.copyfile(one, folder / f"f{i:05d}.parquet")
        uris = [fed.uri(f"/ns/many/f{i:05d}.parquet") for i in range(args.files)]
        spec = StagingSpec(fed.staging(), fed.pelican)
        best = {k: (float("inf"), 0) for k in ("bare", "first", "resume", "touched")}

        def index(run_dir: Path) -> None:
            found = ri.remote_index(uris, spec, 1000, str(run_dir), write_cache=True)
            assert all(isinstance(m, ri.FileMeta) for m in found.values())

        for r in range(args.repeat):
            run_dir = Path(tmp) / f"run{r}"
            with (
                mock.patch.object(ri, "sampled_hash", lambda read, size: ""),
                mock.patch.object(ri, "listed_stamps", lambda uris, files: {}),
            ):
                took = timed(fed, lambda run_dir=run_dir: index(run_dir / "bare"))
            best["bare"] = min(best["bare"], took)
            best["first"] = min(best["first"], timed(fed, lambda run_dir=run_dir: index(run_dir)))
            best["resume"] = min(best["resume"], timed(fed, lambda run_dir=run_dir: index(run_dir)))
            later = time.time() + 10 * (r + 1)
            for p in folder.iterdir():
                os.utime(p, (later, later))
            best["touched"] = min(best["touched"], timed(fed, lambda run_dir=run_dir: index(run_dir)))
    seconds = {k: v[0] for k, v in best.items()}
    print(
        f"{args.files} remote files: "
        + ", ".join(f"{k} {s:.2f} s ({best[k][1]} requests)" for k, s in seconds.items())
    )
    result: dict[str, float | int] = {"files": args.files}
    for key, (secs, requests) in best.items():
        result[f"{key}_s"] = round(secs, 3)
        result[f"{key}_requests_per_file"] = round(requests / args.files, 3)
    result["first_ratio"] = round(seconds["bare"] / seconds["first"], 3)
    result["resume_ratio"] = round(seconds["first"] / seconds["resume"], 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
