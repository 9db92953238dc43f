"""What can be checked about a configuration before any work is done: inputs, token, run folder, resume path.

`hpctrain submit --check` runs these checks on the login node (and, from the sbatch templates, in the batch
shell of the allocation); `hpctrain train` runs them again before it builds anything. Each mistake is one line
naming the setting and what to do. Cheap by design (a few stats, one temporary file, no listing of a whole
data set) and free of torch: login nodes are slow.

Remote inputs (pelican://, osdf:///, https://, ...) are checked for their syntax only: their existence is
the stager's business on the compute node, and a login node may not reach the federation.
"""

from __future__ import annotations

import glob
import os
import tempfile
import urllib.parse
from pathlib import Path
from typing import Any

import fsspec

from hpctrain.config.schema import ConfigBase
from hpctrain.fsutil import nearest_existing_folder, not_yours
from hpctrain.remote.auth import resolve_token
from hpctrain.remote.uris import PELICAN_SCHEMES, has_magic, is_remote, magic_prefix, split_federation
from hpctrain.runtime.torch_build import cuda_problem
from hpctrain.train.resume_forms import GIVEN_MISSING


def check_config(cfg: ConfigBase, writable: bool = True, device: bool = True) -> list[str]:
    """Every mistake found, one line each (empty when none). `writable`: also probe the output folders;
    `device`: train.device=cuda needs a CUDA build of torch."""
    errors: list[str] = []
    cuda = cuda_problem(cfg.train.device) if device else None
    if cuda:
        errors.append(cuda)
    data = cfg.data
    remote = False
    for name in type(data).input_paths:
        value = getattr(data, name)
        for path in [value] if isinstance(value, str) else list(value or ()):
            problem = _remote_problem(str(path)) if is_remote(str(path)) else _local_problem(str(path))
            remote = remote or is_remote(str(path))
            if problem:
                errors.append(f"data.{name}: {problem}")
    errors += _token_problems(data.pelican, remote)
    scratch = data.staging.dir
    if remote and scratch and not Path(scratch).expanduser().is_dir():
        errors.append(
            f"data.staging.dir={scratch}: no such folder{_nearest(scratch)}; remote inputs are staged there"
        )
    if writable:
        run_dir = cfg.run.dir
        outputs = [("run.out_dir", run_dir)]
        if cfg.logging.tensorboard.dir:
            outputs.append(("logging.tensorboard.dir", Path(cfg.logging.tensorboard.dir)))
        if cfg.logging.wandb.enabled and cfg.logging.wandb.dir:
            outputs.append(("logging.wandb.dir", Path(cfg.logging.wandb.dir)))
        for key, folder in outputs:
            problem = _unwritable(folder)
            if problem:
                errors.append(f"{key}: {problem}")
        for folder, what in ((run_dir, "run folder"), (run_dir / "checkpoints", "checkpoints folder")):
            problem = not_yours(folder, what)
            if problem:
                errors.append(f"{problem}; refusing to use it (choose another run.out_dir or run.name)")
    resume = cfg.checkpoint.resume
    # A file, or a run folder (its latest checkpoint); the other forms are checked against the run folder.
    if (
        cfg.checkpoint.resume_form.kind == "given"
        and not is_remote(resume)
        and not Path(resume).expanduser().exists()
    ):
        errors.append(f"checkpoint.resume={resume}: {GIVEN_MISSING}")
    return errors


def _local_problem(path: str) -> str | None:
    local = os.path.expanduser(path.removeprefix("file://"))
    if has_magic(local):
        matches = glob.iglob(local, recursive=True)
        if next((m for m in matches if os.path.isfile(m)), None) is None:
            return f"{path}: no file matches this pattern{_nearest(magic_prefix(local))}"
        return None
    if os.path.isdir(local):
        for _, dirs, names in os.walk(local):
            if any(not n.startswith(".") for n in names):
                return None
            dirs[:] = [d for d in dirs if not d.startswith(".")]
        return f"{path}: the folder holds no file"
    if not os.path.exists(local):
        return (
            f"{path}: no such file or folder{_nearest(local)}; if the data lives on a shared or scratch "
            "volume, check that it is mounted on this node"
        )
    if not os.access(local, os.R_OK):
        return f"{path}: not readable"
    return None


def _nearest(path: str) -> str:
    """Where the path stops existing: the usual cause is a volume not mounted on this node, or a typo."""
    return f" (nearest existing folder: {nearest_existing_folder(path)})"


def _remote_problem(uri: str) -> str | None:
    scheme = urllib.parse.urlsplit(uri).scheme.lower()
    if scheme in PELICAN_SCHEMES:
        path = split_federation(uri, None)[1]
        if not path.strip("/"):
            return f"{uri}: no namespace path (e.g. {scheme}:///<namespace>/<file or folder>)"
        return None
    if scheme not in fsspec.available_protocols():
        return f"{uri}: unknown URL scheme {scheme!r} (use a local path, pelican://, osdf:///, https://, ...)"
    return None


def _token_problems(pelican: Any, remote: bool) -> list[str]:
    """An unreadable or empty token file (data.pelican.token_file, or BEARER_TOKEN_FILE for remote inputs),
    a missing CA bundle."""
    problems = []
    if pelican.token_file or (remote and os.environ.get("BEARER_TOKEN_FILE")):
        try:
            resolve_token(pelican)
        except ValueError as exc:
            problems.append(str(exc))
    if pelican.ca_file and not Path(pelican.ca_file).is_file():
        problems.append(f"data.pelican.ca_file: {pelican.ca_file} is not a file")
    return problems


def _unwritable(folder: Path) -> str | None:
    """Why `folder` cannot be created and written (None if it can): its nearest existing ancestor decides."""
    nearest = nearest_existing_folder(folder)
    if not nearest.is_dir():
        return f"{folder} cannot be created: {nearest} is a file, not a folder"
    try:
        # A real probe: permission bits say nothing on read-only mounts, ACLs or for root.
        fd, probe = tempfile.mkstemp(prefix=".hpctrain-check-", dir=nearest)
    except OSError as exc:
        where = "" if nearest == folder.expanduser().absolute() else f" (nearest existing folder: {nearest})"
        return f"{folder} is not writable{where}: {exc.strerror}; choose another folder"
    os.close(fd)
    os.unlink(probe)
    return None
