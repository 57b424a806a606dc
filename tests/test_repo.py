"""Repository rules: notebooks stored executed and in step with their sources, modern AMP only, README map."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from labkit import catalog

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.fixture(scope="module")
def nbbuild(load_tool):
    """tools/nbbuild.py, loaded by tests/conftest.py (no sys.path edit)."""
    return load_tool("nbbuild")



def code_cells(path: Path) -> list[dict]:
    return [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


def test_there_are_notebooks():
    assert [p.name[:2] for p in NOTEBOOKS][:2] == ["00", "01"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_stored_executed(path):
    cells = [c for c in code_cells(path) if "".join(c["source"]).strip()]
    unrun = [i for i, c in enumerate(cells) if c.get("execution_count") is None]
    assert not unrun, f"{path.name}: code cells {unrun} are stored without being executed"
    counts = [c["execution_count"] for c in cells]
    assert counts == list(range(1, len(cells) + 1)), f"{path.name}: not executed top to bottom in one run"
    errors = [o for c in cells for o in c.get("outputs", []) if o["output_type"] == "error"]
    assert not errors, f"{path.name}: stored with an error output"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_matches_its_source(nbbuild, path):
    src = ROOT / "tools" / "nbsrc" / (path.stem + ".py")
    assert src.exists(), f"{path.name} has no source {src.relative_to(ROOT)}"
    want = [(c["cell_type"], c["source"]) for c in nbbuild.parse(src.read_text())]
    have = [(c["cell_type"], "".join(c["source"])) for c in json.loads(path.read_text())["cells"]]
    assert have == want, f"{path.name} differs from {src.name}: edit the source and run tools/nbbuild.py"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_skeleton(path):
    cells = json.loads(path.read_text())["cells"]
    md = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    assert cells[0]["cell_type"] == "markdown" and "".join(cells[0]["source"]).startswith("# ")
    for needle in ("**Objectives**", "**Prerequisites:**", "**Estimated time:**", "## Summary"):
        assert needle in md, f"{path.name}: missing {needle}"
    assert re.search(r"\*\*Estimated time:\*\* \d+ min", md)
    assert len(code_cells(path)) <= 40, f"{path.name}: too many code cells (the guide says ≤ 40); move logic into labkit"
    # inherited MPLBACKEND=Agg (batch jobs on clusters) would otherwise make every plot vanish
    assert "".join(code_cells(path)[0]["source"]).startswith("%matplotlib inline\n"), \
        f"{path.name}: the imports cell must start with %matplotlib inline"
    # the Chinese edition prints in Chinese through labkit's IPython extension (a no-op in English)
    assert "".join(code_cells(path)[0]["source"]).splitlines()[1] == "%load_ext labkit", \
        f"{path.name}: the imports cell's second line must be %load_ext labkit"
    ignore = [c for c in code_cells(path) if "NBVAL_IGNORE_OUTPUT" in "".join(c["source"])]
    for c in ignore:
        first = "".join(c["source"]).splitlines()[0].strip()
        assert first == "# NBVAL_IGNORE_OUTPUT", f"{path.name}: the marker must be alone on the first line"


CHECK_CALL = re.compile(r"""\b(?:check|predict)\(\s*["']\d\d\.""")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_a_check_comes_before_the_last_third(path):
    """Pacing: the learner meets an exercise (a check or a prediction) before two thirds of the notebook, not only
    in a block at the end."""
    cells = json.loads(path.read_text())["cells"]
    at = [i for i, c in enumerate(cells) if c["cell_type"] == "code" and CHECK_CALL.search("".join(c["source"]))]
    assert at, f"{path.name}: no exercise at all"
    assert at[0] < 2 * len(cells) / 3, f"{path.name}: the first exercise is cell {at[0]} of {len(cells)}"


AMP_OLD = "torch.cuda" + ".amp"  # spelled in two parts so this file does not match itself


def test_no_torch_cuda_amp_anywhere():
    files = [p for p in ROOT.rglob("*") if p.suffix in {".py", ".ipynb"} and ".venv" not in p.parts
             and "dist" not in p.parts]
    offenders = [str(p.relative_to(ROOT)) for p in files if AMP_OLD in p.read_text(errors="ignore")]
    assert not offenders, f"deprecated {AMP_OLD} used in {offenders}; use torch.amp with device_type"


# A sentence that states hardware of "this machine" as a fixed fact (AMX, AVX-512, a core count, faster/slower)
# is true only on the machine that wrote it. Such sentences must be printed by code from what was detected, or be
# conditional ("where", "without", "if" ...). The scan caught all four fixed claims the workbook once had.
HW_WORDS = re.compile(r"\b(AMX|AVX-?512\w*|AVX2|\d+\s+(CPU\s+)?cores?|tensor cores|faster|slower)\b", re.I)
HERE_WORDS = re.compile(r"\b(this (CPU|machine|node|laptop)|here)\b", re.I)
HEDGES = re.compile(r"\b(if|where|whether|without|when|which|depends|says|printed|measured|detected|line above)\b",
                    re.I)


def fixed_hardware_claims(cells: list[dict]) -> list[str]:
    found = []
    for c in cells:
        if c["cell_type"] != "markdown":
            continue
        for sentence in re.split(r"(?<=[.!?:])\s+|\n\n|\n[-|*]", "".join(c["source"])):
            if HW_WORDS.search(sentence) and HERE_WORDS.search(sentence) and not HEDGES.search(sentence):
                found.append(" ".join(sentence.split()))
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_fixed_hardware_claims(path):
    claims = fixed_hardware_claims(json.loads(path.read_text())["cells"])
    assert not claims, f"{path.name} states this machine's hardware as fixed prose; print it from labkit.device: {claims}"


def test_fixed_hardware_claim_scan_catches_the_old_sentences():
    old = ["This CPU has **AMX-BF16** (see the ISA flags above): tile registers.",
           "Read this figure honestly: this machine has **2 CPU cores**, shared with the notebook kernel.",
           "AMX-BF16 makes bf16 matmuls many times faster here, a tiny model's step barely faster."]
    assert len(fixed_hardware_claims([{"cell_type": "markdown", "source": s} for s in old])) == 3
    fine = ["Without AMX, bf16 is emulated and slower.", "The line above says how many cores this machine has."]
    assert fixed_hardware_claims([{"cell_type": "markdown", "source": s} for s in fine]) == []


def test_no_bang_commands_in_notebooks():
    for path in NOTEBOOKS:
        for c in code_cells(path):
            assert not any(ln.lstrip().startswith("!") for ln in "".join(c["source"]).splitlines()), path.name


def test_catalog_matches_notebooks_dir():
    assert sorted(n.filename for n in catalog.available()) == [p.name for p in NOTEBOOKS]
    numbers = [n.number for n in catalog.NOTEBOOKS]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)
    for n in catalog.NOTEBOOKS:
        assert n.stem.startswith(n.number + "_")


