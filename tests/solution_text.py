"""What a solution looks like as text: the lines the student build and the workspace must never show.

Shared by tests/test_student.py and tests/test_workspace.py (a helper module, not a test file).
"""

from __future__ import annotations

import inspect
import json
import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def cells(path: Path) -> list[dict]:
    """A notebook's cells, each source joined into one string."""
    return [{**c, "source": "".join(c["source"])} for c in json.loads(path.read_text())["cells"]]


def strings(value) -> list[str]:
    """Every string inside a JSON value (a cell output, a whole notebook)."""
    if isinstance(value, str):
        return [value]
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else []
    return [s for item in items for s in strings(item)]


def file_text(path: Path) -> str:
    """A file's text; for a notebook also every JSON string decoded (a source line appears unescaped)."""
    raw = path.read_bytes().decode("utf-8", "replace")
    return raw + "\n" + "\n".join(strings(json.loads(raw))) if path.suffix == ".ipynb" else raw


def public_text() -> str:
    """What the reference notebooks show outside any solution: the teaching text and the outputs of cells without
    a solution, cut here with a plain line scan (not labkit.student), so that a line the lesson itself shows
    (``scaler.update()``, the ssh example) does not count as a leak."""
    parts = []
    for path in NOTEBOOKS:
        for c in cells(path):
            lines = c["source"].splitlines()
            marked = [i for i, ln in enumerate(lines) if "BEGIN SOLUTION" in ln or "END SOLUTION" in ln]
            if not marked:
                parts += [c["source"], *(s for o in c.get("outputs", []) for s in strings(o))]
                continue
            hidden = {i for a, b in zip(marked[::2], marked[1::2]) for i in range(a, b + 1)}
            parts.append("\n".join(ln for i, ln in enumerate(lines) if i not in hidden))
    return "\n".join(parts)


def trivial(line: str) -> bool:
    return len(line) < 12 or not re.search(r"[A-Za-z0-9]", line)


def solution_source_blocks() -> list[tuple[str, list[str]]]:
    """Every solution block of the notebook sources (tools/nbsrc/*.py): ``(file name, its stripped lines)``."""
    out = []
    for path in sorted((ROOT / "tools" / "nbsrc").glob("*.py")):
        block: list[str] | None = None
        for line in path.read_text().splitlines():
            s = line.strip()
            if s in ("### BEGIN SOLUTION", "# <!-- BEGIN SOLUTION -->"):
                block = []
            elif s in ("### END SOLUTION", "# <!-- END SOLUTION -->") and block is not None:
                out.append((path.name, block))
                block = None
            elif block is not None:
                block.append(s.removeprefix("# ").strip())
    return out


def solution_lines() -> set[str]:
    """Every non-trivial line inside a solution block of the notebook sources (tools/nbsrc/*.py)."""
    return {ln for _, block in solution_source_blocks() for ln in block if not trivial(ln)}


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
