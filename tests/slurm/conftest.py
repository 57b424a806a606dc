"""Fixtures that start a REAL single-node Slurm (munged, slurmctld, slurmd) for the slurm/ script tests.

The cluster lives in a temporary folder with its own munge key, slurm.conf, free ports and fake GPUs
(see local_cluster.py). It needs root and the Debian packages ``slurmctld slurmd slurm-client munge``.
Where they are missing the tests skip; in CI (``CI=true``) the fixture fails instead, loudly.
"""

from __future__ import annotations

import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from local_cluster import APT_PACKAGES, ClusterUnavailable, LocalCluster, missing_tools
from needs import require_root_and_tools

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[LocalCluster]:
    """A running single-node Slurm with 8 CPUs and 4 fake GPUs; stopped (and its jobs killed) at the end."""
    require_root_and_tools("the local Slurm", missing_tools(), APT_PACKAGES)
    # Not under pytest's basetemp: that is mode 0700, and munged runs as user munge.
    base = Path(tempfile.mkdtemp(prefix="labkit-slurm-"))
    cluster = LocalCluster(base, cpus=8, gpus=4)
    try:
        cluster.start()
    except ClusterUnavailable as exc:
        pytest.fail(f"the local Slurm did not start: {exc}", pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()
        left = cluster.marked_pids()
        assert not left, f"processes of the local Slurm survived stop(): {left}"
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture()
def job_env(slurm_cluster: LocalCluster, tmp_path: Path) -> dict[str, str]:
    """The environment a test submits with: this cluster, a private HOME, this Python's environment."""
    env = slurm_cluster.env
    home = tmp_path / "home"
    home.mkdir()
    env["HOME"] = str(home)
    env["LABKIT_ROOT"] = str(ROOT)
    if sys.prefix != sys.base_prefix:  # a venv: let slurm/env.sh activate it like a user's
        env["LABKIT_ENV"], env["LABKIT_VENV"] = "venv", sys.prefix
    else:
        env["LABKIT_ENV"] = "none"
        env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    for var in ("LABKIT_CONN_DIR", "LABKIT_JUPYTER_BIND", "JUPYTER_TOKEN", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR"):
        env.pop(var, None)
    env["OMP_NUM_THREADS"] = "1"
    return env


def node_is_loopback(node: str) -> bool:
    """Whether ``node`` resolves to loopback addresses only (tests never listen anywhere else)."""
    try:
        return all(i[4][0].startswith("127.") for i in socket.getaddrinfo(node, None, socket.AF_INET))
    except socket.gaierror:
        return False
