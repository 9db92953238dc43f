"""fsutil: readers see the old file or the new one, a failed write leaves nothing, temporaries name their writer."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from hpctrain import fsutil
from hpctrain.fsutil import HOST, atomic_path, atomic_write_bytes, atomic_write_text, temp_name, temp_writer


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "meta.json"
    atomic_write_text(path, "old\n")
    with pytest.raises(RuntimeError, match="disk full"), atomic_path(path) as tmp:
        tmp.write_text("half")
        raise RuntimeError("disk full")
    with pytest.raises(RuntimeError, match="cut"), atomic_path(path) as tmp:
        (tmp / "sub").mkdir(parents=True)  # a writer that makes a folder (pelicanfs for a collection)
        raise RuntimeError("cut")
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["meta.json"]


def test_a_folder_written_through_atomic_path_appears_whole(tmp_path: Path) -> None:
    path = tmp_path / "copy"
    with atomic_path(path) as tmp:
        (tmp / "sub").mkdir(parents=True)
        (tmp / "sub" / "a.bin").write_bytes(b"a")
        assert not path.exists()
    assert (path / "sub" / "a.bin").read_bytes() == b"a"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy"]


def test_temporaries_name_their_writer_per_thread(tmp_path: Path) -> None:
    main = temp_name(tmp_path / "f.pt")
    assert main.name == f".f.pt.tmp-{os.getpid()}@{HOST}"
    found: list[Path] = []
    worker = threading.Thread(target=lambda: found.append(temp_name(tmp_path / "f.pt")))
    worker.start()
    worker.join()
    assert found[0] != main and found[0].name.startswith(f".f.pt.tmp-{os.getpid()}-")
    assert temp_writer(main) == temp_writer(found[0]) == (os.getpid(), HOST)
    assert temp_writer(tmp_path / ".f.pt.tmp-old") == (None, "")


def test_two_threads_writing_one_file_never_share_a_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both writers are inside their write at once (a barrier just before the rename): with one shared temporary
    the first rename would take the other's file away and the second would fail."""
    path = tmp_path / "staged.bin"
    barrier = threading.Barrier(2, timeout=10)
    monkeypatch.setattr(fsutil, "before_commit", lambda tmp, final: barrier.wait())
    errors: list[BaseException] = []

    def write(data: bytes) -> None:
        try:
            atomic_write_bytes(path, data)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(bytes([n]) * 100_000,)) for n in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert path.read_bytes() in (b"\x01" * 100_000, b"\x02" * 100_000)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["staged.bin"]
