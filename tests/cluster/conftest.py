"""Fixtures for the cluster tests: a login host and two compute nodes in network namespaces (nscluster.py).

One cluster serves the whole session (it starts in about 2 s); each test cancels its own jobs and stops its own
servers, and the session's finalizer tears everything down and fails the run if anything survived. Needs root and
``apt-get install iproute2 munge slurmctld slurmd slurm-client openssh-server``; without them the tests skip, and
with ``CI=true`` they fail instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from classenv import ClassEnv
from needs import require_root_and_tools
from nscluster import APT_PACKAGES, MARKER, ClusterError, ClusterUser, NsCluster, cleanup_stale, missing_tools

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def cluster() -> Iterator[NsCluster]:
    """The running namespace cluster; torn down at the end of the session (and checked to be gone)."""
    require_root_and_tools("the namespace cluster", missing_tools(), APT_PACKAGES)
    stale = cleanup_stale()
    if stale:
        print(f"\nremoved the leftovers of earlier cluster runs: {', '.join(stale)}")
    c = NsCluster()
    try:
        c.up()
    except ClusterError as exc:
        pytest.fail(f"the namespace cluster did not start: {exc}", pytrace=False)
    print(f"\nnamespace cluster {c.run_id} up in {c.up_seconds:.1f} s ({c.base})")
    try:
        yield c
    finally:
        t0 = time.monotonic()
        problems = c.down()
        print(f"\nnamespace cluster {c.run_id} down in {time.monotonic() - t0:.1f} s")
        names = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
        problems += [f"namespace {ns} survived" for ns in c.ns.values() if ns in names]
        problems += [f"{c.base} survived"] if c.base.exists() else []
        assert not problems, f"the namespace cluster was not torn down cleanly: {problems}"


@pytest.fixture(scope="session")
def class_env() -> Iterator[ClassEnv]:
    """The class environment (a venv every test user can run; cached in /tmp, see classenv.py)."""
    try:
        with ClassEnv(log=lambda msg: print(f"\n{msg}")) as env:
            yield env
    except RuntimeError as exc:
        pytest.fail(f"the class environment could not be built: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def workbook(cluster: NsCluster) -> Path:
    """A world-readable copy of this checkout (git's tracked and unignored files) that the test users' jobs use.

    It stands for the instructor's class copy: LABKIT_ROOT (slurm/env.sh) for every job, and first on the jobs'
    PYTHONPATH, so that the labkit under test is the one that runs, not the cached class environment's copy.
    """
    dest = cluster.base / "workbook"
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True, timeout=60).stdout
    old = os.umask(0o022)
    try:
        for rel in filter(None, listed.decode().split("\0")):
            src = REPO / rel
            if src.is_file() and not src.is_symlink():
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / rel)
                (dest / rel).chmod(0o755 if os.access(src, os.X_OK) else 0o644)
    finally:
        os.umask(old)
    return dest


@pytest.fixture(scope="session")
def student_env(cluster: NsCluster, class_env: ClassEnv, workbook: Path):
    """``student_env(user)``: what a student's shell on the login host holds (the cluster, the class environment
    through slurm/env.sh's settings, the class copy of the workbook)."""
    def make(user: ClusterUser) -> dict[str, str]:
        env = {k: v for k, v in cluster.env.items() if k in ("SLURM_CONF", MARKER, "LANG", "LC_ALL", "TERM")}
        env.update(HOME=str(user.home), USER=user.name, LOGNAME=user.name, PATH="/usr/local/bin:/usr/bin:/bin",
                   LABKIT_ROOT=str(workbook), LABKIT_ENV="venv", LABKIT_VENV=str(class_env.path),
                   PYTHONPATH=str(workbook), OMP_NUM_THREADS="1")
        return env

    return make
