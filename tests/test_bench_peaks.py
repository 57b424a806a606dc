"""Tests for labkit.bench's peaks: the theoretical-peak formula against datasheets, measured peaks and bandwidth."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from labkit import bench
from labkit import device as dev_gate


@pytest.mark.parametrize("dtype,isa,units,want", [
    ("fp32", ("avx512f", "avx2", "fma"), 2, 64),   # 16 lanes x FMA (2) x 2 ports
    ("fp32", ("avx512f",), 1, 32),
    ("fp32", ("avx2", "fma"), 2, 32),
    ("fp32", (), 2, 8),
    ("bf16", ("avx512f", "avx512_bf16", "amx_tile", "amx_bf16"), 2, 1024),  # Intel: AMX 1024 BF16 ops/cycle
    ("bf16", ("avx512f", "avx512_bf16"), 2, 128),
    ("bf16", ("avx512f",), 2, 64),
    ("fp16", ("avx512f", "avx512_fp16"), 2, 128),
    ("fp16", ("avx512f", "avx512_fp16", "amx_fp16"), 2, 1024),
])
def test_cpu_flops_per_cycle(dtype, isa, units, want):
    got, unit = bench.cpu_flops_per_cycle(dtype, isa, units)
    assert got == want and isinstance(unit, str) and unit


def test_cpu_flops_per_cycle_bad_input():
    with pytest.raises(ValueError):
        bench.cpu_flops_per_cycle("fp32", ("avx512f",), 0)
    with pytest.raises(ValueError, match="peak dtypes"):
        bench.cpu_flops_per_cycle("fp8", ())
    with pytest.raises(TypeError):
        bench.cpu_flops_per_cycle(32, ())


# (capability, SMs, boost GHz, dtype, datasheet dense TFLOP/s)
DATASHEETS = [
    ((7, 0), 80, 1.53, "fp16", 125.0),    # V100 SXM2
    ((7, 0), 80, 1.53, "fp32", 15.7),
    ((7, 5), 40, 1.59, "fp16", 65.0),     # T4
    ((8, 0), 108, 1.41, "bf16", 312.0),   # A100
    ((8, 0), 108, 1.41, "tf32", 156.0),
    ((8, 0), 108, 1.41, "fp32", 19.5),
    ((8, 9), 58, 2.04, "bf16", 121.0),    # L4 (242 with sparsity)
    ((8, 9), 142, 2.52, "fp16", 362.0),   # L40S (733 with sparsity)
    ((9, 0), 132, 1.83, "bf16", 989.0),   # H100 SXM
    ((9, 0), 132, 1.83, "tf32", 494.0),
]


@pytest.mark.parametrize("cap,sms,ghz,dtype,tflops", DATASHEETS)
def test_cuda_formula_reproduces_datasheets(cap, sms, ghz, dtype, tflops):
    per_sm = bench.cuda_flops_per_clock_per_sm(cap, dtype)
    assert per_sm is not None
    assert sms * ghz * 1e9 * per_sm / 1e12 == pytest.approx(tflops, rel=0.02)


def test_cuda_table_unknowns():
    assert bench.cuda_flops_per_clock_per_sm((7, 0), "bf16") is None  # Volta has no bf16 tensor cores
    assert bench.cuda_flops_per_clock_per_sm((3, 5), "fp32") is None
    with pytest.raises(ValueError):
        bench.cuda_flops_per_clock_per_sm((8, 0), "int4")


def test_theoretical_peak_on_cuda_goes_through_the_device_gate(monkeypatch):
    props = {"name": "NVIDIA A100-SXM4-80GB", "capability": (8, 0), "sm_count": 108, "clock_khz": 1410000,
             "memory_clock_khz": 1593000, "memory_bus_width_bits": 5120, "total_memory": 80 * 2**30}
    monkeypatch.setattr(dev_gate, "cuda_properties", lambda dev=None: props)
    peak = bench.theoretical_peak("bf16", torch.device("cuda"))
    assert peak.flops_per_s == pytest.approx(312e12, rel=0.01)
    assert "108 SMs" in peak.formula and "2048 FLOP/clock/SM" in peak.formula
    assert any("A100" in a for a in peak.assumptions)
    monkeypatch.setattr(dev_gate, "cuda_properties", lambda dev=None: {**props, "capability": (7, 0)})
    with pytest.raises(ValueError, match="no FLOPs/clock/SM"):
        bench.theoretical_peak("bf16", torch.device("cuda"))
    monkeypatch.setattr(dev_gate, "cuda_properties", lambda dev=None: {**props, "clock_khz": None})
    with pytest.raises(ValueError, match="clock"):
        bench.theoretical_peak("fp32", torch.device("cuda"))


def test_cuda_properties_is_none_off_cuda():
    assert dev_gate.cuda_properties("cpu") is None


def test_theoretical_peak_on_cpu_is_the_product_of_its_parts():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = bench.theoretical_peak("fp32", "cpu")
    finally:
        torch.set_num_threads(before)
    isa = dev_gate.cpu_isa_in_use()
    per, _ = bench.cpu_flops_per_cycle("fp32", isa, bench._default_fma_units(wide="avx512f" in isa)[0])
    cores, ghz = one.formula.split(" cores x ")[0], float(one.formula.split(" x ")[1].split()[0])
    assert cores == "1" and one.flops_per_s == pytest.approx(ghz * 1e9 * per, rel=0.01)
    assert f"{per} FLOP/cycle" in one.formula
    text = one.describe()
    assert text.startswith("fp32:") and text.count("assumes:") == len(one.assumptions) >= 3
    with pytest.raises(ValueError):
        bench.theoretical_peak("fp32", "meta")


def test_peak_matmul_flops_keeps_the_best_shape():
    shapes = ((64, 64, 64), (128, 64, 32))
    r = bench.peak_matmul_flops("fp32", "cpu", shapes, repeats=2)
    assert set(r.per_shape) == set(shapes)
    assert r.flops_per_s == max(r.per_shape.values()) == r.per_shape[r.shape]
    assert r.dtype == "fp32" and r.flops_per_s > 0
    assert bench.peak_matmul_flops(torch.float32, "cpu", ((32, 32, 32),), repeats=1).dtype == "fp32"


def test_peak_matmul_flops_bad_input():
    with pytest.raises(ValueError, match="peak dtypes"):
        bench.peak_matmul_flops("fp64", "cpu")
    with pytest.raises(ValueError):
        bench.peak_matmul_flops(torch.float64, "cpu")
    with pytest.raises(ValueError, match="three positive ints"):
        bench.peak_matmul_flops("fp32", "cpu", ((64, 64),))
    with pytest.raises(ValueError):
        bench.peak_matmul_flops("fp32", "cpu", ())
    with pytest.raises(ValueError):
        bench.peak_matmul_flops("fp32", "cpu", ((8, 8, 8),), repeats=0)


def test_memory_bandwidth_counts_read_plus_write():
    r = bench.memory_bandwidth(2**20, "cpu", repeats=2)
    assert r.nbytes == 2**20
    assert r.bytes_per_s == pytest.approx(2 * r.nbytes / r.seconds)
    with pytest.raises(ValueError):
        bench.memory_bandwidth(100, "cpu")
    with pytest.raises(ValueError):
        bench.memory_bandwidth(True, "cpu")


def test_default_peak_shapes():
    cpu = bench.default_peak_shapes("cpu")
    assert len(cpu) >= 3 and all(len(s) == 3 for s in cpu)
    assert max(m * n * k for m, n, k in cpu) <= 2048**3  # about a second per shape on 2 cores
    for name, dt in bench.PEAK_DTYPES.items():  # what the gate says this CPU emulates gets one small shape
        shapes = bench.default_peak_shapes("cpu", name)
        assert (shapes == (bench.EMULATED_PEAK_SHAPE,)) == (not dev_gate.fast(dt, "cpu")), (name, shapes)


def test_an_emulated_dtype_is_measured_on_one_small_shape_and_labelled(monkeypatch):
    """On a CPU that emulates fp16 (~100x slower than fp32), `peak` must not time 2048^3 fp16 matmuls."""
    real_fast = dev_gate.fast
    monkeypatch.setattr(dev_gate, "fast", lambda dt, d=None: dt == torch.float32 or (
        dt != torch.float16 and real_fast(dt, d)))
    assert bench.default_peak_shapes("cpu", "fp16") == (bench.EMULATED_PEAK_SHAPE,)
    assert len(bench.default_peak_shapes("cpu", "fp32")) >= 3
    seen = []
    real_mm = bench.time_fn
    monkeypatch.setattr(bench, "time_fn", lambda fn, **kw: (seen.append(fn.args[0].shape), real_mm(fn, **kw))[1])
    r = bench.peak_matmul_flops("fp16", "cpu", repeats=1)
    assert r.emulated and r.shape == bench.EMULATED_PEAK_SHAPE and seen == [torch.Size([256, 256])]
    assert not bench.peak_matmul_flops("fp32", "cpu", ((64, 64, 64),), repeats=1).emulated
    text = bench.peak_report(("fp32", "fp16"), "cpu", 2**20, shapes=((64, 64, 64),))
    assert "fp16: not native here" in text and "fp32: not native" not in text


def test_python_m_labkit_bench_peak_prints_measured_and_theoretical():
    out = subprocess.run([sys.executable, "-m", "labkit.bench", "peak", "--dtypes", "fp32,bf16", "--sizes", "128,256",
                          "--bandwidth-mib", "4", "--threads", "1"], check=False, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "fp32: measured" in text and "theoretical" in text and "assumes:" in text and "GB/s" in text
    assert ("bf16: measured" in text) == dev_gate.computes(torch.bfloat16, "cpu")


@pytest.mark.parametrize(("vendor", "family", "wide", "units", "said"), [
    ("AuthenticAMD", 25, True, 1, "Zen 4 runs each 512-bit instruction on its two 256-bit"),
    ("AuthenticAMD", 25, False, 2, "256-bit FMA units"),
    ("AuthenticAMD", 26, True, 2, "Zen 5"),
    ("GenuineIntel", 6, True, 2, "Xeon Gold/Platinum"),
    ("", None, True, 2, "an assumption"),
])
def test_fma_units_follow_the_cpu_vendor_and_family(monkeypatch, vendor, family, wide, units, said):
    monkeypatch.setattr(bench, "_cpu_vendor_family", lambda: (vendor, family))
    got, why = bench._default_fma_units(wide)
    assert got == units and said in why


def test_theoretical_peak_on_zen4_counts_one_512_bit_unit(monkeypatch):
    """AMD Zen 4 double-pumps AVX-512: its fp32 peak per cycle is AVX2's, 32 FLOP, not 64."""
    monkeypatch.setattr(bench, "_cpu_vendor_family", lambda: ("AuthenticAMD", 25))
    monkeypatch.setattr(bench.dev_gate, "cpu_isa_in_use", lambda: ("avx2", "fma", "avx512f", "avx512_bf16"))
    peak = bench.theoretical_peak("fp32", "cpu")
    assert "x 32 FLOP/cycle" in peak.formula and any("Zen 4" in a for a in peak.assumptions)
    assert "x 64 FLOP/cycle" in bench.theoretical_peak("bf16", "cpu").formula
    assert "x 64 FLOP/cycle" in bench.theoretical_peak("fp32", "cpu", fma_units=2).formula
