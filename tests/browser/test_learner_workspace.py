"""`make lab` in a fresh copy of the checkout: it creates the workspace and JupyterLab opens on it; there a learner
answers an exercise wrong twice, then right: the hints escalate, ✓ appears, and notebook 00's progress view, and
`python -m labkit progress`, show the exercise solved.

The server is the real `make lab` (its token, loopback bind and --allow-root logic), run in a copy of the checkout
with the test's .venv (`-o` keeps make from reinstalling it) and a private HOME; the learner's progress record goes
where a learner's would, into the workspace (LABKIT_PROGRESS is unset for the server).
"""

from __future__ import annotations

import contextlib
import io
import json
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from labdriver import (
    _STATE_JS,
    Lab,
    LabServer,
    fresh_checkout,
    start_make_lab,
    write_lab_settings,
)

pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")

pytestmark = pytest.mark.slow

EXERCISE = "01.fp16-max"
NOTEBOOK = "work/01_float_bit_layouts.ipynb"
PROGRESS = "work/00_environment.ipynb"


@pytest.fixture(scope="module")
def make_lab(tmp_path_factory: pytest.TempPathFactory, browser: Any) -> Iterator[LabServer]:
    """`make lab` in a copy of the checkout, until its JupyterLab prints its URL; stopped (whole group) after."""
    base = tmp_path_factory.mktemp("make-lab")
    root, env = fresh_checkout(base)
    assert not (root / "work").exists(), "a fresh clone has no workspace"
    write_lab_settings(Path(env["JUPYTERLAB_SETTINGS_DIR"]))
    server = start_make_lab(root, env, base / "make-lab.log", [])
    try:
        yield server
    finally:
        server.stop()


def test_make_lab_creates_the_workspace_and_opens_jupyterlab_on_it(make_lab: LabServer, browser: Any) -> None:
    log = make_lab.log_path.read_text(errors="replace")
    assert "workspace: created your workspace" in log
    work = make_lab.root / "work"
    assert (work / ".labkit-workspace").is_file() and (work / "00_environment.ipynb").is_file()
    listing = json.loads(make_lab.request("/api/contents/work").body)
    assert {"00_environment.ipynb", "01_float_bit_layouts.ipynb", "README.md"} <= {c["name"] for c in listing["content"]}
    assert make_lab.request("/api/contents", with_token=False).status == 403, "token auth, as always"
    assert make_lab.base_url.startswith("http://127.0.0.1:")

    lab = Lab(server=make_lab, browser=browser)
    try:
        page = lab.new_page()
        page.goto(f"{make_lab.base_url}/lab?token={make_lab.token}")
        page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell")
        config = json.loads(page.locator("#jupyter-config-data").text_content())
        assert config["preferredPath"] == "work"
        # the file browser opens in the workspace: its notebooks are listed, the checkout's folders are not
        items = page.locator(".jp-DirListing-content .jp-DirListing-itemText")
        items.filter(has_text="01_float_bit_layouts.ipynb").first.wait_for(state="visible")
        names = set(items.all_text_contents())
        assert "00_environment.ipynb" in names and "labkit" not in names and "tools" not in names, names
    finally:
        lab.close_pages()


