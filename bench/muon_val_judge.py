"""Time of the judge at each evaluation of a muon generator (evaluation/val_judge.py): the classifier AUC of the
model's bundles against the fixed validation subset, as the trainer runs it.

    python bench/muon_val_judge.py RUN_DIR [--val PATH ...] [--repeats 3] [--threads 2]

RUN_DIR: a trained muon_flow or muon_wgan run folder (its latest checkpoint); its data.val_paths unless --val
names other validation files. The subset is read once (not timed in the figures: the trainer reads it at the
first evaluation and keeps it), then the judge runs --repeats times. Prints each time and the figures (the same
at every repeat: the judge is deterministic); last line one JSON object: `seconds` (median), `seconds_min_max`,
`cpu_seconds` (median CPU time of the process's threads: what a loaded machine's wall time hides),
`read_seconds` (the first evaluation's extra), `events`, `muons`, `per_bin`, `val_auc`, `threads`, `load`
(1-minute load average at the start).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run_dir", help="a trained muon_flow or muon_wgan run folder")
    parser.add_argument("--val", nargs="+", help="validation files instead of the run's data.val_paths")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (the machine's 2 cores)")
    args = parser.parse_args()

    import torch

    from hpctrain.runtime.seeding import rng_state, set_rng_state
    from hpctrain.workloads.muons.evaluation import val_judge
    from hpctrain.workloads.muons.models import sampling

    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    model = sampling.load_model(args.run_dir, "cpu")
    cfg = model.cfg
    if args.val:
        cfg = cfg.model_copy(update={"data": cfg.data.model_copy(update={"val_paths": list(args.val)})})
    judge = val_judge.ValJudge(cfg, model.run_dir or model.checkpoint.parent)
    start = time.perf_counter()
    events = judge.events()
    read = time.perf_counter() - start
    times, cpu, figures = [], [], {}
    for i in range(args.repeats):
        state = rng_state()
        start, start_cpu = time.perf_counter(), time.process_time()
        figures = judge.figures(model.modules, model.step)
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
        set_rng_state(state)
        shown = " ".join(f"{k} {v:.4g}" for k, v in figures.items())
        print(f"repeat {i + 1}: {times[-1]:.2f} s ({cpu[-1]:.2f} s CPU)  {shown}")
    summary = {
        "seconds": round(statistics.median(times), 3),
        "seconds_min_max": [round(min(times), 3), round(max(times), 3)],
        "cpu_seconds": round(statistics.median(cpu), 3),  # of all threads: the load-independent figure
        "read_seconds": round(read, 3),
        "events": len(events),
        "muons": len(events.muons),
        "per_bin": val_judge.PER_BIN,
        "val_auc": figures.get("val_auc"),
        "threads": args.threads,
        "load": round(load, 2),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