def test_readme_map_is_current():
    text = (ROOT / "README.md").read_text()
    assert catalog.markdown_table() in text, "README notebook map is stale: run python tools/readme.py"
    first = text.split("## ")[0]
    assert "make lab" in first and "make test" in first, "the two commands come first"
    student = (ROOT / "docs" / "student" / "README.md").read_text()
    assert catalog.markdown_table() in student, "the student README's map is stale: run python tools/readme.py"


def test_readme_says_who_what_and_how_long_from_the_notebooks_own_numbers():
    """The README's first section: the audience, what a machine needs, and the total time, which is the sum of the
    notebooks' own estimates (rounded to the hour) and the disk the venv takes."""
    text = (ROOT / "README.md").read_text()
    block = text.split("## Who it is for")[1].split("\n## ")[0]
    minutes = sum(_estimated_minutes(p) for p in NOTEBOOKS)
    hours = re.search(r"about (\d+) hours", block)
    assert hours and int(hours.group(1)) == round(minutes / 60), (minutes, hours)
    for needed in ("Linux", "Triton", "2 CPU cores", "GB", "PyTorch"):
        assert needed in block, needed


def _estimated_minutes(path: Path) -> int:
    md = "".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"][:3])
    return int(re.search(r"\*\*Estimated time:\*\* (\d+) min", md).group(1))


def test_stated_times_follow_the_pacing_model_and_stretch_is_marked(load_tool):
    """Every notebook's header states the minutes of tools/pacing.py's model (within 5), with a core/stretch split
    exactly where it has stretch sections; the three overloaded notebooks have one."""
    pacing = load_tool("pacing")
    estimates = [pacing.estimate(p) for p in NOTEBOOKS]
    assert [msg for e in estimates for msg in pacing.problems(e)] == []
    assert {e.notebook[:2] for e in estimates if e.stretch} == {"08", "11", "14"}
    assert all(e.core <= 90 for e in estimates if e.stretch), "a core part of a split notebook is still long"


