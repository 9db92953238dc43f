"""The `hpctrain` command: parse the verb, hand over to hpctrain.commands.<verb>. Nothing else."""

from __future__ import annotations

import faulthandler
import importlib
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import TracebackType

from hpctrain import __version__
from hpctrain.errors import (
    EXIT_BAD_INPUT,
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_OUT_OF_MEMORY,
    OutOfMemory,
    RunError,
    UserError,
)
from hpctrain.runtime.signals import install_early

# Imported before `train` installs its stop handlers (_main): keep this module's imports few and light (the
# standard library's importlib.metadata took 0.2-0.4 s on a loaded node, the secret-masking regular expressions
# of the error lines 60 ms: each is imported where it is used).

VERBS = {
    "train": "train a model (default: the debug regression job)",
    "config": "print the resolved configuration without running (`config show`)",
    "submit": "submit a training to SLURM through submitit (--dry-run, --local)",
    "status": "show progress, hops and goodput of a run folder",
    "cancel": "end a run's chain (SLURM jobs, queued successors): the hop saves and stops; resumable",
    "data": "generate or inspect data sets (`data generate`, `data inspect`)",
    "sample": "generate samples from a trained model (muon bundles)",
    "evaluate": "quality figures of a trained model (muons: bundles vs the synthetic truth)",
    "report": "write PNG plots and an HTML page for a run",
    "export": "write a trained model's networks as plain state dicts, with its config and loading code",
    "supervise": "restart a training command (torchrun) until its run is done, without SLURM",
    "sync": "upload a run's offline W&B data",
    "tb": "TensorBoard helpers (`tb merge`)",
    "auth": "Pelican/OSDF token: `auth login [URI]` (device flow, cached for batch jobs), `auth show`",
}


def _error_line(exc: BaseException) -> str:
    from hpctrain.config.messages import error_line

    return error_line(exc)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hpctrain")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return __version__


