"""Every notebook, as the learner has it, opened and run in JupyterLab in headless Chromium.

The server serves the workspace that `make lab` creates (the notebooks without solutions), and its kernels can
import only what `make lab` installs (tests/lab_env.py): no errors, every stored figure rendered, and every
exercise left open reports "not attempted yet".
"""

from __future__ import annotations

import re

import pytest
from labdriver import IMAGE_MIMES, NOTEBOOKS, Lab, error_outputs, notebook_names, stored_cells

from labkit.student import solution_blocks

CHECK = re.compile(r"""check\(\s*["']([^"']+)["']""")

pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")

pytestmark = pytest.mark.slow  # a JupyterLab server, Chromium and whole notebooks

NAMES = notebook_names()


def _stored_images(cell: dict) -> int:
    return sum(1 for out in cell.get("outputs", []) if any(m in out.get("data", {}) for m in IMAGE_MIMES))


def test_notebooks_found() -> None:
    """The parametrization below saw the workbook's notebooks (an empty list would test nothing)."""
    assert NAMES, f"no NN_*.ipynb notebooks in {NOTEBOOKS}"


@pytest.mark.parametrize("notebook", NAMES)
def test_run_all_in_browser(lab: Lab, notebook: str) -> None:
    """Run All of the learner's copy: every code cell runs, no error output, every stored figure renders."""
    run = lab.run_notebook(notebook)
    print(f"{notebook}: opened in {run.open_seconds:.1f} s, Run All took {run.seconds:.1f} s")
    state = run.state
    assert state["kernelName"] == "python3"
    assert state["kernelStatus"] == "idle"

    stored = stored_cells(notebook, lab.server.root)  # the copy the server serves, not a newer file
    live = state["cells"]
    assert len(live) == len(stored), f"the browser shows {len(live)} cells, the file has {len(stored)}"

    problems = []
    for cell in live:
        if cell["type"] != "code":
            continue
        errors = error_outputs(cell)
        if "raises-exception" in cell["tags"]:
            if not any(out.get("output_type") == "error" for out in cell["outputs"]):
                problems.append(f"cell {cell['index']} is tagged raises-exception but raised nothing")
        elif errors:
            problems.append(f"cell {cell['index']}: {errors}")
    assert not problems, f"{notebook}: " + "; ".join(problems)

    missing = []
    for index, (file_cell, cell) in enumerate(zip(stored, live)):
        want = _stored_images(file_cell)
        if not want:
            continue
        got_outputs = sum(1 for out in cell["outputs"] if any(m in out.get("data", {}) for m in IMAGE_MIMES))
        rendered = [im for im in cell["images"] if im["complete"] and im["width"] > 0 and im["height"] > 0]
        if got_outputs < want or len(rendered) < want:
            missing.append(f"cell {index}: {want} stored figure(s), {got_outputs} produced, "
                           f"{len(rendered)} rendered")
    assert not missing, f"{notebook}: figures missing in the browser: " + "; ".join(missing)

    # every exercise of the reference notebook is open in the learner's copy, and its check says so
    reference = stored_cells(notebook, NOTEBOOKS)
    n_checks = len({i for c in reference if c["cell_type"] == "code" and solution_blocks("".join(c["source"]))
                    for i in CHECK.findall("".join(c["source"]))})
    printed = "".join(out.get("text", "") for c in live if c["type"] == "code" for out in c["outputs"]
                      if out.get("output_type") == "stream")
    assert printed.count("not attempted yet") >= n_checks, f"{notebook}: fewer open checks than exercises"