def test_a_markdown_only_build_keeps_outputs_and_refuses_code_changes(load_tool, tmp_path, monkeypatch):
    nbbuild = load_tool("nbbuild")
    monkeypatch.setattr(nbbuild, "OUT", tmp_path)
    src = tmp_path / "99_x.py"
    src.write_text("# %% [markdown]\n# # Old title\n\n# %%\nprint(1)\n")
    nbbuild.build(src, execute=True)
    src.write_text("# %% [markdown]\n# # New title\n\n# %%\nprint(1)\n")
    nbbuild.update_markdown(src)
    nb = json.loads((tmp_path / "99_x.ipynb").read_text())
    assert "".join(nb["cells"][0]["source"]) == "# New title"
    assert "".join(nb["cells"][1]["outputs"][0]["text"]) == "1\n"
    before = (tmp_path / "99_x.ipynb").read_text()
    src.write_text("# %% [markdown]\n# # New title\n\n# %%\nprint(2)\n")
    with pytest.raises(ValueError, match="cell 1 is not markdown-only"):
        nbbuild.update_markdown(src)
    assert (tmp_path / "99_x.ipynb").read_text() == before


def test_estimated_minutes_parse():
    for path in NOTEBOOKS:
        assert _estimated_minutes(path) > 0


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci and "CI=true" in ci and "set -euo pipefail" in ci
    makefile = (ROOT / "Makefile").read_text()
    assert "--nbval" in makefile and "tests notebooks" in makefile
    assert re.search(r"^test: lint test-native test-capped test-capped-bf16$", makefile, re.M), \
        "make test: lint, native, capped (avx2: nbval), capped (avx512-bf16: the CPU-dependent notebooks in a browser)"
    assert re.search(r"^\t\$\(BIN\)/ruff check labkit tests tools$", makefile, re.M), "make lint covers the tree"


