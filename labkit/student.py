"""The student build: copies of the notebooks with the exercise solutions removed and their outputs cleared.

Solutions sit between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` lines in code cells (and between
``<!-- BEGIN SOLUTION -->`` and ``<!-- END SOLUTION -->`` in markdown cells). The learner's ``...`` line
stays above each block, so in the student copy ``check(...)`` reports "not attempted yet" and the
notebook still runs top to bottom. Run it with ``python -m labkit student-build`` (or ``make student``).
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BuildReport", "build_student", "solution_blocks", "strip_solutions"]

_CODE = (re.compile(r"^\s*### BEGIN SOLUTION\s*$"), re.compile(r"^\s*### END SOLUTION\s*$"))
_MD = (re.compile(r"^\s*<!-- BEGIN SOLUTION -->\s*$"), re.compile(r"^\s*<!-- END SOLUTION -->\s*$"))


@dataclass(frozen=True)
class BuildReport:
    """What a student build wrote: notebooks, and how many solution blocks were removed from each.

    Introduced in notebook 00.
    """

    out_dir: Path
    removed: dict[str, int]


def solution_blocks(source: str, cell_type: str = "code") -> list[list[str]]:
    """Return the lines of each solution block in a cell's source (markers excluded).

    Raises ``ValueError`` on an unbalanced or nested marker, naming the line. Introduced in notebook 00.
    """
    begin, end = _CODE if cell_type == "code" else _MD
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for i, line in enumerate(source.splitlines(), 1):
        if begin.match(line):
            if current is not None:
                raise ValueError(f"nested BEGIN SOLUTION at line {i}")
            current = []
        elif end.match(line):
            if current is None:
                raise ValueError(f"END SOLUTION without BEGIN at line {i}")
            blocks.append(current)
            current = None
        elif current is not None:
            current.append(line)
    if current is not None:
        raise ValueError("BEGIN SOLUTION without END SOLUTION")
    return blocks


def strip_solutions(source: str, cell_type: str = "code") -> tuple[str, int]:
    """Remove every solution block (markers included) from a cell's source; return (text, blocks removed).

    Introduced in notebook 00.
    """
    n = len(solution_blocks(source, cell_type))  # validates the markers
    if not n:
        return source, 0
    begin, end = _CODE if cell_type == "code" else _MD
    out, inside = [], False
    for line in source.splitlines():
        if begin.match(line):
            inside = True
        elif end.match(line):
            inside = False
        elif not inside:
            out.append(line)
    return "\n".join(out), n


def build_student(src_dir: str | Path = "notebooks", out_dir: str | Path = "dist/student") -> BuildReport:
    """Write student copies of every notebook in ``src_dir`` to ``out_dir``; return what was removed.

    Cells that held a solution lose their outputs and execution count; every other cell, output and
    file is kept as it is. ``out_dir`` is replaced. Introduced in notebook 00.
    """
    src, out = Path(src_dir), Path(out_dir)
    notebooks = sorted(src.glob("*.ipynb"))
    if not notebooks:
        raise ValueError(f"no notebooks found in {src}")
    if out.resolve() == src.resolve() or out.resolve() in src.resolve().parents:
        raise ValueError("the student build must not overwrite the instructor notebooks")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    removed: dict[str, int] = {}
    for path in notebooks:
        nb = json.loads(path.read_text())
        total = 0
        for cell in nb["cells"]:
            text = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            new, n = strip_solutions(text, cell["cell_type"])
            if n:
                total += n
                cell["source"] = new
                if cell["cell_type"] == "code":
                    cell["outputs"], cell["execution_count"] = [], None
        nb.get("metadata", {}).pop("widgets", None) if total else None
        nb.get("metadata", {}).pop("jupytext", None)  # the pairing with tools/nbsrc is for authors only
        (out / path.name).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
        removed[path.name] = total
    return BuildReport(out, removed)
