"""A GPU machine's install resolves: the pinned torch's CUDA build with every extra `make lab` and `make gpu-check`
install, resolved against the package index from this CPU machine (tools/cuda_install.py), and the checker that
reads pip's report catches a conflicting pin.
"""

from __future__ import annotations

import socket
import urllib.parse

import pytest

TORCH_CUDA = {"name": "torch", "version": "2.13.0",
              "requires_dist": ['triton==3.7.1; platform_system == "Linux" and python_version < "3.15"',
                                'nvidia-nccl-cu13==2.29.7; platform_system == "Linux"', "sympy>=1.13.3",
                                'opt-einsum>=3.3; extra == "opt-einsum"']}


def _report(*metas: dict) -> dict:
    return {"install": [{"metadata": m} for m in metas]}


@pytest.fixture(scope="module")
def tool(load_tool):
    return load_tool("cuda_install")


def test_a_consistent_cuda_install_has_no_problems(tool):
    rep = _report(TORCH_CUDA, {"name": "triton", "version": "3.7.1"}, {"name": "nvidia-nccl-cu13", "version": "2.29.7"})
    assert tool.problems(0, "", rep) == []


def test_a_conflicting_triton_pin_is_caught(tool):
    """The bug this test exists for: the kernels extra pinned triton 3.9.0, torch's CUDA wheel requires 3.7.1."""
    rep = _report(TORCH_CUDA, {"name": "triton", "version": "3.9.0"}, {"name": "nvidia-nccl-cu13", "version": "2.29.7"})
    found = tool.problems(0, "", rep)
    assert len(found) == 1 and "requires triton==3.7.1" in found[0] and "triton 3.9.0" in found[0]
    pip_says = ("ERROR: Cannot install labkit[kernels]==0.1.0 and torch==2.13.0 because these package versions have "
                "conflicting dependencies.\nERROR: ResolutionImpossible: for help visit https://pip.pypa.io/...")
    assert tool.problems(1, pip_says, None)[0].startswith("ResolutionImpossible")


def test_a_cpu_build_or_a_wrong_version_is_not_the_gpu_install(tool):
    cpu = {"name": "torch", "version": "2.13.0+cpu", "requires_dist": ["sympy>=1.13.3"]}
    assert any("not the CUDA build" in p for p in tool.problems(0, "", _report(cpu)))
    newer = {**TORCH_CUDA, "version": "2.14.0"}
    rep = _report(newer, {"name": "triton", "version": "3.7.1"}, {"name": "nvidia-nccl-cu13", "version": "2.29.7"})
    assert any("2.14.0 resolved" in p for p in tool.problems(0, "", rep))
    assert tool.problems(0, "", _report({"name": "numpy", "version": "2.0"})) == ["torch is not in the resolved install"]


def _index_reachable() -> bool:
    try:
        host = urllib.parse.urlparse("https://pypi.org/simple").hostname
        socket.create_connection((host, 443), timeout=10).close()
        return True
    except OSError:
        return False


@pytest.mark.slow
def test_the_cuda_install_resolves_against_the_package_index(tool):
    """~1 min: pip reads the wheels' metadata by HTTP range requests; only DeepSpeed's 2 MB sdist is downloaded."""
    if not _index_reachable():
        pytest.skip("no package index reachable from here (pypi.org:443): the CUDA install cannot be resolved")
    rc, output, report = tool.resolve()
    assert tool.problems(rc, output, report) == []
    names = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in report["install"]}
    assert names["triton"] == "3.7.1" and "deepspeed" in names and "pytest" in names and "nbval" in names
