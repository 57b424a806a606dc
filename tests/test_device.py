"""labkit.device: the one device gate decides from measurement, and refuses impossible requests clearly."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from labkit import device as dev_gate

LABKIT = Path(__file__).resolve().parents[1] / "labkit"


def test_pick_device_and_overrides(monkeypatch):
    monkeypatch.delenv("LABKIT_DEVICE", raising=False)
    dev = dev_gate.pick_device()
    assert dev.type == ("cuda" if torch.cuda.is_available() else dev.type)
    assert dev_gate.pick_device("cpu") == torch.device("cpu")
    monkeypatch.setenv("LABKIT_DEVICE", "cpu")
    assert dev_gate.pick_device() == torch.device("cpu")


def test_pick_device_refuses_missing_gpu():
    if torch.cuda.is_available():
        assert dev_gate.pick_device("cuda").type == "cuda"
    else:
        with pytest.raises(ValueError, match="no GPU"):
            dev_gate.pick_device("cuda")
    with pytest.raises(ValueError):
        dev_gate.pick_device("tpu")
    with pytest.raises(TypeError):
        dev_gate.pick_device(3)


def test_capabilities_are_measured_and_consistent():
    caps = dev_gate.capabilities("cpu")
    assert caps.device_type == "cpu" and caps.tier == "cpu" and not caps.fp8_matmul
    assert caps.bf16 == dev_gate.computes(torch.bfloat16, "cpu")
    # what computes() claims must really work
    if caps.bf16:
        with torch.amp.autocast(device_type="cpu", dtype=torch.bfloat16):
            assert torch.nn.functional.linear(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.bfloat16
    if caps.fp16:
        with torch.amp.autocast(device_type="cpu", dtype=torch.float16):
            assert (torch.ones(4, 4) @ torch.ones(4, 4)).dtype == torch.float16
    assert caps.autocast_dtype == str(dev_gate.autocast_dtype("cpu")).replace("torch.", "")
    assert set(caps.as_dict()) >= {"tier", "bf16", "fp16", "tf32_matmul", "fp8_matmul", "cpu_isa"}


def test_cpu_isa_flags_match_proc_cpuinfo():
    flags = dev_gate.cpu_isa_flags()
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    for f in flags:
        assert f" {f}" in text


def test_backend_memory_and_sync_on_cpu():
    assert dev_gate.dist_backend("cpu") == "gloo"
    assert dev_gate.max_memory_allocated("cpu") is None
    dev_gate.reset_peak_memory_stats("cpu")
    dev_gate.synchronize("cpu")
    assert dev_gate.is_cuda("cpu") is False


def test_three_questions_natively():
    """computes / fast / deepspeed_accepts, each answered by its own source; fast implies computes."""
    for dt in (torch.bfloat16, torch.float16):
        if dev_gate.fast(dt, "cpu"):
            assert dev_gate.computes(dt, "cpu")
        # torch's own oneDNN answer is what "fast" must never contradict
        mk = {torch.bfloat16: torch.ops.mkldnn._is_mkldnn_bf16_supported,
              torch.float16: torch.ops.mkldnn._is_mkldnn_fp16_supported}[dt]()
        assert not dev_gate.fast(dt, "cpu") or mk
    assert dev_gate.fast(torch.float32, "cpu") and dev_gate.deepspeed_accepts(torch.float32)
    assert not dev_gate.fast(torch.float8_e4m3fn, "cpu")  # no CPU has native fp8 matmul units
    from deepspeed.accelerator import get_accelerator
    assert dev_gate.deepspeed_accepts(torch.float16) == bool(get_accelerator().is_fp16_supported())
    caps = dev_gate.capabilities("cpu")
    assert (caps.bf16_fast, caps.fp16_fast) == (dev_gate.fast(torch.bfloat16, "cpu"), dev_gate.fast(torch.float16, "cpu"))
    assert caps.cpu_class == dev_gate.cpu_class() and caps.cpu_class in dev_gate.cpu_summary()


def test_fast_follows_the_onednn_cap(monkeypatch):
    """$ONEDNN_MAX_CPU_ISA is read the way oneDNN reads it: levels in order, aliases, unknown values ignored."""
    for cap, level, ok in [("AVX2", "AVX512_CORE_BF16", False), ("avx512_core_vnni", "AVX512_CORE_BF16", False),
                           ("AVX512_CORE_BF16", "AVX512_CORE_BF16", True), ("AVX10_1_512", "AVX512_CORE_FP16", True),
                           ("AVX512_CORE_BF16", "AVX512_CORE_FP16", False), ("ALL", "AVX512_CORE_AMX", True),
                           ("nonsense", "AVX512_CORE_AMX", True)]:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
        assert dev_gate._onednn_allows(level) is ok, (cap, level)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert not dev_gate.fast(torch.bfloat16, "cpu") and not dev_gate.fast(torch.float16, "cpu")


def test_autocast_dtype_prefers_fast_then_computes(monkeypatch):
    """The choice rule: a V100 (fp16 fast, bf16 only emulated) gets fp16; a CPU without either fast gets bf16."""
    def answers(fast_set, computes_set):
        monkeypatch.setattr(dev_gate, "fast", lambda dt, dev=None: dt in fast_set)
        monkeypatch.setattr(dev_gate, "computes", lambda dt, dev=None: dt in computes_set)
    bf, fp = torch.bfloat16, torch.float16
    answers({fp}, {bf, fp})
    assert dev_gate.autocast_dtype("cpu") == fp        # V100/T4
    answers(set(), {bf, fp})
    assert dev_gate.autocast_dtype("cpu") == bf        # laptop CPU
    answers({bf, fp}, {bf, fp})
    assert dev_gate.autocast_dtype("cpu") == bf        # A100, AMX
    answers(set(), set())
    with pytest.raises(ValueError, match="use fp32"):
        dev_gate.autocast_dtype("cpu")


def test_cuda_gate_never_counts_emulated_bf16():
    """The CUDA branch of fast() decides bf16 from the compute capability, not is_bf16_supported()."""
    src = Path(dev_gate.__file__).read_text()
    tree = ast.parse(src)
    fast_src = ast.get_source_segment(src, next(n for n in tree.body if isinstance(n, ast.FunctionDef)
                                                 and n.name == "fast"))
    calls = {n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and isinstance(n.func.value, ast.Attribute) and n.func.value.attr == "cuda"}  # torch.cuda.X(...)
    assert "get_device_capability" in fast_src and "is_bf16_supported" not in calls
    if torch.cuda.is_available():
        cc = torch.cuda.get_device_capability()
        assert dev_gate.fast(torch.bfloat16, "cuda") == (cc >= (8, 0))


def test_computes_rejects_bad_dtypes():
    assert dev_gate.computes(torch.float32, "cpu")
    with pytest.raises(ValueError):
        dev_gate.computes(torch.int8, "cpu")
    with pytest.raises(TypeError):
        dev_gate.computes("bf16", "cpu")
    with pytest.raises(ValueError):
        dev_gate.fast(torch.int8, "cpu")
    with pytest.raises(TypeError):
        dev_gate.fast("bf16", "cpu")
    with pytest.raises(ValueError):
        dev_gate.deepspeed_accepts(torch.float64)


def test_deepspeed_accepts_without_deepspeed_names_the_install_command():
    """A learner whose kernel lacks DeepSpeed is told what installs it, not only 'No module named'."""
    probe = ("import sys, torch\n"
             "class Absent:\n"  # as in a venv without DeepSpeed
             "    def find_spec(self, name, path=None, target=None):\n"
             "        if name.partition('.')[0] == 'deepspeed': raise ModuleNotFoundError(name, name=name)\n"
             "sys.meta_path.insert(0, Absent())\n"
             "from labkit import device\n"
             "try: device.deepspeed_accepts(torch.float16)\n"
             "except ModuleNotFoundError as e: print(e.name, '|', e)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "DS_ACCELERATOR": "cpu"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("deepspeed |") and "make lab" in out.stdout and "pip install" in out.stdout


def test_set_tf32_roundtrip():
    before = dev_gate.set_tf32(True)
    try:
        assert torch.backends.cuda.matmul.allow_tf32 is True
    finally:
        dev_gate.set_tf32(bool(before["matmul"]))
    assert torch.backends.cuda.matmul.allow_tf32 == before["matmul"]
    with pytest.raises(TypeError):
        dev_gate.set_tf32("yes")


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
    assert dev_gate.memory_reserved("cpu") is None and dev_gate.memory_allocated("cpu") is None
    assert dev_gate.empty_cache("cpu") is None  # a no-op, no error


def test_event_timer_flushes_l2_before_the_start_event_and_times_between_events(monkeypatch):
    """do_bench's order, checked without a GPU: flush queued, start event, fn, end event, then synchronise."""
    calls: list[str] = []

    class FakeEvent:
        def __init__(self, enable_timing: bool) -> None:
            assert enable_timing
            self.name = "start" if not any(c.startswith("new") for c in calls) else "end"
            calls.append(f"new {self.name}")

        def record(self) -> None:
            calls.append(f"record {self.name}")

        def synchronize(self) -> None:
            calls.append(f"sync {self.name}")

        def elapsed_time(self, other: FakeEvent) -> float:
            return 2.5  # ms

    class FakeBuffer:
        def zero_(self) -> None:
            calls.append("flush")

    import contextlib

    @contextlib.contextmanager
    def on_device(d):
        calls.append(f"on {d}")
        yield

    made = []
    monkeypatch.setattr(dev_gate, "_present", lambda d=None: torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "device", on_device)
    monkeypatch.setattr(torch, "empty", lambda n, dtype, device: made.append((n, dtype, device)) or FakeBuffer())
    timer = dev_gate.event_timer("cuda")
    assert made == [(dev_gate.L2_FLUSH_BYTES // 4, torch.int32, torch.device("cuda", 0))]
    assert timer(lambda: calls.append("fn")) == 0.0025
    assert [c for c in calls if not c.startswith("new")] == ["on cuda:0", "flush", "record start", "fn", "record end",
                                                              "sync end"]
    with pytest.raises(ValueError):
        dev_gate.event_timer("cuda", flush_bytes=-1)
