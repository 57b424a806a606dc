"""labkit.device: the one device gate decides from measurement, and refuses impossible requests clearly."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from labkit import device as D

LABKIT = Path(__file__).resolve().parents[1] / "labkit"


def test_pick_device_and_overrides(monkeypatch):
    monkeypatch.delenv("LABKIT_DEVICE", raising=False)
    dev = D.pick_device()
    assert dev.type == ("cuda" if torch.cuda.is_available() else dev.type)
    assert D.pick_device("cpu") == torch.device("cpu")
    monkeypatch.setenv("LABKIT_DEVICE", "cpu")
    assert D.pick_device() == torch.device("cpu")


def test_pick_device_refuses_missing_gpu():
    if torch.cuda.is_available():
        assert D.pick_device("cuda").type == "cuda"
    else:
        with pytest.raises(ValueError, match="no GPU"):
            D.pick_device("cuda")
    with pytest.raises(ValueError):
        D.pick_device("tpu")
    with pytest.raises(TypeError):
        D.pick_device(3)


def test_capabilities_are_measured_and_consistent():
    caps = D.capabilities("cpu")
    assert caps.device_type == "cpu" and caps.tier == "cpu" and not caps.fp8_matmul
    assert caps.bf16 == D.supports(torch.bfloat16, "cpu")
    # what supports() claims must really work
    if caps.bf16:
        with torch.amp.autocast(device_type="cpu", dtype=torch.bfloat16):
            assert torch.nn.functional.linear(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.bfloat16
    if caps.fp16:
        with torch.amp.autocast(device_type="cpu", dtype=torch.float16):
            assert (torch.ones(4, 4) @ torch.ones(4, 4)).dtype == torch.float16
    assert caps.autocast_dtype == str(D.autocast_dtype("cpu")).replace("torch.", "")
    assert set(caps.as_dict()) >= {"tier", "bf16", "fp16", "tf32_matmul", "fp8_matmul", "cpu_isa"}


def test_cpu_isa_flags_match_proc_cpuinfo():
    flags = D.cpu_isa_flags()
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    for f in flags:
        assert f" {f}" in text


def test_backend_memory_and_sync_on_cpu():
    assert D.dist_backend("cpu") == "gloo"
    assert D.max_memory_allocated("cpu") is None
    D.reset_peak_memory_stats("cpu")
    D.synchronize("cpu")
    assert D.is_cuda("cpu") is False


def test_supports_rejects_bad_dtypes():
    assert D.supports(torch.float32, "cpu")
    with pytest.raises(ValueError):
        D.supports(torch.int8, "cpu")
    with pytest.raises(TypeError):
        D.supports("bf16", "cpu")


def test_set_tf32_roundtrip():
    before = D.set_tf32(True)
    try:
        assert torch.backends.cuda.matmul.allow_tf32 is True
    finally:
        D.set_tf32(bool(before["matmul"]))
    assert torch.backends.cuda.matmul.allow_tf32 == before["matmul"]
    with pytest.raises(TypeError):
        D.set_tf32("yes")


def _cuda_accesses(source: str) -> list[int]:
    """Line numbers of code (not strings) that reaches torch.cuda or torch.backends.cuda."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr == "cuda":
            inner = node.value
            chain = []
            while isinstance(inner, ast.Attribute):
                chain.append(inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name) and inner.id == "torch" and chain in ([], ["backends"]):
                lines.append(node.lineno)
    return sorted(lines)


def test_only_the_gate_touches_torch_cuda():
    """The device gate is the one place that checks CUDA directly."""
    offenders = []
    for p in LABKIT.rglob("*.py"):
        if p.name == "device.py":
            continue
        hits = _cuda_accesses(p.read_text())
        if hits:
            offenders.append(f"{p.relative_to(LABKIT.parent)}:{hits}")
    assert not offenders, f"use labkit.device instead of torch.cuda in {offenders}"
    assert _cuda_accesses("import torch\ntorch.cuda.synchronize()\nx = torch.backends.cuda.matmul") == [2, 3]
    assert _cuda_accesses("s = 'torch.cuda.is_available()'") == []


def test_allocator_queries_off_cuda():
    assert D.memory_reserved("cpu") is None and D.memory_allocated("cpu") is None
    assert D.empty_cache("cpu") is None  # a no-op, no error
