"""`hpctrain report RUN_DIR [--out DIR]`: PNG plots and one HTML page for a run (no torch)."""

from __future__ import annotations

from pathlib import Path

from hpctrain.commands.common import ArgParser
from hpctrain.errors import EXIT_OK, UserError


def main(argv: list[str]) -> int:
    parser = ArgParser(
        prog="hpctrain report", description="Write PNG plots and an HTML page for a run folder."
    )
    parser.add_argument("run_dir", help="the run folder (<run.out_dir>/<run.name>)")
    parser.add_argument("--out", help="where to write (default: RUN_DIR/report)")
    args = parser.parse_args(argv)

    from hpctrain.track.report import write_report
    from hpctrain.track.report.data import model_type_of
    from hpctrain.workloads.registry import report_of

    try:
        workload = report_of(model_type_of(Path(args.run_dir)))
        page = write_report(Path(args.run_dir), Path(args.out) if args.out else None, workload)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    print(f"report: {page}")
    return EXIT_OK
