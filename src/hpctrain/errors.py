"""Exit codes and the error type for user mistakes (shared by every layer; imports nothing)."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2
# EX_TEMPFAIL: stopped early on purpose (time budget or signal) and resumable: resubmit to continue.
EXIT_RESUMABLE = 75
# EX_CONFIG: the device ran out of memory at these settings; started again unchanged it would again, so a chain,
# `--until-done` and `supervise` stop (train/oom.py).
EXIT_OUT_OF_MEMORY = 78
# 128 + SIGINT, what a shell reports for a process ended by Ctrl-C.
EXIT_INTERRUPTED = 130


class UserError(ValueError):
    """A mistake in the user's input: printed as one line, exit code 2, before any work is done."""


class RunError(RuntimeError):
    """A failure the user must look at that is not bad input (e.g. no checkpoint of a run can be read): printed
    as one line, exit code 1, nothing changed."""


class OutOfMemory(RunError):
    """The device ran out of memory at these settings: printed as one line (what to change), exit
    EXIT_OUT_OF_MEMORY; the last checkpoint is kept as it was."""

    exit_code = EXIT_OUT_OF_MEMORY
