"""Regenerate the README's screenshots (docs/img/*.png) from the notebooks running in JupyterLab.

Run with ``make screenshots`` (that is ``python -m pytest tests/browser/screenshots.py``). It uses the same
fixtures as the browser tests: a private JupyterLab server and headless Chromium. The file name does not
start with ``test_``, so the normal test run does not collect it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from labdriver import REPO, Lab, NotebookRun, notebook_by_number

pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
from playwright.sync_api import expect

IMG = REPO / "docs" / "img"


def _bit_explorer(run: NotebookRun) -> object:
    """The explorer showing 0.1 in FP16 (the classic 'not exactly 0.1' pattern)."""
    root = run.code_cell_with("widgets.bit_explorer(").locator(".jp-OutputArea-output").first
    number = root.locator(".lk-number input")
    number.fill("0.1")
    number.press("Enter")
    expect(root.locator(".lk-value")).to_have_text("fp16 0x2e66 = 0.0999755859375")
    number.blur()
    return root


def _scale_trace(run: NotebookRun) -> object:
    """The dynamic loss-scale trace figure of notebook 03."""
    root = run.code_cell_with("plots.scale_history(").locator(".jp-RenderedImage").first
    expect(root.locator("img")).to_be_visible()
    return root


def _memory_calculator(run: NotebookRun) -> object:
    """Notebook 06's ZeRO memory calculator on the seeds' setup: 13B on 8 GPUs, ZeRO-2, optimizer offloaded."""
    root = run.code_cell_with(".memory_calculator(").locator(".jp-OutputArea-output").first
    root.get_by_label("ZeRO stage", exact=True).select_option("2")
    root.get_by_label("offload", exact=True).select_option("optimizer")
    expect(root.locator(".lk-mem-result")).to_have_text(re.compile(r"^per GPU: 26.00 GB"))
    return root


SHOTS: list[tuple[str, str, Callable[[NotebookRun], object]]] = [
    ("01", "bit_explorer.png", _bit_explorer),
    ("03", "loss_scale_trace.png", _scale_trace),
    ("06", "memory_calculator.png", _memory_calculator),
]


@pytest.mark.parametrize(("number", "filename", "prepare"), SHOTS, ids=[s[1] for s in SHOTS])
def test_screenshot(lab: Lab, number: str, filename: str, prepare: Callable[[NotebookRun], object]) -> None:
    """Run the notebook, bring its widget or figure into the wanted state, save a PNG of its output."""
    name = notebook_by_number(number)
    if name is None:
        pytest.fail(f"notebook {number} is not in notebooks/, so {filename} cannot be made")
    run = lab.run_notebook(name)
    root = prepare(run)
    root.scroll_into_view_if_needed()  # type: ignore[attr-defined]
    IMG.mkdir(parents=True, exist_ok=True)
    path = Path(IMG / filename)
    root.screenshot(path=str(path), animations="disabled")  # type: ignore[attr-defined]
    assert path.stat().st_size > 2000, f"{path} looks empty"
    print(f"wrote {path.relative_to(REPO)} ({path.stat().st_size // 1024} KiB)")


BOOK_SHOTS = [("en/03_loss_scaling.html", "book_en.png", {"width": 1280, "height": 800}),
              ("zh/03_loss_scaling.html", "book_zh.png", {"width": 1280, "height": 800}),
              ("zh/01_float_bit_layouts.html", "book_phone.png", {"width": 390, "height": 844})]


@pytest.mark.parametrize(("page_path", "filename", "viewport"), BOOK_SHOTS, ids=[s[1] for s in BOOK_SHOTS])
def test_book_screenshot(browser: object, tmp_path_factory: pytest.TempPathFactory, page_path: str, filename: str,
                         viewport: dict[str, int]) -> None:
    """The book (make book) in each edition, and at phone width: a page's first screen."""
    import subprocess
    import sys

    site = REPO / "_build" / "book"
    if not (site / page_path).is_file():
        done = subprocess.run([sys.executable, str(REPO / "tools" / "book.py")], cwd=REPO, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stderr
    ctx = browser.new_context(viewport=viewport, device_scale_factor=1)  # type: ignore[attr-defined]
    try:
        page = ctx.new_page()
        page.goto((site / page_path).as_uri(), wait_until="networkidle")
        IMG.mkdir(parents=True, exist_ok=True)
        path = IMG / filename
        page.screenshot(path=str(path), animations="disabled")
        assert path.stat().st_size > 2000, f"{path} looks empty"
        print(f"wrote {path.relative_to(REPO)} ({path.stat().st_size // 1024} KiB)")
    finally:
        ctx.close()
