"""Shared pytest configuration: in CI (CI=true) a skipped test counts as a failure."""

from __future__ import annotations

import os

import pytest

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if IN_CI and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped in CI (CI=true), which counts as a failure: {reason}"
