"""docs/instructor.md: the timetable agrees with the notebooks' own headers and the exercise registry."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

from labkit import catalog
from labkit.exercises import all_exercises

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "instructor.md"
ROW = re.compile(r"^\| (Day \d+) \| (\d\d) \| ([^|]+?) \| (\d+) \| (\d+) \|$", re.MULTILINE)
TOTAL = re.compile(r"^\| +\| +\| \*\*Total\*\* \| \*\*(\d+)\*\* \| \*\*(\d+)\*\* \|$", re.MULTILINE)


def estimated_minutes(path: Path) -> int:
    text = "".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "markdown")
    found = re.findall(r"\*\*Estimated time:\*\* (\d+) min", text)
    assert len(found) == 1, f"{path.name}: expected one '**Estimated time:** NN min' header, found {found}"
    return int(found[0])


def test_timetable_matches_notebook_headers_and_exercises():
    rows = ROW.findall(GUIDE.read_text())
    notebooks = {p.name[:2]: p for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    assert [r[1] for r in rows] == sorted(notebooks), "one timetable row per notebook, in order"
    titles = {n.number: n.title for n in catalog.NOTEBOOKS}
    per_nb = Counter(i.split(".")[0] for i in all_exercises())
    for _day, number, title, minutes, n_ex in rows:
        assert int(minutes) == estimated_minutes(notebooks[number]), f"notebook {number}: minutes differ"
        assert title == titles[number], f"notebook {number}: title {title!r} is not the catalog's {titles[number]!r}"
        assert int(n_ex) == per_nb[number], f"notebook {number}: {per_nb[number]} exercises registered"
    (total,) = TOTAL.findall(GUIDE.read_text())
    assert int(total[0]) == sum(int(r[3]) for r in rows) and int(total[1]) == sum(per_nb.values())
    days = [r[0] for r in rows]
    assert days == sorted(days), "sessions in notebook order"


def test_guide_links_exist_and_readme_links_the_guide():
    text = GUIDE.read_text()
    for target in re.findall(r"\]\(([^)#]+)\)", text):
        if not target.startswith("http"):
            assert (GUIDE.parent / target).resolve().exists(), f"broken link {target}"
    assert "(docs/instructor.md)" in (ROOT / "README.md").read_text()
    for needed in ("environment.yml", "slurm/jupyter.sbatch", "--reservation", "make student", "export_results",
                   "load_results", "progress --export", "class-report", "nbgrader", "otter-grader"):
        assert needed in text, needed
