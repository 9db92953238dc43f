"""What staging raises: a file that cannot be staged (the reader skips or stops on it), or staging itself."""

from __future__ import annotations


class BadFileError(RuntimeError):
    """A file that cannot be staged (missing, refused, or still failing after the retries)."""

    def __init__(self, uri: str, reason: str) -> None:
        super().__init__(f"{uri}: {reason}")
        self.uri, self.reason = uri, reason


class StagingError(RuntimeError):
    """Staging itself failed (scratch full, unwritable, another rank not answering)."""
