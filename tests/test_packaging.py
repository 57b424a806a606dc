"""pyproject.toml, environment.yml and the torch installer agree."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def install_torch(load_tool):
    """tools/install_torch.py, loaded by tests/conftest.py (no sys.path edit)."""
    return load_tool("install_torch")


CONDA_TO_PIP = {"pytorch": "torch", "msgpack-python": "msgpack"}


def norm(req: str) -> str:
    name = re.split(r"[<>=!~\[ ;]", req.strip(), maxsplit=1)[0]
    name = name.lower().replace("_", "-")
    return CONDA_TO_PIP.get(name, name)


def pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def environment_names() -> tuple[set[str], set[str], str]:
    conda, pip = set(), set()
    text = (ROOT / "environment.yml").read_text()
    in_pip = False
    for line in text.split("dependencies:", 1)[1].splitlines():
        s = line.strip()
        if s.startswith("- pip:"):
            in_pip = True
            continue
        if not s.startswith("- "):
            continue
        item = s[2:].strip()
        if in_pip and line.startswith("      -"):
            if not item.startswith("-e"):
                pip.add(norm(item))
        elif not in_pip:
            conda.add(norm(item.split("=")[0]))
    return conda, pip, text


def test_environment_yml_lists_the_same_packages():
    p = pyproject()
    want = {norm(r) for r in p["dependencies"]} | {norm(r) for r in p["optional-dependencies"]["dev"]}
    conda, pip, text = environment_names()
    have = (conda | pip) - {"python", "pip"}
    ds_build = {"ninja", "packaging", "py-cpuinfo", "pydantic", "hjson", "msgpack", "einops", "setuptools", "wheel"}
    assert want - have == set(), f"in pyproject.toml but not environment.yml: {sorted(want - have)}"
    assert have - want - ds_build == set(), f"in environment.yml but not pyproject.toml: {sorted(have - want - ds_build)}"
    ds = [norm(r) for r in p["optional-dependencies"]["deepspeed"]]
    assert ds == ["deepspeed"] and "post-install: DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed==" in text


def test_torch_pins_agree():
    makefile = (ROOT / "Makefile").read_text()
    pin = re.search(r"TORCH\s+\?= (torch==[\d.]+)", makefile).group(1)
    assert f"- {pin}" in (ROOT / "environment.yml").read_text()
    version = pin.split("==")[1]
    spec = next(r for r in pyproject()["dependencies"] if norm(r) == "torch")
    lo, hi = re.findall(r">=([\d.]+)", spec)[0], re.findall(r"<([\d.]+)", spec)[0]
    as_tuple = lambda v: tuple(int(x) for x in v.split("."))  # noqa: E731
    assert as_tuple(lo) <= as_tuple(version) < as_tuple(hi)
    # notebook 01 asserts that torch saturates E4M3FN on overflow (500 -> 448); torch before 2.13 gave NaN
    assert as_tuple(lo) >= (2, 13), "the torch floor must admit only releases that saturate E4M3FN casts"


@pytest.mark.parametrize("index,gpu,resolved,system,expect", [
    ("auto", False, "2.13.0+cpu", "Linux", None),
    ("auto", False, "2.13.0", "Linux", "CPU_INDEX"),
    ("auto", False, None, "Linux", "CPU_INDEX"),
    ("auto", True, "2.13.0", "Linux", None),
    ("auto", False, "2.13.0", "Darwin", None),
    ("cpu", True, None, "Linux", "CPU_INDEX"),
    ("cu128", False, None, "Linux", "https://download.pytorch.org/whl/cu128"),
    ("pypi", False, None, "Linux", None),
])
def test_choose_torch_index(install_torch, index, gpu, resolved, system, expect):
    expect = install_torch.CPU_INDEX if expect == "CPU_INDEX" else expect
    assert install_torch.choose_index(index, gpu, resolved, system) == expect


def test_choose_torch_index_rejects_nonsense(install_torch):
    with pytest.raises(ValueError, match="TORCH_INDEX"):
        install_torch.choose_index("gpu-please", False, None, "Linux")
