"""Joining the process group: a rendezvous that fails is one line naming the rank and the address."""

from __future__ import annotations

import socket
from pathlib import Path

from tests.conftest import clean_env, hpctrain


def test_a_rendezvous_port_held_on_the_node_is_one_line_naming_it(tmp_path: Path) -> None:
    with socket.socket() as holder:  # another process on the node listens on the job's port
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        env = clean_env(
            RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
        )
        done = hpctrain("train", "run.name=d", "train.total_updates=2", cwd=tmp_path, env=env, timeout=120)
    lines = [ln for ln in done.err.splitlines() if ln.strip()]
    assert done.code == 1, done.err
    assert lines[-1].startswith(f"error: rank 0 cannot listen on the rendezvous port 127.0.0.1:{port}:"), (
        lines
    )
    assert "MASTER_PORT" in lines[-1] and "EADDRINUSE" in lines[-1]
    assert "Traceback" not in done.err
