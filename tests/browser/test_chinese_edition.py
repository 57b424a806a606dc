"""`make lab LAB_LANG=zh` in a fresh copy of the checkout: the Chinese edition in JupyterLab's Chinese UI.

It creates the workspace work-zh/ from notebooks/zh/ and opens JupyterLab in Chinese (the zh_CN language pack, chosen
by a settings folder for that run only); there a learner runs a Chinese notebook top to bottom, and a wrong answer in
another gets labkit's feedback in Chinese, exactly what check() prints in Chinese in this process.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from labdriver import (
    _STATE_JS,
    Lab,
    LabServer,
    error_outputs,
    fresh_checkout,
    start_make_lab,
    write_lab_settings,
)

pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")

pytestmark = pytest.mark.slow

EXERCISE = "01.fp16-max"
RUN_ALL = "work-zh/00_environment.ipynb"
NOTEBOOK = "work-zh/01_float_bit_layouts.ipynb"
#: The status bar's idle kernel in the Chinese UI (the zh_CN pack translates "Idle" as 空闲).
KERNEL_IDLE_ZH = "Python 3 (ipykernel) | 空闲"


@pytest.fixture(scope="module")
def make_lab_zh(tmp_path_factory: pytest.TempPathFactory, browser: Any) -> Iterator[LabServer]:
    """`make lab LAB_LANG=zh` in a copy of the checkout, until JupyterLab prints its URL; stopped (whole group)."""
    base = tmp_path_factory.mktemp("make-lab-zh")
    root, env = fresh_checkout(base)
    assert not (root / "work-zh").exists(), "a fresh clone has no workspace"
    # make lab LAB_LANG=zh points JupyterLab at .lab-settings/zh; the tests' quiet settings go there first, and
    # make lab must add the UI language to them without dropping them
    write_lab_settings(root / ".lab-settings" / "zh")
    server = start_make_lab(root, env, base / "make-lab.log", ["LAB_LANG=zh"])
    try:
        yield server
    finally:
        server.stop()


def _zh_check(answer: float) -> str:
    """What check() prints for ``answer`` in a fresh kernel, in Chinese: the same labkit, in this process."""
    from labkit import check as C
    from labkit import i18n

    saved = dict(C._RESULTS), dict(C._WRONG)
    buf = io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(C.PROGRESS_ENV, "off")
        C.reset_results()
        i18n.set_language("zh")
        try:
            with contextlib.redirect_stdout(buf):
                C.check(EXERCISE, answer)
        finally:
            i18n.set_language(None)
    C.reset_results()
    C._RESULTS.update(saved[0])
    C._WRONG.update(saved[1])
    return buf.getvalue()


def test_make_lab_zh_opens_the_chinese_edition_in_the_chinese_ui(make_lab_zh: LabServer, browser: Any) -> None:
    root = make_lab_zh.root
    work = root / "work-zh"
    marker = json.loads((work / ".labkit-workspace").read_text())
    assert marker["lang"] == "zh" and not (root / "work").exists(), "the Chinese workspace, not the English one"
    copy = json.loads((work / "01_float_bit_layouts.ipynb").read_text())
    title = next(c for c in copy["cells"] if c["cell_type"] == "markdown" and "workspace-note" not in
                 c.get("metadata", {}).get("tags", []))
    assert re.search(r"[\u4e00-\u9fff]", "".join(title["source"])), "the notebooks are the Chinese edition's"
    settings = json.loads((root / ".lab-settings/zh/@jupyterlab/translation-extension/plugin.jupyterlab-settings")
                          .read_text())
    assert settings["locale"] == "zh_CN"
    lab = Lab(server=make_lab_zh, browser=browser)
    try:
        page = lab.new_page()
        page.goto(f"{make_lab_zh.base_url}/lab?token={make_lab_zh.token}")
        page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell")
        menus = page.locator(".lm-MenuBar-itemLabel")
        menus.first.wait_for(state="visible")
        labels = menus.all_text_contents()
        assert "文件" in labels and "File" not in labels, f"the menu bar is not in Chinese: {labels}"
    finally:
        lab.close_pages()


def test_a_chinese_notebook_runs_and_check_answers_in_chinese(make_lab_zh: LabServer, browser: Any) -> None:
    from labkit.exercises import get_exercise

    lab = Lab(server=make_lab_zh, browser=browser, kernel_idle=KERNEL_IDLE_ZH)  # the Chinese status bar, read
    try:
        run = lab.run_notebook(RUN_ALL)
        errors = {c["index"]: error_outputs(c) for c in run.state["cells"] if error_outputs(c)}
        assert not errors, f"{RUN_ALL}: {errors}"
        lab.close_pages()
        page = lab.open_notebook(NOTEBOOK)
        state = page.evaluate(_STATE_JS, [NOTEBOOK, True])
        imports = next(c["index"] for c in state["cells"] if c["type"] == "code" and "from labkit.check import"
                       in c["source"])
        cell = next(c["index"] for c in state["cells"] if c["type"] == "code" and f'check("{EXERCISE}"' in c["source"])
        page.evaluate("""([path, indices]) => {
            const panel = Array.from(window.jupyterapp.shell.widgets('main')).find(w => w.context && w.context.path === path);
            const cell = panel.content.widgets[indices[1]];
            cell.model.sharedModel.setSource('answer = 1.0\\n' + cell.model.sharedModel.getSource().split('\\n').slice(1).join('\\n'));
            for (const i of indices) panel.content.widgets[i].model.clearExecution();
        }""", [NOTEBOOK, [imports, cell]])
        for index in (imports, cell):
            page.evaluate("""([path, index]) => {
                const panel = Array.from(window.jupyterapp.shell.widgets('main')).find(w => w.context && w.context.path === path);
                panel.content.activeCellIndex = index;
                panel.content.deselectAll();
                return window.jupyterapp.commands.execute('notebook:run-cell');
            }""", [NOTEBOOK, index])
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                now = page.evaluate(_STATE_JS, [NOTEBOOK, True])
                got = now["cells"][index]
                if got["executionCount"] and now["kernelStatus"] == "idle" and "*" not in got["prompt"]:
                    break
                time.sleep(0.25)
            else:
                raise AssertionError(f"{NOTEBOOK}: cell {index} did not run")
        shown = "".join(o.get("text", "") for o in got["outputs"] if o.get("output_type") == "stream")
        want = _zh_check(1.0)
        assert shown == want, "the browser shows what check() prints in Chinese"
        hint = get_exercise(EXERCISE).hint.strip()
        assert shown.startswith(f"✗ {EXERCISE}") and "提示" in shown and hint not in shown, shown
    finally:
        lab.close_pages()
