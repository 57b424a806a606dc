"""What a test needs from the machine, checked the same way everywhere: skip where it is missing, fail in CI.

``IN_CI`` is true under ``CI=true`` (where tests/conftest.py also turns every skip into a failure);
:func:`unavailable` fails there and skips elsewhere; :func:`require_root_and_tools` is the check the Slurm
fixtures (tests/slurm, tests/cluster) make before they start daemons.
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
