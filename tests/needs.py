"""What a test needs from the machine, checked the same way everywhere: skip where it is missing, fail in CI.

``IN_CI`` is true under ``CI=true`` (where tests/conftest.py also turns every skip into a failure);
:func:`unavailable` fails there and skips elsewhere; :func:`require_root_and_tools` is the check the Slurm
fixtures (tests/slurm, tests/cluster) make before they start daemons; :func:`finishes` fails a call that hangs
(a reader blocked on a FIFO) instead of hanging the test run.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import pytest

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def unavailable(reason: str) -> None:
    """Fail in CI, skip elsewhere: a missing tool must never pass silently in CI."""
    if IN_CI:
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    pytest.skip(reason)


def require_root_and_tools(what: str, missing: Sequence[str], apt_packages: str) -> None:
    """Make ``what`` (e.g. "the local Slurm") unavailable unless no tool is ``missing`` and this runs as root."""
    if missing:
        unavailable(f"{what} needs {', '.join(missing)} (apt-get install -y {apt_packages})")
    if os.geteuid() != 0:
        unavailable(f"{what} needs root")


def finishes(fn, timeout: float = 20.0, fifo=None):
    """Run ``fn()`` in a thread and return its result; fail if it is still running after ``timeout`` seconds
    (a reader blocked on ``fifo`` is then released, so that the test run goes on)."""
    import threading

    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the test below
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        if fifo is not None:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail(f"still running after {timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]
