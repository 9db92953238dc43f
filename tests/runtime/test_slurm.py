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
