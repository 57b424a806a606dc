"""Shared pytest configuration and helpers.

- In CI (CI=true) a skipped test counts as a failure.
- ``watch_processes``: :class:`ProcessWatcher`, which records the processes a block starts and reports leftovers.
- ``load_tool``: imports ``tools/<name>.py`` as a module, without putting tools/ on ``sys.path``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest
from needs import IN_CI

ROOT = Path(__file__).resolve().parents[1]



# ------------------------------------------------------------------------------------ make test -n 2
#: Tests that share one expensive fixture or one machine-wide resource run in one group, on one pytest-xdist worker:
#: the network-namespace cluster and the test Slurm; the clinic runner's remembered runs.
_GROUPS = {"cluster": "cluster", "slurm": "cluster", "test_clinic.py": "clinic", "test_exercises.py": "clinic"}
#: the longest groups start first, then the browser's notebooks, nbval's notebooks, and the rest fill the gaps
_FIRST = ("clinic", "cluster")
_NOTEBOOK_IN_ID = re.compile(r"\[(\d\d)[_\]]")


def xdist_group_of(nodeid: str) -> str:
    """The group a test runs in under ``make test`` (``-n 2 --dist loadgroup``): a notebook's nbval cells run in
    order in one kernel; a file's module fixtures are built once; the groups in ``_GROUPS`` stay together; and a
    browser test that names a notebook in its id ([NN_...] or [NN]) runs beside that notebook's Run All, whose
    result the worker's session keeps (each worker runs its own JupyterLab)."""
    path = nodeid.split("::", 1)[0]
    parts = Path(path).parts
    for part in parts:
        if part in _GROUPS:
            return _GROUPS[part]
    if "browser" in parts:
        m = _NOTEBOOK_IN_ID.search(nodeid)
        return f"browser:{m.group(1)}" if m else f"browser:{parts[-1]}"
    return path


def _start_order(nodeid: str) -> int:
    group = xdist_group_of(nodeid)
    if group in _FIRST:
        return _FIRST.index(group)
    return len(_FIRST) + (0 if group.startswith("browser:") else 1 if group.endswith(".ipynb") else 2)


#: The controller's folder of launches shared between the notebooks' kernels (labkit.dist.SHARE_ENV), and the
#: environment of nbval's kernels, handed to the xdist workers. Read only by the tests (tests/browser/conftest.py).
LAUNCH_SHARE_VAR = "LABKIT_TEST_LAUNCH_SHARE"
NBVAL_KERNEL_ENV_VAR = "LABKIT_TEST_NBVAL_KERNEL_ENV"


def pytest_configure(config):
    """Folders for one test run, made by the controlling process before the xdist workers start, so that they
    inherit them; removed at the end. Each is 0700: only this user.

    - the clinic's runs, shared by every process (labkit.clinic.runner.SHARE_ENV): the clinic's unit tests, notebook
      13 under nbval and in the browser run each case once;
    - the notebooks' launches (labkit.dist.SHARE_ENV), for the kernels only: nbval's reference copies and the
      browser's learner copies make each torchrun launch once (the unit tests always launch);
    - nbval's kernels import only what `make lab` installs (tests/lab_env.py), as the browser's do: the reference
      notebooks are checked in the learner's environment, and the two passes' launches are the same launches.
    """
    if not hasattr(config, "workerinput") and not os.environ.get("LABKIT_CLINIC_SHARE"):
        config._labkit_clinic_share = tempfile.mkdtemp(prefix="labkit-clinic-share-")
        os.environ["LABKIT_CLINIC_SHARE"] = config._labkit_clinic_share
    if not hasattr(config, "workerinput") and not os.environ.get(LAUNCH_SHARE_VAR):
        from lab_env import blocker_env

        config._labkit_launch_share = tempfile.mkdtemp(prefix="labkit-launch-share-")
        os.environ[LAUNCH_SHARE_VAR] = config._labkit_launch_share
        kernel_env = blocker_env(Path(config._labkit_launch_share) / "lab_env",
                                 {k: v for k, v in os.environ.items() if k == "PYTHONPATH"})
        kernel_env["LABKIT_LAUNCH_SHARE"] = config._labkit_launch_share
        os.environ[NBVAL_KERNEL_ENV_VAR] = json.dumps(kernel_env)
    if os.environ.get(NBVAL_KERNEL_ENV_VAR):
        _nbval_kernels_get(json.loads(os.environ[NBVAL_KERNEL_ENV_VAR]))


def _nbval_kernels_get(env: dict[str, str]) -> None:
    """nbval's own kernel spec (``--nbval-current-env``: this Python), with ``env`` added to the kernel's environment."""
    try:
        from nbval import kernel as nbval_kernel
    except ImportError:  # nbval is not installed: no notebooks are collected either
        return
    manager = nbval_kernel.NbvalKernelspecManager
    if getattr(manager, "_labkit_env", None) is not None:
        manager._labkit_env = env
        return
    plain = manager.get_kernel_spec

    def get_kernel_spec(self, kernel_name):
        spec = plain(self, kernel_name)
        if kernel_name == nbval_kernel.CURRENT_ENV_KERNEL_NAME:
            spec.env = {**(spec.env or {}), **manager._labkit_env}
        return spec

    manager._labkit_env = env
    manager.get_kernel_spec = get_kernel_spec