def _usage() -> str:
    lines = ["usage: hpctrain [--version] VERB [options]", "", "verbs:"]
    lines += [f"  {verb:<9} {text}" for verb, text in VERBS.items()]
    lines += ["", "`hpctrain VERB --help` describes a verb."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """The program (argv None: the `hpctrain` script, `python -m hpctrain`), or one call in a caller's process."""
    code = _main(argv)
    dist = sys.modules.get("hpctrain.runtime.dist")  # loaded only if this run used torch: never imported here
    if argv is None and dist is not None and dist.joined():
        dist.end_process(code)  # never returns
    return code


# Verbs that build optimizers or load compiled models: they import torch._dynamo, which makes the folder
# TORCHINDUCTOR_CACHE_DIR names, compile on or off.
_COMPILER_VERBS = ("train", "submit", "sample", "evaluate", "export")


def _inductor_cache_problem() -> str | None:
    """TORCHINDUCTOR_CACHE_DIR naming a file, a path under one or a folder that cannot be made: torch's import
    of its compiler makes that folder (the optimizer's constructor imports it, compile off too), so the run ended
    in a traceback there. Made here as torch would make it, or one line naming the variable."""
    value = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not value:
        return None
    import errno
    from pathlib import Path

    from hpctrain.fsutil import PRIVATE_MODE, make_folders

    try:
        # as train makes it (train/compile/cache.py): the user's alone
        make_folders(Path(value), PRIVATE_MODE)
        if not os.path.isdir(value):
            raise NotADirectoryError(errno.ENOTDIR, "Not a directory")
    except OSError as exc:
        return (
            f"TORCHINDUCTOR_CACHE_DIR={value}: cannot be a folder ({exc.strerror or exc}); point it at a folder "
            "you can write, or unset it (the compile cache then goes to <run.out_dir>/.compile-cache)"
        )
    return None


def _masked_tracebacks() -> None:
    """A crash's traceback (exit 1) with secrets masked, as every error line is: an exception's text may hold a
    URI with its token (`?authz=...`), in the main thread or another (an upload's, a mirror's)."""

    import threading  # light; traceback and the masking are imported when a crash is printed

    def main_thread(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        import traceback

        from hpctrain.config.secrets import mask_secrets

        sys.stderr.write(mask_secrets("".join(traceback.format_exception(kind, value, tb))))

    def other_thread(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:
            return
        import traceback

        from hpctrain.config.secrets import mask_secrets

        name = args.thread.name if args.thread is not None else "?"
        text = "".join(traceback.format_exception(args.exc_type, args.exc_value, args.exc_traceback))
        sys.stderr.write(mask_secrets(f"Exception in thread {name}:\n{text}"))

    sys.excepthook, threading.excepthook = main_thread, other_thread


def _masked_last_resort() -> None:
    """A verb's warnings without a handler of its own (train masks its own) masked: after the stop handlers,
    the masking's regular expressions cost tens of milliseconds to import."""
    import logging

    from hpctrain.config.secrets import mask_handlers

    if logging.lastResort is not None:
        mask_handlers(logging.lastResort)


def _main(argv: list[str] | None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if argv is None:  # the program: its tracebacks are ours to print (a caller's process keeps its own hooks)
        _masked_tracebacks()
    if args[:1] == ["--version"]:
        print(f"hpctrain {_version()}")
        return 0
    if not args or args[0] in ("-h", "--help"):
        if not args:
            # No verb: the default job, as the README promises.
            args = ["train"]
        else:
            print(_usage())
            return 0
    verb, rest = args[0], args[1:]
    if verb.startswith("-"):
        verb, rest = "train", args
    if verb not in VERBS:
        print(f"error: unknown verb {verb!r} (choose from {', '.join(VERBS)})", file=sys.stderr)
        return EXIT_BAD_INPUT
    if not faulthandler.is_enabled():
        # A crash in native code (a gloo/NCCL thread's abort, a segfault in an extension) prints every Python
        # thread's stack to stderr: which rank died, and where, is in the job's log instead of one line of C++.
        faulthandler.enable(all_threads=True)
    supervising = verb == "supervise" or (verb == "train" and "--until-done" in rest)
    if verb in ("train", "supervise"):
        # Before the verb's imports (torch) and the config: a USR1/TERM from now on is a requeue-able stop, never
        # a death, to the process's end (runtime/signals.py). A supervisor's own handlers replace them while it
        # runs; it leaves the signal mask as its launcher set it (its children inherit that).
        install_early(unblock=not supervising)
    if verb in _COMPILER_VERBS and (problem := _inductor_cache_problem()):
        print(f"error: {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if argv is None:
        _masked_last_resort()
    module = importlib.import_module(f"hpctrain.commands.{verb}")
    try:
        return int(module.main(rest))
    except UserError as exc:
        # Whoever raised it: one line, secrets masked (a token in a URI or a dashed override included).
        print(f"error: {_error_line(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OutOfMemory as exc:  # not retried at these settings (a chain, --until-done, supervise)
        print(f"error: {_error_line(exc)}", file=sys.stderr)
        return EXIT_OUT_OF_MEMORY
    except RunError as exc:
        print(f"error: {_error_line(exc)}", file=sys.stderr)
        return EXIT_FAILURE
    except (
        FileExistsError,
        FileNotFoundError,
        IsADirectoryError,
        NotADirectoryError,
        PermissionError,
    ) as exc:
        if exc.filename is None:
            raise
        # A path the user gave that a verb could not write or read where no check of its own named it (an --out
        # that is a file, a folder under a file, a read-only place): one line naming the path, as any mistake.
        other = f" -> {exc.filename2}" if exc.filename2 else ""
        from hpctrain.config.secrets import mask_secrets

        print(mask_secrets(f"error: {exc.filename}{other}: {exc.strerror or exc}"), file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        # A second Ctrl-C (the first asks for a save and a stop): the last committed checkpoint stays.
        print(
            "error: interrupted (a second Ctrl-C): nothing was saved since the last checkpoint, which stays; run "
            "the same command again to continue from it",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `hpctrain status RUN | head`: the reader is gone; say nothing more (and nothing at exit either).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
