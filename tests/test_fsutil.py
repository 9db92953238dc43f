"""fsutil: readers see the old file or the new one, a failed write leaves nothing, temporaries name their writer."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from hpctrain import fsutil
from hpctrain.errors import UserError
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


# ---- folders of our own: made at most 0750 / 0700 whatever the umask, links of others refused ------------------

as_root = pytest.mark.skipif(os.getuid() != 0, reason="chown to another uid needs root")


@contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_folders_are_made_at_most_0750_or_0700_whatever_the_umask(tmp_path: Path) -> None:
    with umask(0):  # Path.mkdir(parents=True) made the parents 0777 here
        fsutil.make_folders(tmp_path / "a" / "b" / "c")
        fsutil.private_folder(tmp_path / "p" / "q", "the cache", "hint")
    assert [mode(tmp_path / n) for n in ("a", "a/b", "a/b/c")] == [0o750] * 3
    assert [mode(tmp_path / n) for n in ("p", "p/q")] == [0o700] * 2
    with umask(0o077):  # a stricter umask narrows, never widened
        fsutil.make_folders(tmp_path / "s" / "t")
    assert mode(tmp_path / "s" / "t") == 0o700


@pytest.mark.parametrize("bits", [0o775, 0o757, 0o777])
def test_a_private_folder_others_may_write_is_refused(tmp_path: Path, bits: int) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(bits)
    with pytest.raises(
        UserError, match=r"the cache: .*/cache is writable by .*: a file planted there would run"
    ):
        fsutil.private_folder(cache, "the cache", "remove it")
    assert mode(cache) == bits  # refused, not "fixed": what others planted would stay


def test_a_private_folder_opened_to_others_before_is_narrowed_only_if_nothing_in_it_is(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "cache"
    (cache / "key").mkdir(parents=True)
    cache.chmod(0o755)  # made by an older version under umask 022: others could enter, not write
    (cache / "key").chmod(0o775)  # ... but this one they could write (umask 002)
    with pytest.raises(UserError, match=r"/cache/key is writable by its group"):
        fsutil.private_folder(cache, "the cache", "remove it")
    (cache / "key").chmod(0o755)
    fsutil.private_folder(cache, "the cache", "remove it")
    assert mode(cache) == 0o700


@as_root
def test_a_private_folder_of_another_user_or_behind_their_link_is_refused(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    os.chown(cache, 65534, 65534)
    with pytest.raises(UserError, match=r"cache belongs to (user \w+ \()?uid 65534"):
        fsutil.private_folder(cache, "the cache", "remove it")
    os.chown(cache, 0, 0)
    (cache / "planted.pkl").write_bytes(b"x")
    os.chown(cache / "planted.pkl", 65534, 65534)
    cache.chmod(0o755)
    with pytest.raises(UserError, match=r"planted.pkl belongs to"):
        fsutil.private_folder(cache, "the cache", "remove it")
    # a link named like the folder, made by someone else in a folder others may write (a shared run.out_dir,
    # /tmp), to a folder of ours: never followed
    ours, shared = tmp_path / "ours", tmp_path / "shared"
    ours.mkdir(mode=0o700)
    shared.mkdir()
    shared.chmod(0o1777)
    link = shared / "linked"
    link.symlink_to(ours)
    os.lchown(link, 65534, 65534)
    with pytest.raises(UserError, match=r"linked is a symbolic link made by (user \w+ \()?uid 65534"):
        fsutil.private_folder(link, "the cache", "remove it")
    assert fsutil.not_yours(link / "sub", "run folder") is not None  # a link anywhere on the way
    os.lchown(link, 0, 0)  # our own link to our own folder: fine (a cache kept on scratch)
    assert fsutil.private_folder(link, "the cache", "remove it") == link
    # their link in a folder only they write is their folder's structure (a project's link): followed
    trusted = tmp_path / "project"
    trusted.symlink_to(ours)
    os.lchown(trusted, 65534, 65534)
    assert fsutil.foreign_link(trusted / "sub") is None


def test_refuse_replacing_names_the_files_already_there(tmp_path: Path) -> None:
    files = [tmp_path / f"f{i}" for i in range(5)]
    fsutil.refuse_replacing(files, tmp_path)  # none there: nothing to say
    for path in files:
        path.write_text("data")
    with pytest.raises(
        UserError, match=r"already holds 5 of the files this would write \(f0, f1, f2 and 2 more\)"
    ):
        fsutil.refuse_replacing(files, tmp_path)
