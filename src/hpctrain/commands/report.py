"""`hpctrain report RUN_DIR [--out DIR]`: PNG plots and one HTML page for a run; `hpctrain report --compare RUN
[RUN ...]`: one page comparing runs (run folders, or folders of them). No torch."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from hpctrain.commands.common import ArgParser
from hpctrain.errors import EXIT_OK, UserError
from hpctrain.fsutil import atomic_write_text
from hpctrain.track.chain import read_json
from hpctrain.track.runs import SEARCH_DEPTH, find_runs, is_run_dir
from hpctrain.track.stages import Stages


def main(argv: list[str]) -> int:
    parser = ArgParser(
        prog="hpctrain report",
        description="Write PNG plots and an HTML page for a run folder, or one page comparing runs.",
    )
    parser.add_argument("run_dir", nargs="?", help="the run folder (<run.out_dir>/<run.name>)")
    parser.add_argument(
        "--compare",
        nargs="+",
        metavar="RUN",
        help="compare these runs on one page: run folders, or folders of run folders (e.g. a sweep's)",
    )
    parser.add_argument(
        "--out", help="where to write (default: RUN_DIR/report; with --compare, <the runs' folder>/compare)"
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="with --compare: replace a comparison of other runs in that folder (the same runs are redrawn)",
    )
    args = parser.parse_args(argv)
    if args.compare:
        if args.run_dir:
            raise UserError(
                f"hpctrain report: {args.run_dir!r} before --compare: name every run after it "
                "(hpctrain report --compare RUN [RUN ...])"
            )
        return _compare(args.compare, args.out, args.overwrite)
    if not args.run_dir:
        raise UserError("hpctrain report: name a run folder, or runs to compare with --compare RUN [RUN ...]")

    stages = Stages("report", sys.stdout)
    stages.stage(f"reading {args.run_dir}")  # before matplotlib's import (seconds on a busy machine)
    from hpctrain.track.report import write_report
    from hpctrain.track.report.data import model_type_of
    from hpctrain.workloads.registry import report_of

    try:
        workload = report_of(model_type_of(Path(args.run_dir)))
        page = write_report(Path(args.run_dir), Path(args.out) if args.out else None, workload, stages)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    print(f"report: {page}")
    return EXIT_OK


def compared_runs(names: list[str]) -> list[Path]:
    """The run folders named, a folder of runs standing for each of its runs that has logged anything (one
    that has not yet is said on stderr and left out); each run once, in the order given."""
    runs: list[Path] = []
    for name in names:
        path = Path(name)
        if is_run_dir(path):
            found = [path]
        elif path.is_dir() and (found := find_runs(path)):
            waiting = [p for p in found if not (p / "metrics.jsonl").is_file()]
            if waiting:
                print(
                    f"note: no metrics.jsonl yet, left out: {', '.join(map(str, waiting))}", file=sys.stderr
                )
            found = [p for p in found if p not in waiting]
        else:
            why = (
                "does not exist"
                if not path.exists()
                else f"is no run folder and holds none {SEARCH_DEPTH} levels down"
            )
            raise UserError(f"hpctrain report --compare: {name} {why}")
        runs += [p for p in found if p.resolve() not in {r.resolve() for r in runs}]
    if len(runs) < 2:
        raise UserError(
            f"hpctrain report --compare: needs two runs or more, found {len(runs)} "
            f"({', '.join(map(str, runs)) or 'none'}); for one run: hpctrain report RUN_DIR"
        )
    return runs


def _compare(names: list[str], out: str | None, overwrite: bool = False) -> int:
    from hpctrain.track.report.compare import write_comparison

    runs = compared_runs(names)
    if out is None:
        given = Path(names[0])
        parent = given if len(names) == 1 else _common_folder(runs)
        folder = parent / "compare"
    else:
        folder = Path(out)
    for run in runs:  # what is wrong with a run is said before what is in the way of the page
        if not (run / "metrics.jsonl").is_file():
            raise UserError(f"{run}: no metrics.jsonl (is this a run folder? <run.out_dir>/<run.name>)")
    redrawn = _may_write(folder, runs, overwrite)
    try:
        page = write_comparison(runs, folder)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    atomic_write_text(folder / COMPARED, json.dumps(_identities(runs), indent=1) + "\n")
    print(f"report: {page}" + (" (redrawn: the same runs)" if redrawn else ""))
    return EXIT_OK


COMPARED = "compared.json"  # the runs a comparison folder shows: the same ones are redrawn, others refused


def _identities(runs: list[Path]) -> list[str]:
    return sorted(str(run.resolve()) for run in runs)


def _may_write(folder: Path, runs: list[Path], overwrite: bool) -> bool:
    """Whether `folder` holds this comparison already (True: redrawn); a comparison of other runs, or other
    files, is never replaced silently: one line, exit 2, unless --overwrite."""
    if not folder.is_dir() or not any(folder.iterdir()):
        return False
    earlier = read_json(folder / COMPARED, None)
    if earlier == _identities(runs):
        return True
    if overwrite:
        return False
    if isinstance(earlier, list):
        held = f"a comparison of other runs ({', '.join(Path(p).name for p in earlier[:4])}{', ...' if len(earlier) > 4 else ''})"
    else:
        held = "other files" if not (folder / "index.html").exists() else "a comparison of unrecorded runs"
    raise UserError(
        f"hpctrain report --compare: {folder} holds {held}; nothing was replaced: name another folder with "
        "--out DIR, or add --overwrite to replace it"
    )


def _common_folder(runs: list[Path]) -> Path:
    """The deepest folder holding every run (as given when they are all relative or all absolute)."""
    try:
        return Path(os.path.commonpath([str(p.parent) for p in runs]))
    except ValueError:  # relative and absolute paths mixed
        return Path(os.path.commonpath([str(p.resolve().parent) for p in runs]))
