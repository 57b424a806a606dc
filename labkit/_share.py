"""Runs shared between the processes of one test run, through a private folder (the test suite's, never a learner's).

``make test`` runs every notebook more than once (strict nbval on the reference copies, the browser on the learner
copies) and the unit tests run some of the same distributed work. When ``tests/conftest.py`` names a folder in an
environment variable (:data:`labkit.clinic.runner.SHARE_ENV` for the clinic's runs, :data:`labkit.dist.SHARE_ENV`
for :func:`labkit.dist.launch`), the first process to need a run makes it and stores it there; the others, keyed by
everything that changes the run, read it. Without the variable nothing is shared and nothing here runs.

The folder must be a directory owned by this user that nobody else can write (the suite makes it 0700), so a stored
run is never read from a file someone else could have written; files are JSON, never pickle. Introduced with
notebook 13 (the clinic), used by notebook 09's launches.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__: list[str] = []  # private helpers of labkit.clinic.runner and labkit.dist


def folder(env_var: str) -> str | None:
    """The sharing folder that ``$env_var`` names, if it is a directory owned by this user that nobody else can
    write; otherwise None (nothing is shared)."""
    name = os.environ.get(env_var, "").strip()
    if not name:
        return None
    try:
        st = os.stat(name)
    except OSError:
        return None
    ok = stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022
    return name if ok else None


def path_for(share: str, context: Any) -> str:
    """The file, in ``share``, of the run that ``context`` (JSON-serialisable: everything that changes it) names."""
    digest = hashlib.sha256(json.dumps(context, sort_keys=True, default=str).encode()).hexdigest()[:40]
    return os.path.join(share, digest + ".json")


@contextlib.contextmanager
def locked(paths: list[str], waiting: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold ``<path>.lock`` of every path (in one order, so that no two processes wait on each other), waiting while
    another process makes those runs; ``waiting()`` is called while it waits (it may raise to stop waiting)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - no POSIX locks: each process makes its own runs
        yield
        return
    fds: list[int] = []
    try:
        for path in sorted(set(paths)):
            fds.append(os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o600))
            while True:
                try:
                    fcntl.flock(fds[-1], fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if waiting is not None:
                        waiting()
                    time.sleep(0.05)
        yield
    finally:
        for fd in fds:
            os.close(fd)


def load(path: str) -> Any:
    """The JSON another process stored at ``path`` (None if there is none, or it cannot be read)."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def store(path: str, doc: Any) -> None:
    """Write ``doc`` as JSON for the other processes (atomically, 0600); a failure only costs them a run."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh)
        os.replace(tmp, path)
    except (OSError, TypeError, ValueError):
        with contextlib.suppress(OSError):
            os.unlink(tmp)
