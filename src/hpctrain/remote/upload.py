"""Uploads in the background: one at a time, the newest wins, failures retried with backoff and reported.

`Uploader.submit(job)` hands over a job (a callable that brings a remote copy up to date); while one runs,
newer submissions replace each other in a single slot, so a slow link never queues stale checkpoints. A
failing job is retried after `backoff` seconds (doubling up to `backoff_cap`) until a newer job arrives or
`retries` are used up, each failure logged as one warning. `close(timeout)` waits for the work under way at
most `timeout` seconds (the walltime left): a stop never waits past the deadline for an upload; what is cut
short there stays a temporary on the remote side, where `latest` still names the previous checkpoint. It
returns whether the last job arrived: one given up on (`error` says why) or cut short is never "uploaded".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)
_STOP_BY: list[float] = []  # time.monotonic() by which every close gives up (the walltime; see stop_by)


def stop_by(deadline: float | None) -> None:
    """No Uploader of this process waits past `deadline` (time.monotonic()) when closed: the trainer sets it
    from the walltime at its close, so later closes (TensorBoard's) respect it too."""
    _STOP_BY[:] = [] if deadline is None else [deadline]


class Uploader:
    def __init__(self, what: str, retries: int = 5, backoff: float = 2.0, backoff_cap: float = 60.0) -> None:
        self.what = what
        self.retries, self.backoff, self.backoff_cap = retries, backoff, backoff_cap
        self._cond = threading.Condition()
        self._pending: Callable[[], object] | None = None
        self._busy = False
        self._closed = False
        self.failures = 0  # failed attempts so far (for tests and the summary)
        self.done = 0  # jobs that succeeded
        # Why the last job given up on failed (None: the last job that ended succeeded, or none ended yet): what
        # `close` reports, so that a copy that never arrived is never called uploaded.
        self.error: str | None = None
        self._thread = threading.Thread(target=self._loop, name=f"upload-{what}", daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], object]) -> None:
        with self._cond:
            self._pending = job  # a job not started yet is replaced: the newest wins
            self._cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._closed:
                    self._cond.wait()
                if self._pending is None:
                    return
                job, self._pending, self._busy = self._pending, None, True
            try:
                self._run(job)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _run(self, job: Callable[[], object]) -> None:
        delay = self.backoff
        for attempt in range(self.retries + 1):
            try:
                job()
                self.done += 1
                self.error = None
                return
            except Exception as exc:  # a failed upload loses nothing local: report, retry, go on
                self.failures += 1
                # a refusal (403, 404) stays a refusal: retried at the next save, not hammered now
                last = attempt == self.retries or getattr(exc, "permanent", False)
                if last:
                    self.error = f"{attempt + 1} attempt{'s' if attempt else ''} failed, the last: {exc}"
                log.warning(
                    "uploading %s failed (attempt %d/%d): %s%s",
                    self.what,
                    attempt + 1,
                    self.retries + 1,
                    exc,
                    "; giving up until the next save" if last else f"; retrying in {delay:.0f} s",
                )
                if last:
                    return
            with self._cond:  # a newer job makes this retry moot
                if self._cond.wait_for(lambda: self._pending is not None, timeout=delay):
                    return
            delay = min(delay * 2, self.backoff_cap)

    def idle(self) -> bool:
        with self._cond:
            return not self._busy and self._pending is None

    def busy(self) -> bool:
        """Whether a job runs (or waits to retry) or one is pending."""
        return not self.idle()

    def close(self, timeout: float | None = None) -> bool:
        """Finish what is pending within `timeout` seconds (None: wait); True when everything was sent (the last
        job succeeded); False when it failed (`error` says why) or was cut short by the deadline."""
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        if _STOP_BY:
            deadline = _STOP_BY[0] if deadline is None else min(deadline, _STOP_BY[0])
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            while self._busy or self._pending is not None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    log.warning(
                        "uploading %s did not finish before the deadline; the remote copy keeps its previous "
                        "state (its `latest` names a complete checkpoint)",
                        self.what,
                    )
                    self.error = "not finished before the deadline (the remote copy keeps its previous state)"
                    return False
                self._cond.wait(timeout=left)
        return self.error is None
