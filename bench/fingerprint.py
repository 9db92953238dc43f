"""The cost of the data files' content evidence (data/fingerprint.py) on thousands of files.

    python bench/fingerprint.py [--files 5000] [--kb 64] [--repeat 3]

Writes `--files` files of `--kb` KiB of random bytes in a temporary folder, then measures, each `--repeat` times
(interleaved, best kept: the machine is shared):
- stat: names and sizes only (os.stat of each file), what the fingerprint held before: the baseline;
- evidence: mtime_ns, the sampled hash and the whole-file hash of every file (a run's first save): the whole
  file read (within `fingerprint.WHOLE_BYTES` per list, 4 GiB);
- sampled: the same with the sampled hash alone (head, tail and three fixed fractions of the size, 4 KiB each:
  at most 20 KiB read per file), what files past WHOLE_BYTES get;
- resume: the check of a resume whose files kept their mtime (a stat per file, nothing read);
- touched: the check of a resume whose files all got a new mtime (each hashed whole again).
The files were just written, so their pages are cached: `evidence` measures the calls and hashing, not a cold
parallel file system (there each sampled range is one small read: five per file instead of one stat).

The last line printed is one JSON object: files, evidence_files_per_s, sampled_files_per_s, resume_files_per_s,
touched_resume_files_per_s, stat_files_per_s, bytes_read_per_file, and the *_ratio of each (the throughput over
the stat baseline's, higher is better).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable
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
        best = dict.fromkeys(("stat", "evidence", "sampled", "resume", "touched"), float("inf"))

        def timed(key: str, work: Callable[[], object]) -> object:
            start = time.perf_counter()
            got = work()
            best[key] = min(best[key], time.perf_counter() - start)
            return got

        whole_bytes = fingerprint.WHOLE_BYTES
        for round_ in range(args.repeat):
            timed("stat", lambda: [os.stat(name) for name in names])
            fingerprint._hashed.clear()  # nothing known: every file hashed
            saved = timed("evidence", lambda: FileList(names, sizes, events).state())
            fingerprint._hashed.clear()
            fingerprint.WHOLE_BYTES = 0
            timed("sampled", lambda: FileList(names, sizes, events).state())
            fingerprint.WHOLE_BYTES = whole_bytes
            fingerprint._hashed.clear()  # a new process resuming: only the checkpoint's evidence is known
            changed = timed(
                "resume",
                lambda saved=saved: FileList(names, sizes, events).changes(FileList.from_state(saved)),
            )
            assert changed is None
            later = time.time_ns() + (round_ + 1) * 10**9
            for name in names:
                os.utime(name, ns=(later, later))
            fingerprint._hashed.clear()
            changed = timed(
                "touched",
                lambda saved=saved: FileList(names, sizes, events).changes(FileList.from_state(saved)),
            )
            assert changed is None
            saved = FileList(names, sizes, events).state()  # the new mtimes, for the next round's resume
    rate = {k: args.files / v for k, v in best.items()}
    print(
        f"{args.files} files of {args.kb} KiB: stat {rate['stat']:.0f} files/s, evidence {rate['evidence']:.0f} "
        f"files/s (sampled alone {rate['sampled']:.0f}), resume check {rate['resume']:.0f} files/s (all "
        f"touched: {rate['touched']:.0f})"
    )
    result = {
        "files": args.files,
        "evidence_files_per_s": round(rate["evidence"]),
        "sampled_files_per_s": round(rate["sampled"]),
        "resume_files_per_s": round(rate["resume"]),
        "touched_resume_files_per_s": round(rate["touched"]),
        "stat_files_per_s": round(rate["stat"]),
        "bytes_read_per_file": args.kb * 1024,
        "sampled_bytes_per_file": sum(n for _, n in sample_ranges(args.kb * 1024)),
        "evidence_ratio": round(rate["evidence"] / rate["stat"], 3),
        "sampled_ratio": round(rate["sampled"] / rate["stat"], 3),
        "resume_ratio": round(rate["resume"] / rate["stat"], 3),
        "touched_ratio": round(rate["touched"] / rate["stat"], 3),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
