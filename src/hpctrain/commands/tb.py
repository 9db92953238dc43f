"""`hpctrain tb merge --dst DIR --src-root DIR [...]`: a combined TensorBoard log folder of selected runs."""

from __future__ import annotations

from hpctrain.commands.common import ArgParser
from hpctrain.errors import EXIT_OK, UserError
from hpctrain.track.tb_merge import merge as do_merge


def main(argv: list[str]) -> int:
    parser = ArgParser(prog="hpctrain tb", description="TensorBoard helpers.")
    sub = parser.add_subparsers(dest="action", required=True, parser_class=ArgParser)
    merge = sub.add_parser("merge", help="link or copy selected runs into one log folder")
    # --out as in every other verb that writes (data generate, sample, report); --dst, its old name, still works.
    merge.add_argument(
        "--out",
        "--dst",
        dest="out",
        required=True,
        help="the combined folder (point `tensorboard --logdir` here)",
    )
    merge.add_argument(
        "--src-root", required=True, help="folder searched for runs (folders with event files)"
    )
    merge.add_argument(
        "--mode",
        choices=("symlink", "copy"),
        default="symlink",
        help="symlink (default; live) or copy (e.g. to move to a laptop)",
    )
    merge.add_argument("--since", metavar="YYYYmmdd-HHMMSS", help="only runs started at or after this time")
    merge.add_argument("--match", metavar="REGEX", help="only runs whose path under --src-root matches")
    merge.add_argument(
        "--glob", metavar="PATTERN", help="only runs whose path under --src-root fits the glob"
    )
    args = parser.parse_args(argv)

    try:
        runs = do_merge(args.out, args.src_root, args.mode, args.since, args.match, args.glob)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    for run in runs:
        print(f"{args.mode}: {run.name}")
    print(f"{len(runs)} runs in {args.out}; view with: tensorboard --logdir {args.out}")
    return EXIT_OK
