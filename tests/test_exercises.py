"""Every exercise's grader tells its reference answer (✓) from a typical mistake (✗), and every notebook's
stored solution output is ✓ for every check it makes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from labkit.check import NOT_GIVEN, evaluate
from labkit.exercises import all_exercises
from labkit.student import solution_blocks

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
EXERCISES = all_exercises()
IDS = sorted(EXERCISES)
CHECK = re.compile(r"""check\(\s*["']([^"']+)["']""")
# Function exercises whose correct answer legitimately returns None (it acts on its arguments); a
# stub that returns None is still told apart there, because a stub changes nothing.
RETURNS_NOTHING = {"04.amp-step"}


def test_registry_covers_every_notebook():
    numbers = {p.name[:2] for p in NOTEBOOKS}
    per_nb = {n: [i for i in IDS if i.startswith(n + ".")] for n in numbers}
    assert all(len(v) >= 3 for v in per_nb.values()), per_nb


@pytest.mark.parametrize("ex_id", IDS)
def test_reference_is_correct_and_wrong_is_wrong(ex_id):
    ex = EXERCISES[ex_id]
    assert ex.reference is not NOT_GIVEN, f"{ex_id}: no reference answer"
    assert ex.wrong is not NOT_GIVEN, f"{ex_id}: no typical wrong answer"
    ok = evaluate(ex_id, ex.reference)
    assert ok.status == "correct", ok.message
    bad = evaluate(ex_id, ex.wrong)
    assert bad.status == "wrong", bad.message
    assert "Hint:" in bad.message and ex.hint in bad.message
    assert "raised" not in bad.message, f"{ex_id}: the typical mistake should be graded, not crash: {bad.message}"


@pytest.mark.parametrize("ex_id", IDS)
def test_ellipsis_is_not_attempted(ex_id):
    v = evaluate(ex_id, ...)
    assert v.status == "not attempted" and "not attempted yet" in v.message


@pytest.mark.parametrize("ex_id", [i for i in IDS if callable(EXERCISES[i].reference)])
def test_function_stub_is_not_attempted(ex_id):
    """A student's ``def f(...): ...`` returns None: that is "not attempted yet", not a wrong answer."""

    def stub(*args, **kwargs):
        ...

    assert evaluate(ex_id, stub).status == "not attempted"


@pytest.mark.parametrize("ex_id", [i for i in IDS if not callable(EXERCISES[i].reference)])
def test_a_value_exercise_rejects_a_function(ex_id):
    assert evaluate(ex_id, lambda *a: None).status in ("wrong", "not attempted")


def _check_cells(path: Path) -> list[tuple[list[str], str]]:
    out = []
    for c in json.loads(path.read_text())["cells"]:
        src = "".join(c["source"])
        if c["cell_type"] != "code" or "check(" not in src or not solution_blocks(src):
            continue
        printed = "".join("".join(o.get("text", "")) for o in c.get("outputs", []) if o.get("output_type") == "stream")
        out.append((CHECK.findall(src), printed))
    return out


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_solutions_are_graded_correct(path):
    """The instructor notebook's solution passed its check when it was stored: labkit's grader and the
    notebook's solution agree, as the reference answer does."""
    cells = _check_cells(path)
    assert cells, f"{path.name}: no exercise cell"
    for ids, printed in cells:
        for ex_id in ids:
            assert ex_id in EXERCISES, f"{path.name}: unregistered id {ex_id}"
            assert f"✓ {ex_id}: correct." in printed, f"{path.name}: stored output of {ex_id} is not ✓: {printed!r}"
        assert "✗" not in printed and "not attempted" not in printed


def test_every_registered_exercise_is_used_by_its_notebook():
    used = {i for p in NOTEBOOKS for ids, _ in _check_cells(p) for i in ids}
    assert set(IDS) == used, f"registered but not in a notebook: {sorted(set(IDS) - used)}"
