"""Real-browser fixtures: one private JupyterLab server and one headless Chromium per session.

See labdriver.py for what the server and the browser are set up like. Without Playwright or Chromium
the tests skip, and in CI (``CI=true``) the top-level conftest turns those skips into failures.
On a failure, a screenshot of each open page, its browser console and the server log are written to
``build/browser-artifacts/`` (``LABKIT_BROWSER_ARTIFACTS`` overrides it) and named in the report.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

from lab_env import blocker_env
from labdriver import (
    ARTIFACTS,
    BROWSER_DIR,
    CHROMIUM,
    CHROMIUM_ARGS,
    EXPECT_TIMEOUT_MS,
    Lab,
    LabServer,
    mirror_worktree,
    private_env,
)


def _require_browser() -> None:
    """Skip (a failure under CI=true) when Playwright or Chromium is missing."""
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    if not (Path(CHROMIUM).is_file() and os.access(CHROMIUM, os.X_OK)):
        pytest.skip(f"Chromium not found at {CHROMIUM} (apt-get install chromium, or set LABKIT_CHROMIUM)")


@pytest.fixture(scope="session")
def lab_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A temporary HOME for the server, its kernels and every Jupyter/IPython/matplotlib dir."""
    return tmp_path_factory.mktemp("lab-home")


@pytest.fixture(scope="session")
def lab_server(tmp_path_factory: pytest.TempPathFactory, lab_home: Path) -> Iterator[LabServer]:
    """JupyterLab on 127.0.0.1:<free port> with a token, serving the learner's workspace of a copy of the checkout.

    What a learner runs after `make lab`: the workspace copies (``python -m labkit workspace``: no solutions,
    exercise outputs cleared) inside a copy of the checkout, so a notebook that reads ../slurm/ finds it, and
    kernels that can import only what `make lab` installs (tests/lab_env.py). The reference notebooks, with
    their solutions, are run by strict nbval.
    """
    _require_browser()
    base = tmp_path_factory.mktemp("lab-root")
    checkout = mirror_worktree(base / "checkout").parent
    made = subprocess.run([sys.executable, "-m", "labkit", "workspace", "--dir", str(checkout / "work")],
                          cwd=checkout, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    blocker = blocker_env(base / "lab_env", {})
    if os.environ.get("LABKIT_TEST_LAUNCH_SHARE"):  # tests/conftest.py: launches made once for nbval and the browser
        blocker["LABKIT_LAUNCH_SHARE"] = os.environ["LABKIT_TEST_LAUNCH_SHARE"]
    server = LabServer.start(root=checkout / "work", home=lab_home, log_path=base / "jupyter-server.log",
                             extra_env=blocker)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def browser(lab_home: Path) -> Iterator[Any]:
    """Debian's Chromium, headless, launched once per session through Playwright (HOME in lab_home)."""
    _require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
                                      env=private_env(lab_home / "browser"))
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="session")
def lab(lab_server: LabServer, browser: Any) -> Iterator[Lab]:
    """The session's JupyterLab + browser pair (see :class:`Lab`)."""
    from playwright.sync_api import expect

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    session = Lab(server=lab_server, browser=browser)
    try:
        yield session
    finally:
        session.close_pages()


# ----------------------------------------------------------------------------------------- ordering
def _notebook_key(item: pytest.Item) -> str:
    """The notebook a browser test drives, from its parameters (in its id, so that make test's xdist groups see
    it too: tests/conftest.py); "~" for none."""
    callspec = getattr(item, "callspec", None)
    for param in ("notebook", "number"):
        if callspec is not None and param in callspec.params:
            return str(callspec.params[param])
    return "~"  # tests without a notebook run last


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    """Order the browser tests by notebook (keeping their slots), so each notebook runs once."""
    slots = [i for i, item in enumerate(items) if BROWSER_DIR in Path(str(item.fspath)).parents]
    ordered = sorted((items[i] for i in slots), key=lambda it: re.sub(r"^(\d\d)_.*", r"\1",
                                                                         _notebook_key(it)))
    for slot, item in zip(slots, ordered):
        items[slot] = item


# ---------------------------------------------------------------------------------------- artifacts
def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_")[:150]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """On a failed browser test, save a screenshot, the console and the server log; name them."""
    outcome = yield
    report = outcome.get_result()
    if not report.failed or report.when == "teardown":
        return
    funcargs = getattr(item, "funcargs", {})
    session: Lab | None = funcargs.get("lab")
    server: LabServer | None = session.server if session else funcargs.get("lab_server")
    if server is None:
        return
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    stem = _safe(item.nodeid.split("::", 1)[-1])
    saved = []
    for i, page in enumerate(session.pages if session else []):
        try:
            if page.is_closed():
                continue
            shot = ARTIFACTS / f"{stem}-{i}.png"
            page.screenshot(path=str(shot), full_page=True)
            saved.append(str(shot))
            console = ARTIFACTS / f"{stem}-{i}.console.txt"
            console.write_text("\n".join(getattr(page, "_labkit_console", [])))
            saved.append(str(console))
        except Exception as exc:
            saved.append(f"(screenshot of page {i} failed: {exc})")
    log = ARTIFACTS / f"{stem}-jupyter-server.log"
    try:
        shutil.copyfile(server.log_path, log)
        saved.append(str(log))
    except OSError as exc:
        saved.append(f"(server log not copied: {exc})")
    report.sections.append(("browser artifacts", "\n".join(saved)))
