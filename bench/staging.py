"""Staging speed against the raw HTTP rate of the same files, both from a loopback Pelican federation.

    python bench/staging.py [--files 8] [--mb 8] [--ahead 2]

The federation runs in a child process (as a real cache runs elsewhere). The raw rate (aiohttp GETs straight
from the cache, bytes discarded) is the limit; the stager goes through pelicanfs (discovery, director, cache
choice, HEAD + Range GETs; the file list comes from expand_paths first, as in training) and writes, fsyncs
and renames each file on scratch: `--scratch`, default /dev/shm when it exists, because node-local scratch is
NVMe or RAM on clusters while this VM's disk (~300 MB/s with fsync) would measure the disk, not the stager.
Each is measured `--repeat` times, interleaved, and the best kept (the machine is shared).

Then the training-wait part: a consumer reads each staged file (really, from scratch) and takes as long as a
training step consuming `--consume-share` of the stager's measured rate would (default 0.5: staging twice as
fast as training), with ahead 0 and 2. It reports the share of the pass spent blocked in `Stager.get`. The
first file is waited for whatever `ahead` is (start-up: nothing was staged yet); it is left out of the shares
and reported as `first_wait_s`; `wait_share_ahead2_with_first` keeps it.

The last line printed is one JSON object: raw_MBps, stager_MBps, stager_ratio (goal >= 0.8),
wait_share_ahead0, wait_share_ahead2 (goal < 0.05), wait_share_ahead2_with_first, first_wait_s, consume_MBps.

`stage_rate()` runs a Stager over a list of URIs with an optional per-file `consume` callback (e.g. a training
step), so a training-wait benchmark can reuse it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' loopback federation

from hpctrain.config.remote import PelicanConfig, StagingConfig
from hpctrain.data.staging import Stager
from hpctrain.remote.expand import expand_paths
from tests.integration.pelican_fixtures import pelican_federation


def stage_rate(
    uris: list[str],
    staging: StagingConfig,
    pelican: PelicanConfig | None = None,
    consume: Callable[[Path], None] | None = None,
    job_id: str = "bench",
) -> dict[str, float]:
    """Stage and release `uris` in order, calling `consume(path)` on each; rate over the whole pass.

    Returns seconds, MB (1e6 bytes), MBps and wait_seconds (time blocked in Stager.get).
    """
    start = time.perf_counter()
    total = 0
    with Stager(uris, staging, job_id=job_id, pelican=pelican) as st:
        for i in range(len(uris)):
            path = st.get(i)
            total += path.stat().st_size
            if consume is not None:
                consume(path)
            st.release(i)
        wait = st.wait_seconds
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "MB": total / 1e6, "MBps": total / 1e6 / seconds, "wait_seconds": wait}


def training_wait(
    uris: list[str], staging: StagingConfig, pelican: PelicanConfig | None, consume_MBps: float, job_id: str
) -> dict[str, float]:
    """Stage `uris` in order while a consumer reads each file at `consume_MBps`; times blocked in get()."""
    waits: list[float] = []
    start = time.perf_counter()
    with Stager(uris, staging, job_id=job_id, pelican=pelican) as st:
        for i in range(len(uris)):
            before = st.wait_seconds
            path = st.get(i)
            waits.append(st.wait_seconds - before)
            step_start = time.perf_counter()
            size = len(path.read_bytes())  # the training step reads the file...
            # ...and computes for as long as a step consuming consume_MBps would take
            time.sleep(max(0.0, size / 1e6 / consume_MBps - (time.perf_counter() - step_start)))
            st.release(i)
    seconds = time.perf_counter() - start
    first = waits[0]
    return {
        "seconds": seconds,
        "first_wait_s": first,
        "wait_share": (sum(waits) - first) / (seconds - first),
        "wait_share_with_first": sum(waits) / seconds,
    }


async def _raw(urls: list[str], ca_file: str) -> tuple[int, float]:
    ctx = ssl.create_default_context(cafile=ca_file)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session:
        start = time.perf_counter()
        total = 0
        for url in urls:
            async with session.get(url) as resp:
                resp.raise_for_status()
                async for chunk in resp.content.iter_chunked(1 << 20):
                    total += len(chunk)
        return total, time.perf_counter() - start


def raw_rate(urls: list[str], ca_file: str) -> float:
    """MB/s of plain sequential GETs of `urls` with aiohttp, bodies discarded."""
    total, seconds = asyncio.run(_raw(urls, ca_file))
    return total / 1e6 / seconds


def serve(n_files: int, mb: int) -> None:
    """Child process: run the federation (its own GIL, like a real cache) until stdin closes."""
    with (
        tempfile.TemporaryDirectory(prefix="hpctrain-bench-") as tmp,
        pelican_federation(Path(tmp), n_files=n_files, size=mb << 20) as fed,
    ):
        paths = sorted(fed.files)
        info = {
            "url": fed.fed.url,
            "ca_file": str(fed.fed.ca_file),
            "cache": fed.fed.caches[0].url,
            "paths": paths,
        }
        print(json.dumps(info), flush=True)
        sys.stdin.read()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--mb", type=int, default=8)
    parser.add_argument("--ahead", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--consume-share",
        type=float,
        default=0.5,
        help="training consumes this share of the stager's rate (< 1: staging faster than training)",
    )
    parser.add_argument(
        "--scratch", default="/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.files, args.mb)
        return
    argv = [sys.executable, __file__, "--serve", "--files", str(args.files), "--mb", str(args.mb)]
    server = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        info = json.loads(server.stdout.readline())
        # as in training: the file list comes from expand_paths, which also finds the federation's director
        uris = expand_paths([info["url"] + "/ns/data/*.bin"], PelicanConfig(ca_file=info["ca_file"]))
        assert len(uris) == len(info["paths"])
        urls = [info["cache"] + p for p in info["paths"]]
        pelican = PelicanConfig(ca_file=info["ca_file"])
        raws, stagers = [], []
        with tempfile.TemporaryDirectory(prefix="hpctrain-bench-scratch-", dir=args.scratch) as scratch:
            staging = StagingConfig(dir=scratch, ahead=args.ahead)
            for rep in range(args.repeat):
                raws.append(raw_rate(urls, info["ca_file"]))
                stagers.append(stage_rate(uris, staging, pelican, job_id=f"bench{rep}")["MBps"])
                print(f"rep {rep}: raw {raws[-1]:.0f} MB/s, stager {stagers[-1]:.0f} MB/s", flush=True)
            consume = max(stagers) * args.consume_share
            waits = {}
            for ahead in (0, 2):
                cfg = StagingConfig(dir=scratch, ahead=ahead)
                waits[ahead] = training_wait(uris, cfg, pelican, consume, job_id=f"wait{ahead}")
                print(
                    f"training at {consume:.0f} MB/s, ahead {ahead}: {100 * waits[ahead]['wait_share']:.1f}% "
                    f"of the time waiting (first file {waits[ahead]['first_wait_s']:.3f} s)",
                    flush=True,
                )
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(30)
    raw, stager = max(raws), max(stagers)
    print(
        json.dumps(
            {
                "files": args.files,
                "file_MB": args.mb * 2**20 / 1e6,
                "raw_MBps": round(raw, 1),
                "stager_MBps": round(stager, 1),
                "stager_ratio": round(stager / raw, 3),
                "consume_MBps": round(consume, 1),
                "wait_share_ahead0": round(waits[0]["wait_share"], 4),
                "wait_share_ahead2": round(waits[2]["wait_share"], 4),
                "wait_share_ahead2_with_first": round(waits[2]["wait_share_with_first"], 4),
                "first_wait_s": round(waits[2]["first_wait_s"], 4),
                "scratch": args.scratch,
            }
        )
    )


if __name__ == "__main__":
    main()
