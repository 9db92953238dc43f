"""SLURM node lists expand as SLURM expands them: `scontrol show hostnames` is the oracle (it needs only a
configuration file to parse, no controller)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpctrain.runtime.slurm import expand_hostnames


@pytest.mark.parametrize(
    ("node_list", "names"),
    [
        ("localhost", ["localhost"]),
        ("n[1-3]", ["n1", "n2", "n3"]),
        ("gpu[08-11]", ["gpu08", "gpu09", "gpu10", "gpu11"]),  # the lower bound's padding
        ("n[1-2,7],c5", ["n1", "n2", "n7", "c5"]),
        ("rack[1-2]-n[3-4]", ["rack1-n3", "rack1-n4", "rack2-n3", "rack2-n4"]),  # the last group fastest
    ],
)
def test_node_lists_expand(node_list: str, names: list[str]) -> None:
    assert expand_hostnames(node_list) == names


@pytest.mark.parametrize("node_list", ["n[3-1]", "n[1-2", "n1-2]", "n[a-b]", "n[1,,2]", "n1,,n2", "n[[1]]"])
def test_malformed_node_lists_are_refused(node_list: str) -> None:
    with pytest.raises(ValueError, match=r"host list|not a number"):
        expand_hostnames(node_list)


@pytest.fixture(scope="module")
def scontrol(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, str]]:
    exe = shutil.which("scontrol") or "/usr/bin/scontrol"
    assert Path(exe).exists(), "scontrol is installed by the test command (hpc/local-cluster install)"
    conf = tmp_path_factory.mktemp("slurm") / "slurm.conf"
    conf.write_text("ClusterName=t\nSlurmctldHost=localhost\nNodeName=n1 CPUs=1\nPartitionName=p Nodes=n1\n")
    return exe, {"SLURM_CONF": str(conf), "PATH": "/usr/bin:/bin"}


_low = st.tuples(st.integers(0, 120), st.integers(0, 3)).map(lambda t: str(t[0]).zfill(t[1]))  # "7", "007"
_range = st.tuples(_low, st.integers(0, 4)).map(lambda t: t[0] if not t[1] else f"{t[0]}-{int(t[0]) + t[1]}")
_group = st.lists(_range, min_size=1, max_size=3).map(lambda r: "[" + ",".join(r) + "]")
_prefix = st.sampled_from(["n", "gpu", "rack", "node-", "c"])
_item = st.one_of(
    _prefix.map(lambda p: p + "1"),
    st.tuples(_prefix, _group).map("".join),
    st.tuples(_prefix, _group, st.sampled_from(["-n", "x"]), _group).map("".join),
)
_node_list = st.lists(_item, min_size=1, max_size=3).map(",".join)


@settings(max_examples=60, deadline=None)
@given(node_list=_node_list)
def test_expansion_matches_scontrol(scontrol: tuple[str, dict[str, str]], node_list: str) -> None:
    exe, env = scontrol
    done = subprocess.run([exe, "show", "hostnames", node_list], env=env, capture_output=True, text=True)
    assert done.returncode == 0 and "Invalid" not in done.stderr, (node_list, done.stderr)
    assert expand_hostnames(node_list) == done.stdout.split(), node_list


def _template_master_port(job_id: int) -> int:
    """MASTER_PORT as slurm/common.sh computes it: its own line, run by bash."""
    line = next(
        ln.strip()
        for ln in (Path(__file__).parents[2] / "slurm" / "common.sh").read_text().splitlines()
        if ln.strip().startswith("export MASTER_PORT=")
    )
    out = subprocess.run(
        ["bash", "-c", f'{line}; echo "$MASTER_PORT"'],
        env={"SLURM_JOB_ID": str(job_id), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout)


@pytest.mark.parametrize("job_id", [0, 1, 3, 12345, 19999, 20768, 39999, 9_876_543])
def test_the_rendezvous_port_is_below_the_ephemeral_range_and_the_same_in_python_and_sbatch(
    job_id: int,
) -> None:
    # An ephemeral port (32768+) may be held by any outgoing connection on the node; the test cluster's
    # daemons take ports below 12000 (hpc/local-cluster).
    from hpctrain.runtime.dist import master_port

    port = master_port(str(job_id))
    assert 12000 <= port < 32768
    assert _template_master_port(job_id) == port
    assert master_port(str(job_id + 1)) != port  # consecutive jobs on one node do not collide
