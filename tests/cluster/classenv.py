"""The "class environment" for the cluster tests: a venv that every test user can execute, built once and cached.

A class runs its jobs from one shared environment (docs/instructor.md, section 2). The workbook's own .venv
cannot serve here: its Python lives wherever the developer's interpreter lives (on these machines under
/root, mode 0700), and a job that runs as a test user gets "Permission denied" at execve. So this builds
``/usr/bin/python3 -m venv`` with torch (tools/install_torch.py, the Makefile's pin) and ``.[hub]``: labkit
with its dependencies, JupyterHub, batchspawner, the idle culler, nbgitpuller and the proxy.

Building takes about a minute on 2 cores (several on a busy machine), so it is cached in
``/tmp/labkit-classenv-<key>``, where the key hashes what decides the contents (labkit's dependencies and hub
extra, the torch pin, the base Python's version): CI builds it once per run, a developer once per dependency
change. Readers hold a shared lock on ``<dir>.lock`` while they use it; a builder holds the exclusive lock, writes
``.complete`` last, and removes older caches nobody holds.

The labkit *inside* the cache may be older than the checkout (only the dependencies decide the key): the tests
put their own copy of the checkout first on PYTHONPATH, so the labkit under test is the one that runs.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the whole pyproject.toml decides the key
    tomllib = None

__all__ = ["BASE_PYTHON", "ClassEnv", "class_env_key"]

BASE_PYTHON = Path(os.environ.get("LABKIT_CLASSENV_PYTHON", "/usr/bin/python3"))
CACHE_ROOT = Path(os.environ.get("LABKIT_CLASSENV_CACHE", "/tmp"))
REPO = Path(__file__).resolve().parents[2]


def _torch_spec() -> str:
    m = re.search(r"^TORCH\s*\?=\s*(\S+)", (REPO / "Makefile").read_text(), re.MULTILINE)
    return m.group(1) if m else "torch==2.13.0"


def class_env_key() -> str:
    """What decides the environment's contents, hashed: labkit's dependencies and its hub extra (pyproject.toml),
    the torch pin, the base Python's version. (Other extras may change without a rebuild.)"""
    text = (REPO / "pyproject.toml").read_text()
    if tomllib is None:
        wanted: object = {"pyproject": text, "torch": _torch_spec()}
    else:
        project = tomllib.loads(text)["project"]
        wanted = {"dependencies": project["dependencies"], "hub": project["optional-dependencies"]["hub"],
                  "torch": _torch_spec()}
    version = subprocess.run([str(BASE_PYTHON), "-c", "import sys; print(sys.version)"], capture_output=True,
                             text=True, check=True, timeout=30).stdout
    h = hashlib.sha256(json.dumps(wanted, sort_keys=True).encode() + b"\0" + version.encode())
    return h.hexdigest()[:12]


class ClassEnv:
    """``with ClassEnv() as env:`` builds the cached venv if needed and holds it (shared lock) until exit."""

    def __init__(self, log=print) -> None:
        self.key = class_env_key()
        self.path = CACHE_ROOT / f"labkit-classenv-{self.key}"
        self.python = self.path / "bin" / "python"
        self._lock_path = CACHE_ROOT / f"labkit-classenv-{self.key}.lock"
        self._fd: int | None = None
        self.log = log
        self.built_seconds: float | None = None

    def __enter__(self) -> ClassEnv:
        self._fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_SH)
        if not (self.path / ".complete").exists():
            fcntl.flock(self._fd, fcntl.LOCK_EX)  # drops the shared lock; another builder may finish first
            if not (self.path / ".complete").exists():
                self._build()
            fcntl.flock(self._fd, fcntl.LOCK_SH)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the lock
            self._fd = None

    def _build(self) -> None:
        import time

        t0 = time.monotonic()
        shutil.rmtree(self.path, ignore_errors=True)  # a build that died half-way
        if not BASE_PYTHON.exists():
            raise RuntimeError(f"{BASE_PYTHON} is missing: the class environment needs a Python every user can run "
                               "(apt-get install python3-venv)")
        self.log(f"building the class environment {self.path} (cached; about a minute)")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH", "PIP_TARGET"))}
        # No byte-compiling at install: it is most of the build on 2 cores (torch alone has ~5000 modules).
        # The jobs' users cannot write __pycache__ here, so an import compiles in memory: `import torch` takes
        # seconds longer, once per kernel, far less than compiling everything on every cold build.
        # (pip reads PIP_NO_COMPILE as the value of its "compile" switch, so "0" is what turns compiling off;
        # measured: "1" still compiles.)
        env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_COMPILE="0")

        def run(*argv: str) -> None:
            res = subprocess.run(list(argv), env=env, capture_output=True, text=True, timeout=900,
                                 preexec_fn=lambda: os.umask(0o022), check=False)
            if res.returncode != 0:
                raise RuntimeError(f"{' '.join(argv)} failed ({res.returncode}):\n{res.stdout[-2000:]}"
                                   f"\n{res.stderr[-3000:]}")

        run(str(BASE_PYTHON), "-m", "venv", str(self.path))
        run(str(self.python), str(REPO / "tools" / "install_torch.py"), "--spec", _torch_spec())
        # A copy, not an editable link: the class needs no access to the checkout (docs/instructor.md).
        run(str(self.python), "-m", "pip", "install", "-q", f"{REPO}[hub]")
        self.path.chmod(0o755)  # every user may read and run it (the umask above), nobody else may write
        (self.path / ".complete").write_text(f"{sys.version}\n")
        self.built_seconds = time.monotonic() - t0
        self.log(f"class environment built in {self.built_seconds:.0f} s")
        self._prune()

    def _prune(self) -> None:
        """Remove other cached class environments that no run holds (their lock is free)."""
        for lock in CACHE_ROOT.glob("labkit-classenv-*.lock"):
            if lock == self._lock_path:
                continue
            fd = os.open(lock, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                shutil.rmtree(lock.with_suffix(""), ignore_errors=True)
                lock.unlink(missing_ok=True)
            finally:
                os.close(fd)