def _wait_ran(page: Any, path: str, index: int, before: int | None, timeout: float = 120) -> dict[str, Any]:
    """Wait until cell ``index`` has run again (a new execution count, kernel idle); return the cell's state."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = page.evaluate(_STATE_JS, [path, True])
        cell = state["cells"][index]
        if cell["executionCount"] and cell["executionCount"] != before and state["kernelStatus"] == "idle" \
                and "*" not in cell["prompt"]:
            return cell
        time.sleep(0.25)
    raise AssertionError(f"{path}: cell {index} did not run in {timeout:.0f} s")


def _run_cell(page: Any, path: str, index: int) -> dict[str, Any]:
    """Run one cell (its stored output and count cleared first, so the new run is what is read back)."""
    page.evaluate("""([path, index]) => {
        const panel = Array.from(window.jupyterapp.shell.widgets('main')).find(w => w.context && w.context.path === path);
        panel.content.widgets[index].model.clearExecution();
        panel.content.activeCellIndex = index;
        panel.content.deselectAll();
        return window.jupyterapp.commands.execute('notebook:run-cell');
    }""", [path, index])
    return _wait_ran(page, path, index, None)


def _text(cell: dict[str, Any]) -> str:
    return "".join(o.get("text", "") for o in cell["outputs"] if o.get("output_type") == "stream")


def _index(page: Any, path: str, needle: str) -> int:
    state = page.evaluate(_STATE_JS, [path, True])
    return next(c["index"] for c in state["cells"] if c["type"] == "code" and needle in c["source"])


def _expected(answers: list[float], tmp: Path) -> list[str]:
    """What check prints for these answers in a fresh kernel: the same labkit, in this process."""
    from labkit import check as C

    saved = dict(C._RESULTS), dict(C._WRONG)
    out = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(C.PROGRESS_ENV, str(tmp / "expected-progress.json"))
        C.reset_results()
        for a in answers:
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                C.check(EXERCISE, a)
            out.append(buf.getvalue())
    C.reset_results()
    C._RESULTS.update(saved[0])
    C._WRONG.update(saved[1])
    return out


def test_wrong_twice_then_right_hints_escalate_and_progress_shows_it(make_lab: LabServer, browser: Any,
                                                                      tmp_path: Path) -> None:
    from labkit.exercises import get_exercise

    ex = get_exercise(EXERCISE)
    # typed by the learner: new objects, not labkit's own (check() refuses the reference object itself)
    answers = [1.0, float(str(ex.wrong)), float(str(ex.reference))]  # something off, the typical mistake, the answer
    want = _expected(answers, tmp_path)
    lab = Lab(server=make_lab, browser=browser)
    try:
        page = lab.open_notebook(NOTEBOOK)
        _run_cell(page, NOTEBOOK, _index(page, NOTEBOOK, "from labkit.check import"))
        cell = _index(page, NOTEBOOK, f'check("{EXERCISE}"')
        got = []
        for answer in answers:
            page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell").nth(cell) \
                .locator(".cm-content").click()
            page.keyboard.press("Control+Home")
            page.keyboard.press("Shift+End")
            page.keyboard.type(f"answer = {answer!r}")  # the learner types over the `answer = ...` line
            source = page.evaluate(_STATE_JS, [NOTEBOOK, True])["cells"][cell]["source"]
            assert source.splitlines()[0] == f"answer = {answer!r}" and f'check("{EXERCISE}", answer)' in source
            got.append(_text(_run_cell(page, NOTEBOOK, cell)))
        assert got == want, "the browser shows what check prints"
        first, second, third = got
        assert first.startswith(f"✗ {EXERCISE}") and f"Hint: {ex.hint.strip()}" in first
        assert second.startswith(f"✗ {EXERCISE}") and second != first and ex.hint.strip() not in second
        if ex.method.strip():
            assert f"Hint 2, the method: {ex.method.strip()}" in second
        if ex.wrong_why.strip():
            assert ex.wrong_why.strip() in second, "the typical mistake is named"
        assert third.startswith(f"✓ {EXERCISE}: correct.")

        record = make_lab.root / "work" / ".labkit-progress.json"
        entry = json.loads(record.read_text())["exercises"][EXERCISE]
        assert entry["status"] == "correct" and entry["attempts"] == 3
        assert stat.S_IMODE(record.stat().st_mode) == 0o600

        view = lab.open_notebook(PROGRESS)
        _run_cell(view, PROGRESS, _index(view, PROGRESS, "import labkit"))
        shown = _text(_run_cell(view, PROGRESS, _index(view, PROGRESS, "labkit.check.progress()")))
        assert f"recorded in {record}" in shown, shown
        line = next(ln for ln in shown.splitlines() if ln.startswith("01 "))
        assert f"✓ {EXERCISE}" in line and "1 of" in line, shown
    finally:
        lab.close_pages()
    cli = subprocess.run([sys.executable, "-m", "labkit", "progress"], cwd=make_lab.root, env=make_lab.env,
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0 and f"✓ {EXERCISE}" in cli.stdout and str(record) in cli.stdout, cli
