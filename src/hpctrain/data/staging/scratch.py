"""The node-local scratch folder staged files live in: where it is, what files are called there, and removing
what a killed job left behind."""

from __future__ import annotations

import getpass
import hashlib
import logging
import os
import re
import shutil
import socket
from pathlib import Path

from hpctrain.config.remote import StagingConfig
from hpctrain.errors import UserError
from hpctrain.fsutil import HOST, nearest_existing_folder, pid_alive, temp_writer

log = logging.getLogger("hpctrain.staging")


def staging_root(cfg: StagingConfig, job_id: str | None = None, env: dict[str, str] | None = None) -> Path:
    """<dir or SLURM_TMPDIR or TMPDIR or /tmp>/hpctrain-<user>/job-<id>/<node>, each level 0700 and ours."""
    env = dict(os.environ) if env is None else env
    base = Path(cfg.dir or env.get("SLURM_TMPDIR") or env.get("TMPDIR") or "/tmp").expanduser()
    if not base.is_dir():
        # a setting the user fixes (a typo, a scratch volume not mounted on this node): one line, exit 2
        raise UserError(
            f"staging folder {base} does not exist (data.staging.dir, SLURM_TMPDIR or TMPDIR); nearest existing "
            f"folder: {nearest_existing_folder(base)}"
        )
    job = job_id or env.get("SLURM_JOB_ID") or "local"
    parts = [f"hpctrain-{getpass.getuser()}", f"job-{job}", socket.gethostname().split(".")[0]]
    path = base
    for part in parts:
        path = path / re.sub(r"[^A-Za-z0-9._-]", "_", part)
        path.mkdir(mode=0o700, exist_ok=True)
        st = path.lstat()
        # in a shared /tmp someone else could have made the folder (or a symlink) first
        if path.is_symlink() or st.st_uid != os.getuid():
            raise UserError(f"staging folder {path} is not a folder owned by you; set data.staging.dir")
        if st.st_mode & 0o077:
            os.chmod(path, 0o700)
    return path


def local_name(uri: str) -> str:
    """A flat, unique, safe file name for a URI: hash prefix + sanitised base name (no '/', no '..')."""
    base = uri.rstrip("/").rsplit("/", 1)[-1].split("?", 1)[0]
    base = re.sub(r"[^A-Za-z0-9._-]", "_", base).lstrip(".")[-80:] or "file"
    return f"{hashlib.sha1(uri.encode()).hexdigest()[:12]}-{base}"


def remove_entry(path: Path) -> None:
    """Remove a file, symlink or folder tree at `path` if there (a leftover of any kind; never follows links)."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    except OSError as err:  # someone else's entry in our folder? say so, do not stop staging for it
        log.warning("cannot remove %s: %s", path, err)


def remove_dead_partials(root: Path) -> None:
    """Remove the temporaries (`fsutil.temp_name`) of downloads whose process is dead: a killed job's, files or
    folders pelicanfs made. Those of live processes (another Stager on this node), and names we did not make,
    stay."""
    for tmp in root.glob(".*.tmp-*"):
        pid, host = temp_writer(tmp)
        if host == HOST and pid is not None and pid != os.getpid() and not pid_alive(pid):
            kind = "folder" if tmp.is_dir() and not tmp.is_symlink() else "file"
            remove_entry(tmp)
            log.info("removed leftover partial %s %s", kind, tmp.name)
