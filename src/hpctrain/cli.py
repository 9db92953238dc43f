"""The `hpctrain` command: parse the verb, hand over to hpctrain.commands.<verb>. Nothing else."""

from __future__ import annotations

import faulthandler
import importlib
import os
import sys
from importlib.metadata import PackageNotFoundError, version

from hpctrain import __version__
from hpctrain.config.messages import error_line
from hpctrain.errors import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, RunError, UserError
from hpctrain.runtime.signals import install_early

VERBS = {
    "train": "train a model (default: the debug regression job)",
    "config": "print the resolved configuration without running (`config show`)",
    "submit": "submit a training to SLURM through submitit (--dry-run, --local)",
    "status": "show progress, hops and goodput of a run folder",
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


def _version() -> str:
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


# The first line of a verb whose module is slow to import (the others say theirs as they begin).
_SAYS_FIRST = {"export": "loading torch and the checkpoint"}


def _inductor_cache_problem() -> str | None:
    """TORCHINDUCTOR_CACHE_DIR naming a file, a path under one or a folder that cannot be made: torch's import
    of its compiler makes that folder (the optimizer's constructor imports it, compile off too), so the run ended
    in a traceback there. Made here as torch would make it, or one line naming the variable."""
    value = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not value:
        return None
    try:
        os.makedirs(value, exist_ok=True)
    except OSError as exc:
        return (
            f"TORCHINDUCTOR_CACHE_DIR={value}: cannot be a folder ({exc.strerror or exc}); point it at a folder "
            "you can write, or unset it (the compile cache then goes to <run.out_dir>/.compile-cache)"
        )
    return None


def _main(argv: list[str] | None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
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
    if verb == "train" and "--until-done" not in rest:
        # Before the verb's imports (torch) and the config: a USR1/TERM from now on is a requeue-able stop, never
        # a death (runtime/signals.py).
        install_early()
    if verb in _COMPILER_VERBS and (problem := _inductor_cache_problem()):
        print(f"error: {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if verb in _SAYS_FIRST and not {"-h", "--help"} & set(rest):
        # its module imports torch (seconds; a minute on a busy machine) before the verb can say anything
        print(f"{verb}: {_SAYS_FIRST[verb]}", flush=True)
    module = importlib.import_module(f"hpctrain.commands.{verb}")
    try:
        return int(module.main(rest))
    except UserError as exc:
        # Whoever raised it: one line, secrets masked (a token in a URI or a dashed override included).
        print(f"error: {error_line(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except RunError as exc:
        print(f"error: {error_line(exc)}", file=sys.stderr)
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
        print(f"error: {exc.filename}{other}: {exc.strerror or exc}", file=sys.stderr)
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
