"""The local ranks' staging protocol (NodePeers) without downloads: what rank 0 reads of the others, markers."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.data.staging import BadFileError, StagingError
from hpctrain.data.staging.peers import NodePeers, PeerView
from hpctrain.remote.uris import FolderError


def pair(ctl: Path, tag: str) -> tuple[NodePeers, NodePeers]:
    rank0, rank1 = NodePeers(ctl, tag, 0, 2), NodePeers(ctl, tag, 1, 2)
    rank0.open()
    return rank0, rank1


def test_rank0_sees_what_the_others_published(tmp_path: Path) -> None:
    rank0, rank1 = pair(tmp_path / "ctl", "list-a")
    assert rank0.views() == [PeerView()]  # not started yet: may read from the first file on
    rank1.publish(3, 5, waiting=4)
    assert rank0.views() == [PeerView(floor=3, max_req=5, waiting=4)] and not rank0.all_closed()
    rank0.publish(9, 9)  # rank 0 tells nobody: it is the one that reads the others
    assert not list((tmp_path / "ctl").glob("list-a.rank0"))
    rank1.publish(6, 6, closed=True)
    assert rank0.views() == [PeerView(floor=float("inf"), closed=True)] and rank0.all_closed()
    assert sorted(p.name for p in (tmp_path / "ctl").iterdir()) == ["list-a.rank1"]  # no temporaries


def test_generations_tell_the_next_stager_over_the_same_list_from_the_last(tmp_path: Path) -> None:
    ctl = tmp_path / "ctl"
    old0, old1 = pair(ctl, "list-b")
    old1.publish(7, 8)
    new0, new1 = pair(ctl, "list-b")  # the next epoch's Stagers, in the same process
    assert (new0.gen, new1.gen) == (old0.gen + 1, old1.gen + 1)
    assert new0.views() == [PeerView()]  # the old rank-1 file says nothing of where the new one is
    new1.publish(1, 2)
    assert old0.views() == [PeerView(floor=float("inf"), closed=True)]  # the old one's peer moved on
    assert new0.views() == [PeerView(floor=1, max_req=2)]


def test_markers_reach_the_waiting_rank(tmp_path: Path) -> None:
    rank0, rank1 = pair(tmp_path / "ctl", "list-c")
    rank1.raise_if_marked("f1", "pelican://fed/ns/f1")  # nothing marked: returns
    rank0.mark_bad("f1", "not found (HTTP 404)")
    with pytest.raises(BadFileError, match=r"^pelican://fed/ns/f1: not found \(HTTP 404\)$"):
        rank1.raise_if_marked("f1", "pelican://fed/ns/f1")
    rank0.mark_folder("f2", "pelican://fed/ns/f2")
    with pytest.raises(FolderError, match="is a folder"):
        rank1.raise_if_marked("f2", "pelican://fed/ns/f2")
    rank1.raise_if_marked("f3", "pelican://fed/ns/f3")
    rank0.mark_fatal("scratch full")
    with pytest.raises(StagingError, match="local rank 0 stopped staging: scratch full"):
        rank1.raise_if_marked("f3", "pelican://fed/ns/f3")
    assert {p.name for p in rank0.markers()} == {"list-c.f1.bad", "list-c.f2.folder", "list-c.fatal"}