def test_make_lab_allows_root_only_as_root():
    out = subprocess.run(["make", "-n", "-s", "lab", "VENV=" + sys.prefix], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    line = next(ln for ln in out.stdout.splitlines() if "jupyter lab" in ln)
    assert ("--allow-root" in line) == (os.getuid() == 0), line
    assert "--ip 127.0.0.1" in line and "--no-browser" in line


def test_nbbuild_parse_roundtrip(nbbuild):
    text = '# %% [markdown]\n# # T\n#\n# x\n# %%\na = 1\n\n# %% tags=["x"]\nb = 2\n'
    cells = nbbuild.parse(text)
    assert [(c["cell_type"], c["source"]) for c in cells] == [("markdown", "# T\n\nx"), ("code", "a = 1"),
                                                              ("code", "b = 2")]
    assert cells[2].metadata["tags"] == ["x"] and [c["id"] for c in cells] == ["c000", "c001", "c002"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_pairs_with_its_source(path):
    """jupytext's pairing metadata resolves each notebook to its own source in tools/nbsrc."""
    from jupytext.paired_paths import paired_paths

    formats = json.loads(path.read_text())["metadata"]["jupytext"]["formats"]
    paths = [p for p, _ in paired_paths(str(path), "ipynb", formats)]
    assert paths == [str(path), str(ROOT / "tools" / "nbsrc" / (path.stem + ".py"))]


def test_python_m_labkit_doctor_runs():
    out = subprocess.run([sys.executable, "-m", "labkit", "doctor"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "labkit doctor" in out.stdout and "device" in out.stdout and "tier" in out.stdout
    js = subprocess.run([sys.executable, "-m", "labkit", "doctor", "--json"], capture_output=True, text=True,
                        timeout=120)
    assert json.loads(js.stdout)["device"]["device_type"] in {"cpu", "cuda", "mps"}


def test_gpu_check_without_a_gpu_says_so_and_exits_0(tmp_path):
    """tools/gpu_check.py's no-GPU path, as CI runs it: one line, exit 0, no report written."""
    import torch

    out = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_check.py"), "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=120, check=False)
    if torch.cuda.is_available():  # a GPU machine runs the real check elsewhere (make gpu-check)
        return
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().count("\n") == 0 and "no CUDA GPU" in out.stdout
    assert not list(tmp_path.iterdir())
    assert "gpu-check:" in (ROOT / "Makefile").read_text()


def test_gpu_check_reports_one_gpu_nccl_as_not_measurable(load_tool):
    """busbw is 0 by definition with one rank: the report says "not measurable", and that neither passes nor fails."""
    gc = load_tool("gpu_check")
    nbs = [{"notebook": "03_loss_scaling.ipynb", "seconds": 1.0, "error": None}]
    one_gpu = {"device": {}, "nccl_allreduce": {"ok": None, "gpus": 1, "status": "not measurable: ..."},
               "peak_memory": {"ok": True}}
    assert gc.overall(nbs, one_gpu)
    assert not gc.overall(nbs, {**one_gpu, "peak_memory": {"ok": False}})
    assert not gc.overall([{**nbs[0], "error": "boom"}], one_gpu)
    md = gc.markdown({"device_name": "GPU", "notebooks": nbs, "cuda": one_gpu, "passed": True, "seconds": 1})
    assert "| nccl_allreduce | not measurable |" in md and "| nccl_allreduce | True |" not in md


def test_gpu_check_reports_every_failing_cell_and_respects_its_budget(load_tool, tmp_path, monkeypatch):
    """A GPU lease is short: one run must show every failing cell (its line and error, colours stripped), write the
    report after each step (the CUDA checks first), and report a notebook that would not fit the budget as not run.
    The GPU parts are stubbed: what is tested is the runner and the report."""
    import nbformat

    gc = load_tool("gpu_check")
    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    cells = ["x = 1", "assert x == 2, 'planted'", "print('still runs')", "raise ValueError('second')"]
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells]),
                   nbdir / "03_a.ipynb")
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("y = 2")]), nbdir / "04_b.ipynb")
    r = gc.run_notebook(nbdir / "03_a.ipynb", 60, keep=tmp_path / "kept")
    assert r["error"].startswith("code cell 2:") and "----> 1 assert x == 2, 'planted'" in r["error"]
    assert r["error"].endswith("AssertionError: planted") and "\x1b" not in r["error"]
    assert len(r["later_errors"]) == 1 and r["later_errors"][0].endswith("ValueError: second")
    kept = nbformat.read(tmp_path / "kept" / "03_a.ipynb", as_version=4)
    assert kept.cells[2].outputs[0]["text"] == "still runs\n"  # the cells after a failure ran
    md = gc.markdown({"device_name": "GPU", "notebooks": [r], "cuda": {}, "passed": False, "seconds": 1})
    assert "| 03_a.ipynb |" in md and "| AssertionError: planted |" in md and "ValueError: second" in md

    import torch

    monkeypatch.setattr(gc, "ROOT", tmp_path)
    monkeypatch.setattr(gc, "no_gpu_line", lambda: None)
    monkeypatch.setattr(gc, "cuda_results", lambda: {"device": {}, "peak_memory": {"ok": True}})
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "stub GPU")
    out = tmp_path / "out"
    assert gc.main(["--out", str(out), "--notebooks", "04", "--timeout-per-notebook", "60"]) == 0
    assert "**PASS**" in (out / "gpu-report.md").read_text()
    assert gc.main(["--out", str(out), "--notebooks", "03,04", "--budget", "1"]) == 1
    rep = json.loads((out / "gpu-report.json").read_text())
    assert [n["error"].startswith("not run:") for n in rep["notebooks"]] == [True, True] and not rep["passed"]


def test_nbval_kernels_import_only_what_make_lab_installs():
    """tests/conftest.py gives nbval's kernels (``--nbval-current-env``) the environment of tests/lab_env.py, as the
    browser's kernels have: a reference notebook that imported a test tool would fail nbval as it fails a learner."""
    nbval_kernel = pytest.importorskip("nbval.kernel")
    spec = nbval_kernel.NbvalKernelspecManager().get_kernel_spec(nbval_kernel.CURRENT_ENV_KERNEL_NAME)
    assert spec.env.get("LABKIT_LAB_ENV_BLOCKED") and spec.env.get("LABKIT_LAUNCH_SHARE"), spec.env
    env = {**os.environ, **spec.env}
    probe = "import labkit, importlib.util as u; print(u.find_spec('pytest') is None, u.find_spec('nbval') is None)"
    out = subprocess.run([spec.argv[0], "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.split() == ["True", "True"], (out.stdout, out.stderr)
