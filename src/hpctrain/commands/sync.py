"""`hpctrain sync RUN_DIR [--watch SECONDS]`: upload a run's offline W&B data (login node; no torch)."""

from __future__ import annotations

import sys
from pathlib import Path

from hpctrain.commands.common import ArgParser
from hpctrain.errors import EXIT_FAILURE, EXIT_OK, UserError


def _api_key(env_file: str | None) -> str | None:
    """WANDB_API_KEY from the environment or the .env file; it only ever goes to wandb's environment."""
    from hpctrain.config.environ import DotEnv

    dotenv = DotEnv(_env_file=env_file) if env_file else DotEnv(_env_file=None)  # type: ignore[call-arg]
    return dotenv.WANDB_API_KEY.get_secret_value() if dotenv.WANDB_API_KEY is not None else None


def main(argv: list[str]) -> int:
    parser = ArgParser(
        prog="hpctrain sync", description="Upload a run's offline W&B folders, in order, once each."
    )
    parser.add_argument("run_dir", help="the run folder (<run.out_dir>/<run.name>)")
    parser.add_argument(
        "--watch",
        type=float,
        metavar="SECONDS",
        help="repeat every SECONDS until the run has finished and everything is uploaded",
    )
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="seconds one `wandb sync` may take (600)"
    )
    parser.add_argument(
        "--idle-minutes",
        type=float,
        default=30.0,
        help="upload the newest unfinished hop once its file is this old (killed job; 30)",
    )
    parser.add_argument("--dry-run", action="store_true", help="list what would be uploaded")
    parser.add_argument("--env-file", default=".env", help="file with WANDB_API_KEY (default .env)")
    args = parser.parse_args(argv)
    if args.watch is not None and args.watch <= 0:
        raise UserError(f"--watch={args.watch}: must be a positive number of seconds")
    if args.timeout <= 0:
        raise UserError(f"--timeout={args.timeout}: must be a positive number of seconds")
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise UserError(f"run folder {run_dir} does not exist")

    from hpctrain.track.sync import sync

    def say(text: str) -> None:
        print(text, flush=True)

    try:
        report = sync(
            run_dir,
            watch=args.watch,
            api_key=_api_key(args.env_file),
            timeout=args.timeout,
            idle_seconds=args.idle_minutes * 60,
            dry_run=args.dry_run,
            say=say,
        )
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_FAILURE
    say(
        f"W&B sync: {len(report.synced)} uploaded, {len(report.already)} already uploaded, "
        f"{len(report.pending)} still being written, {len(report.failed)} failed"
    )
    return EXIT_OK if report.ok else EXIT_FAILURE
