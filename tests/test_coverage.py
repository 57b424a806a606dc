"""The seed-coverage map: every topic of issue 11 once, every listed heading real, the README block current."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from labkit import catalog

ROOT = Path(__file__).resolve().parents[1]
# The topics of issue 11, in its order.
SEED_TOPICS = [
    "HPC bottlenecks", "schedulers", "compilers/JIT", "NCCL/communication libraries", "cuBLAS/cuDNN versions",
    "profilers", "float formats", "master weights", "loss scaling", "TF32/FP8", "AMP recipe", "BF16", "DDP+AMP",
    "DeepSpeed", "memory not dropping", "GPU utilisation", "NaN debugging", "NCCL timeouts and barriers",
    "operator fusion", "communication strategies",
    "metrics (throughput, step time, scaling efficiency, utilisation)", "parallelism kinds",
    "lifecycle and reproducibility", "job scheduling", "the beginner checklist",
]
TOPICS = catalog.load_coverage()


def headings(number: str) -> set[str]:
    """The Markdown headings of notebook ``number``'s markdown cells, without the #'s."""
    (path,) = (ROOT / "notebooks").glob(f"{number}_*.ipynb")
    out = set()
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] == "markdown":
            for line in "".join(cell["source"]).splitlines():
                m = re.match(r"^#{1,6}\s+(.*?)\s*$", line)
                if m:
                    out.add(m.group(1))
    return out


def test_every_seed_topic_exactly_once_in_order():
    names = [t.name for t in TOPICS]
    assert names == SEED_TOPICS


@pytest.mark.parametrize("topic", TOPICS, ids=lambda t: t.name)
def test_listed_headings_exist_in_the_notebook(topic):
    for number, heading in topic.sections:
        assert number in {n.number for n in catalog.available()}, f"{topic.name}: no notebook {number}"
        assert heading in headings(number), f"{topic.name}: notebook {number} has no heading {heading!r}"
    assert len(set(topic.sections)) == len(topic.sections), f"{topic.name}: a section is listed twice"


def test_status_and_notes():
    for t in TOPICS:
        assert t.status == ("open" if not t.sections else "partial" if t.partial else "covered")
        if t.status != "covered":
            assert t.note, f"{t.name}: say what is missing"
    assert sum(t.status == "covered" for t in TOPICS) >= len(TOPICS) // 2


def test_readme_block_is_current_and_lists_open_topics(tmp_path):
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- seed-coverage:start -->\n(.*?)\n<!-- seed-coverage:end -->", text, flags=re.DOTALL)
    assert m, "README.md has no seed-coverage block"
    assert m.group(1) == catalog.coverage_table(), "run: python -m labkit.catalog --readme"
    assert text.index("## Notebook map") < text.index("## Seed coverage") < m.start()
    rows = {r.split(" | ")[0].lstrip("| "): r for r in m.group(1).splitlines()[2:]}
    assert list(rows) == SEED_TOPICS
    for t in TOPICS:
        assert f"| {t.status} |" in rows[t.name]
        if t.status == "open":
            assert "| open | — |" in rows[t.name]
    copy = tmp_path / "README.md"
    shutil.copy(ROOT / "README.md", copy)
    assert not catalog.update_readme(copy), "the README is already current, so nothing changes"
    copy.write_text(text.replace(m.group(1), "stale"))
    assert catalog.update_readme(copy) and copy.read_text() == text


def test_load_coverage_rejects_bad_files(tmp_path):
    bad = tmp_path / "c.toml"
    with pytest.raises(FileNotFoundError):
        catalog.load_coverage(tmp_path / "missing.toml")
    bad.write_text('[[topic]]\nname = "x"\nsections = []\n')
    with pytest.raises(ValueError, match="needs a note"):
        catalog.load_coverage(bad)
    bad.write_text('[[topic]]\nname = "x"\nsections = [{notebook = "01"}]\n')
    with pytest.raises(ValueError, match="each section"):
        catalog.load_coverage(bad)
    bad.write_text('[[topic]]\nname = "x"\nsections = []\npartial = true\nnote = "n"\n')
    with pytest.raises(ValueError, match="partial"):
        catalog.load_coverage(bad)
    bad.write_text("")
    with pytest.raises(ValueError, match="no"):
        catalog.load_coverage(bad)
    bad.write_text('[[topic]]\nname = "x"\nsections = []\nnote = "nothing yet"\n')
    (t,) = catalog.load_coverage(bad)
    assert t.status == "open" and "| x | open | — | nothing yet |" in catalog.coverage_table([t])