def pytest_unconfigure(config):
    for attr, var in (("_labkit_clinic_share", "LABKIT_CLINIC_SHARE"), ("_labkit_launch_share", LAUNCH_SHARE_VAR)):
        folder = getattr(config, attr, None)
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
            os.environ.pop(var, None)
    if getattr(config, "_labkit_launch_share", None):
        os.environ.pop(NBVAL_KERNEL_ENV_VAR, None)


def pytest_collection_modifyitems(session, config, items):
    """Long groups first (a stable sort: within a group the order is pytest's, or tests/browser/conftest.py's)."""
    items.sort(key=lambda item: _start_order(item.nodeid))


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` by :func:`xdist_group_of`, in collection order. (pytest-xdist's own loadgroup reads
    ``xdist_group`` marks through ``Item._nodeid``, which pytest 9 no longer uses.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group_of(nodeid)

    config.option.loadscopereorder = False
    return GroupScheduling(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if IN_CI and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped in CI (CI=true), which counts as a failure: {reason}"


class ProcessWatcher:
    """Poll this process's descendants while the block runs; afterwards report leftovers.

    ``leftovers()`` returns the recorded processes that still run (same pid and start time, not a zombie)
    plus any process on the machine that sits in one of their process groups or sessions.
    """

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self.seen: dict[tuple[int, float], tuple[int, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            for p in me.children(recursive=True):
                try:
                    key = (p.pid, p.create_time())
                    if key not in self.seen and key not in self.before:
                        self.seen[key] = (os.getpgid(p.pid), os.getsid(p.pid))
                except (psutil.Error, OSError):
                    pass
            time.sleep(self.interval)

    def __enter__(self) -> ProcessWatcher:
        # children that exist before the launch (a session's JupyterLab server, a test Slurm) are not ours
        self.before = set()
        for p in psutil.Process().children(recursive=True):
            try:
                self.before.add((p.pid, p.create_time()))
            except psutil.Error:
                pass
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def groups(self) -> set[int]:
        mine = {os.getpgrp(), os.getsid(0)}
        return {g for pair in self.seen.values() for g in pair} - mine

    def leftovers(self, wait: float = 2.0) -> list[str]:
        deadline = time.monotonic() + wait
        while True:
            alive = []
            for pid, ctime in self.seen:
                try:
                    p = psutil.Process(pid)
                    if p.create_time() == ctime and p.status() != psutil.STATUS_ZOMBIE:
                        alive.append(f"{pid} {' '.join(p.cmdline())[:80]}")
                except psutil.Error:
                    pass
            groups = self.groups
            for p in psutil.process_iter(["pid", "cmdline"]):
                try:
                    if p.pid != os.getpid() and p.status() != psutil.STATUS_ZOMBIE and (
                            os.getpgid(p.pid) in groups or os.getsid(p.pid) in groups):
                        alive.append(f"{p.pid} (in a launch group) {' '.join(p.cmdline())[:80]}")
                except (psutil.Error, OSError):
                    pass
            if not alive or time.monotonic() > deadline:
                return sorted(set(alive))
            time.sleep(0.1)


@pytest.fixture(scope="session", autouse=True)
def _progress_record_in_tmp(tmp_path_factory):
    """labkit.check records every graded answer (see labkit.check.progress_path): in the tests, in a temporary
    file (LABKIT_PROGRESS, inherited by the kernels the tests start), never in the home folder or the checkout."""
    before = os.environ.get("LABKIT_PROGRESS")
    os.environ["LABKIT_PROGRESS"] = str(tmp_path_factory.mktemp("progress") / "progress.json")
    yield
    if before is None:
        os.environ.pop("LABKIT_PROGRESS", None)
    else:
        os.environ["LABKIT_PROGRESS"] = before


@pytest.fixture
def one_torch_thread():
    """Run a test with one torch thread (tiny tensors: one thread is fastest, and two threads on a shared 2-core
    machine can be 20x slower), then restore the count. Modules opt in with
    ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def watch_processes() -> type[ProcessWatcher]:
    """The :class:`ProcessWatcher` class: ``with watch_processes() as w: ...; assert not w.leftovers()``.

    Session-scoped (it is a class, no state), so module-scoped fixtures can use it too."""
    return ProcessWatcher


def _load_tool(name: str):
    spec = importlib.util.spec_from_file_location(f"labkit_tools_{name}", ROOT / "tools" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def load_tool():
    """``load_tool("nbbuild")`` imports tools/nbbuild.py as a module (cached), without a sys.path edit."""
    cache: dict[str, object] = {}

    def load(name: str):
        if name not in cache:
            cache[name] = _load_tool(name)
        return cache[name]

    return load
