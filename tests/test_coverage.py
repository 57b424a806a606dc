"""The seed-coverage map: every topic of issue 11 once, every listed heading real, the README block current.

The map, and the README's generated blocks, are made by tools/readme.py (repository tooling, not labkit).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import tomllib

from labkit import catalog

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def readme(load_tool):
    """tools/readme.py, loaded by tests/conftest.py (no sys.path edit)."""
    return load_tool("readme")


# The topics of issue 11, in its order.
SEED_TOPICS = [
    "HPC bottlenecks", "schedulers", "compilers/JIT", "NCCL/communication libraries", "cuBLAS/cuDNN versions",
    "profilers", "float formats", "master weights", "loss scaling", "TF32/FP8", "AMP recipe", "BF16", "DDP+AMP",
    "DeepSpeed", "memory not dropping", "GPU utilisation", "NaN debugging", "NCCL timeouts and barriers",
    "operator fusion", "communication strategies",
    "metrics (throughput, step time, scaling efficiency, utilisation)", "parallelism kinds",
    "lifecycle and reproducibility", "job scheduling", "the beginner checklist",
]
# the topic names straight from the data file (an independent read), for the per-topic test ids
TOPIC_NAMES = [t["name"] for t in tomllib.loads((ROOT / "docs" / "seed_coverage.toml").read_text())["topic"]]


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


def test_every_seed_topic_exactly_once_in_order(readme):
    names = [t.name for t in readme.load_coverage()]
    assert names == SEED_TOPICS == TOPIC_NAMES


@pytest.mark.parametrize("name", TOPIC_NAMES)
def test_listed_headings_exist_in_the_notebook(readme, name):
    (topic,) = [t for t in readme.load_coverage() if t.name == name]
    for number, heading in topic.sections:
        assert number in {n.number for n in catalog.available()}, f"{topic.name}: no notebook {number}"
        assert heading in headings(number), f"{topic.name}: notebook {number} has no heading {heading!r}"
    assert len(set(topic.sections)) == len(topic.sections), f"{topic.name}: a section is listed twice"


def test_status_and_notes(readme):
    topics = readme.load_coverage()
    for t in topics:
        assert t.status == ("open" if not t.sections else "partial" if t.partial else "covered")
        if t.status != "covered":
            assert t.note, f"{t.name}: say what is missing"
    assert sum(t.status == "covered" for t in topics) >= len(topics) // 2


def test_readme_block_is_current_and_lists_open_topics(readme, tmp_path):
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- seed-coverage:start -->\n(.*?)\n<!-- seed-coverage:end -->", text, flags=re.DOTALL)
    assert m, "README.md has no seed-coverage block"
    assert m.group(1) == readme.coverage_table(), "run: python tools/readme.py"
    assert text.index("## Notebook map") < text.index("## Seed coverage") < m.start()
    rows = {r.split(" | ")[0].lstrip("| "): r for r in m.group(1).splitlines()[2:]}
    assert list(rows) == SEED_TOPICS
    for t in readme.load_coverage():
        assert f"| {t.status} |" in rows[t.name]
        if t.status == "open":
            assert "| open | — |" in rows[t.name]
    copy = tmp_path / "README.md"
    shutil.copy(ROOT / "README.md", copy)
    assert not readme.update_readme(copy), "the README is already current, so nothing changes"
    copy.write_text(text.replace(m.group(1), "stale"))
    assert readme.update_readme(copy) and copy.read_text() == text


def test_load_coverage_rejects_bad_files(readme, tmp_path):
    bad = tmp_path / "c.toml"
    with pytest.raises(FileNotFoundError):
        readme.load_coverage(tmp_path / "missing.toml")
    bad.write_text('[[topic]]\nname = "x"\nsections = []\n')
    with pytest.raises(ValueError, match="needs a note"):
        readme.load_coverage(bad)
    bad.write_text('[[topic]]\nname = "x"\nsections = [{notebook = "01"}]\n')
    with pytest.raises(ValueError, match="each section"):
        readme.load_coverage(bad)
    bad.write_text('[[topic]]\nname = "x"\nsections = []\npartial = true\nnote = "n"\n')
    with pytest.raises(ValueError, match="partial"):
        readme.load_coverage(bad)
    bad.write_text("")
    with pytest.raises(ValueError, match="no"):
        readme.load_coverage(bad)
    bad.write_text('[[topic]]\nname = "x"\nsections = []\nnote = "nothing yet"\n')
    (t,) = readme.load_coverage(bad)
    assert t.status == "open" and "| x | open | — | nothing yet |" in readme.coverage_table([t])


def test_update_readme_requires_markers(readme, tmp_path):
    p = tmp_path / "R.md"
    p.write_text("no markers")
    with pytest.raises(ValueError, match="notebook-map"):
        readme.update_readme(p)
    p.write_text("a\n<!-- notebook-map:start -->\nold\n<!-- notebook-map:end -->\nb")
    assert readme.update_readme(p) and catalog.markdown_table() in p.read_text()
    assert not readme.update_readme(p)


def test_main_check_and_update(readme, tmp_path, capsys):
    copy = tmp_path / "README.md"
    shutil.copy(ROOT / "README.md", copy)
    assert readme.main(["--check", str(copy)]) == 0
    text = copy.read_text()
    stale = text.replace(catalog.markdown_table(), "stale")
    copy.write_text(stale)
    assert readme.main(["--check", str(copy)]) == 1 and copy.read_text() == stale, "--check changes nothing"
    assert "stale" in capsys.readouterr().err
    assert readme.main([str(copy)]) == 0 and copy.read_text() == text
    (tmp_path / "none.md").write_text("no markers")
    assert readme.main(["--check", str(tmp_path / "none.md")]) == 1


def test_the_tool_runs_as_a_script(tmp_path):
    """``python tools/readme.py --check`` from anywhere: the script finds labkit and docs/ on its own."""
    import subprocess

    out = subprocess.run([sys.executable, str(ROOT / "tools" / "readme.py"), "--check"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "is current" in out.stdout
