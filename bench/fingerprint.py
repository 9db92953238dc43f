"""The cost of the data files' content evidence (data/fingerprint.py) on thousands of files.

    python bench/fingerprint.py [--files 5000] [--kb 64] [--repeat 3]

Writes `--files` files of `--kb` KiB of random bytes in a temporary folder, then measures, each `--repeat` times
(interleaved, best kept: the machine is shared):
- stat: names and sizes only (os.stat of each file), what the fingerprint held before: the baseline;
- evidence: mtime_ns and the sampled hash of every file (a first run, or a resume whose files changed mtime):
  head, tail and three fixed fractions of the size, 4 KiB each, at most 20 KiB read per file;
- resume: the check of a resume whose files kept their mtime (a stat per file, nothing read).
The files were just written, so their pages are cached: `evidence` measures the calls and hashing, not a cold
parallel file system (there each sampled range is one small read: five per file instead of one stat).

The last line printed is one JSON object: files, evidence_files_per_s, resume_files_per_s, stat_files_per_s,
bytes_read_per_file, evidence_ratio and resume_ratio (the throughput over the stat baseline's, higher is better).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from hpctrain.data import fingerprint
from hpctrain.data.fingerprint import FileList, sample_ranges


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=5000)
    parser.add_argument("--kb", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hpctrain-bench-fp-") as tmp:
        names = []
        for i in range(args.files):
            path = Path(tmp) / f"file-{i:06d}.h5"
            path.write_bytes(os.urandom(args.kb * 1024))
            names.append(str(path))
        sizes = [args.kb * 1024] * len(names)
        events = [100] * len(names)
        best = {"stat": float("inf"), "evidence": float("inf"), "resume": float("inf")}
        for _ in range(args.repeat):
            start = time.perf_counter()
            for name in names:
                os.stat(name)
            best["stat"] = min(best["stat"], time.perf_counter() - start)
            fingerprint._sampled.clear()  # nothing known: every file sampled
            start = time.perf_counter()
            saved = FileList(names, sizes, events).state()
            best["evidence"] = min(best["evidence"], time.perf_counter() - start)
            fingerprint._sampled.clear()  # a new process resuming: only the checkpoint's evidence is known
            start = time.perf_counter()
            changed = FileList(names, sizes, events).changes(FileList.from_state(saved))
            best["resume"] = min(best["resume"], time.perf_counter() - start)
            assert changed is None
    rate = {k: args.files / v for k, v in best.items()}
    print(
        f"{args.files} files of {args.kb} KiB: stat {rate['stat']:.0f} files/s, evidence {rate['evidence']:.0f} "
        f"files/s, resume check {rate['resume']:.0f} files/s"
    )
    result = {
        "files": args.files,
        "evidence_files_per_s": round(rate["evidence"]),
        "resume_files_per_s": round(rate["resume"]),
        "stat_files_per_s": round(rate["stat"]),
        "bytes_read_per_file": sum(n for _, n in sample_ranges(args.kb * 1024)),
        "evidence_ratio": round(rate["evidence"] / rate["stat"], 3),
        "resume_ratio": round(rate["resume"] / rate["stat"], 3),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
