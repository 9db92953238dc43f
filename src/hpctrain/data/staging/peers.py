"""How the local ranks of one node talk while staging: small files in `<scratch>/ctl/`, no sockets.

Local rank 0 downloads; every other local rank publishes `TAG.rankR` (JSON: the lowest index it may still read,
the highest it asked for, the one it waits on, whether it closed) and waits for files to appear. Rank 0 reads
those to know what it may delete and what to fetch first, and leaves markers for a waiting rank: `TAG.NAME.bad`
(the reason), `TAG.NAME.folder` (a folder in the list), `TAG.fatal` (staging stopped). TAG names the ordered
file list, so that Stagers over different lists share the folder; a generation number tells a rebuilt Stager
over the same list (the next epoch) from the previous one.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path

from hpctrain.data.staging.errors import BadFileError, StagingError
from hpctrain.fsutil import atomic_write_text
from hpctrain.remote.uris import FolderError

_GENERATIONS: dict[tuple[str, str, int], int] = {}  # (ctl folder, tag, local rank) -> Stagers built so far
_GEN_LOCK = threading.Lock()


@dataclass(frozen=True)
class PeerView:
    """What one other local rank published: it may still read from `floor` on, asked for up to `max_req`."""

    floor: float = 0
    max_req: int = -1
    waiting: int | None = None
    closed: bool = False


class NodePeers:
    """This rank's side of the node's staging protocol (see the module docstring). Writes are atomic and
    unsynced: the files live as long as the job's scratch folder."""

    def __init__(self, ctl: Path, tag: str, local_rank: int, local_world_size: int) -> None:
        self.ctl, self.tag = ctl, tag
        self.local_rank, self.local_world_size = local_rank, local_world_size
        key = (str(ctl), tag, local_rank)
        with _GEN_LOCK:
            self.gen = _GENERATIONS.get(key, 0)
            _GENERATIONS[key] = self.gen + 1

    def open(self) -> None:
        self.ctl.mkdir(mode=0o700, exist_ok=True)

    # -- every rank but local rank 0 -------------------------------------------------------------------------
    def publish(self, floor: float, max_req: int, waiting: int | None = None, closed: bool = False) -> None:
        """Write this rank's state for local rank 0 (readers never see half a file)."""
        if self.local_world_size == 1 or self.local_rank == 0:
            return
        state = {"gen": self.gen, "floor": floor, "max_req": max_req, "waiting": waiting, "closed": closed}
        atomic_write_text(self.ctl / f"{self.tag}.rank{self.local_rank}", json.dumps(state), fsync=False)

    def raise_if_marked(self, name: str, uri: str) -> None:
        """Raise what local rank 0 left for the file `name`, or for staging as a whole."""
        if self._folder(name).exists():
            raise FolderError(uri)
        if self._bad(name).exists():
            raise BadFileError(uri, self._bad(name).read_text())
        if self._fatal().exists():
            raise StagingError(f"local rank 0 stopped staging: {self._fatal().read_text()}")

    # -- local rank 0 ----------------------------------------------------------------------------------------
    def views(self) -> list[PeerView]:
        """The other local ranks' published state; a rank that has not started yet may read from 0."""
        views = []
        for rank in range(1, self.local_world_size):
            try:
                data = json.loads((self.ctl / f"{self.tag}.rank{rank}").read_text())
            except (OSError, ValueError):
                data = {"gen": self.gen}  # not published yet
            if data.get("gen", -1) < self.gen:  # the previous Stager's: this one has not started there yet
                views.append(PeerView())
            elif data["gen"] > self.gen or data.get("closed"):
                views.append(PeerView(floor=float("inf"), closed=True))
            else:
                views.append(PeerView(data.get("floor", 0), data.get("max_req", -1), data.get("waiting")))
        return views

    def all_closed(self) -> bool:
        return all(view.closed for view in self.views())

    def mark_bad(self, name: str, reason: str) -> None:
        atomic_write_text(self._bad(name), reason, fsync=False)

    def mark_folder(self, name: str, uri: str) -> None:
        atomic_write_text(self._folder(name), uri, fsync=False)

    def mark_fatal(self, message: str) -> None:
        atomic_write_text(self._fatal(), message, fsync=False)

    def markers(self) -> list[Path]:
        """This list's markers (stale ones of a killed job, removed when a Stager starts)."""
        found = [*self.ctl.glob(f"{self.tag}.*.bad"), *self.ctl.glob(f"{self.tag}.*.folder")]
        return [*found, self._fatal()]

    def _bad(self, name: str) -> Path:
        return self.ctl / f"{self.tag}.{name}.bad"

    def _folder(self, name: str) -> Path:
        return self.ctl / f"{self.tag}.{name}.folder"

    def _fatal(self) -> Path:
        return self.ctl / f"{self.tag}.fatal"
