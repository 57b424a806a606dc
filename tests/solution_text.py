"""What a solution looks like as text: the lines the student build and the workspace must never show.

Shared by tests/test_student.py and tests/test_workspace.py (a helper module, not a test file).
"""

from __future__ import annotations

import inspect
import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def trivial(line: str) -> bool:
    return len(line) < 12 or not re.search(r"[A-Za-z0-9]", line)


def solution_lines() -> set[str]:
    """Every non-trivial line inside a solution block of the notebook sources (tools/nbsrc/*.py)."""
    out = set()
    for path in sorted((ROOT / "tools" / "nbsrc").glob("*.py")):
        inside = False
        for line in path.read_text().splitlines():
            s = line.strip()
            if s in ("### BEGIN SOLUTION", "# <!-- BEGIN SOLUTION -->"):
                inside = True
            elif s in ("### END SOLUTION", "# <!-- END SOLUTION -->"):
                inside = False
            elif inside and not trivial(s.removeprefix("# ").strip()):
                out.add(s.removeprefix("# ").strip())
    return out


def reference_lines(value) -> list[str]:
    """The text of a registry reference answer: a function's body lines, a string's lines, else reprs."""
    if inspect.isfunction(value):
        lines = textwrap.dedent(inspect.getsource(value)).splitlines()
        body = next(i for i, ln in enumerate(lines) if ln.rstrip().endswith(":") and not ln.startswith("@"))
        return [ln.strip() for ln in lines[body + 1:]]
    if isinstance(value, str):
        return [ln.strip() for ln in value.splitlines()]
    if isinstance(value, dict):
        return [repr(value), *(f"{k!r}: {v!r}" for k, v in value.items())]
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str):  # a (prediction, result) pair
        return [repr(value), repr(value[0])] if len(value[0]) >= 12 else [repr(value)]
    return [] if repr(value).startswith("<") else [repr(value)]  # computed when graded: nothing to find
