"""Tests for labkit.roofline: FLOP and byte counts against torch's own counters and tensor sizes, the roof maths."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from labkit import roofline as R


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int8,
                                   torch.bool, torch.float8_e4m3fn, torch.float8_e5m2])
def test_dtype_bytes_matches_torch(dtype):
    assert R.dtype_bytes(dtype) == torch.empty((), dtype=dtype).element_size()
    assert R.dtype_bytes(str(dtype)) == torch.empty((), dtype=dtype).element_size()


def test_dtype_bytes_names_and_errors():
    assert [R.dtype_bytes(n) for n in ("fp32", "bf16", "fp16", "tf32", "e4m3fn", "bfloat16", "half")] == [4, 2, 2, 4, 1,
                                                                                                          2, 2]
    assert R.dtype_bytes(3) == 3
    with pytest.raises(ValueError, match="unknown dtype"):
        R.dtype_bytes("fp12")
    with pytest.raises(ValueError):
        R.dtype_bytes(0)
    with pytest.raises(TypeError):
        R.dtype_bytes(True)
    with pytest.raises(TypeError):
        R.dtype_bytes(4.0)


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (64, 32, 16), (128, 1, 256), (7, 300, 5)])
def test_matmul_cost_matches_flop_counter_and_tensor_bytes(m, n, k):
    a, b = torch.randn(m, k), torch.randn(k, n)
    with FlopCounterMode(display=False) as fc:
        c = a @ b
    cost = R.matmul_cost(m, n, k, torch.float32)
    assert cost.flops == fc.get_total_flops() == 2 * m * n * k
    assert cost.bytes == a.nbytes + b.nbytes + c.nbytes
    assert R.matmul_cost(m, n, k, "bf16").bytes == cost.bytes / 2


def test_square_matmul_intensity_is_n_over_6_in_fp32_and_grows():
    for n in (64, 512, 4096):
        assert R.matmul_cost(n, n, n).intensity == pytest.approx(n / 6)
    # a matrix-vector product stays near 0.5 FLOP/byte however large: memory-bound
    assert R.matmul_cost(4096, 1, 4096).intensity < 0.51
    assert R.matmul_cost(4096, 4096, 4096, "bf16").intensity == pytest.approx(2 * 4096 / 6)


def test_matmul_cost_bad_shapes():
    with pytest.raises(ValueError, match="m must be a positive int"):
        R.matmul_cost(0, 2, 2)
    with pytest.raises(ValueError):
        R.matmul_cost(2, 2.5, 2)


def test_elementwise_cost_counts_each_tensor_once():
    x, y = torch.randn(1000), torch.randn(1000)
    z = x + y
    cost = R.elementwise_cost(x.numel(), torch.float32, n_inputs=2, flops_per_element=1)
    assert cost.bytes == x.nbytes + y.nbytes + z.nbytes
    assert cost.intensity == pytest.approx(1 / 12)
    with pytest.raises(ValueError):
        R.elementwise_cost(10, n_inputs=0)
    with pytest.raises(ValueError):
        R.elementwise_cost(10, flops_per_element=-1)


def test_elementwise_chain_fusion_divides_bytes_by_the_number_of_ops():
    un = R.elementwise_chain_cost(1 << 20, 5, "fp32", fused=False)
    fu = R.elementwise_chain_cost(1 << 20, 5, "fp32", fused=True)
    assert un.flops == fu.flops == 5 * (1 << 20)
    assert un.bytes == 5 * fu.bytes == 5 * 2 * 4 * (1 << 20)
    assert fu.intensity == pytest.approx(5 * un.intensity)
    extra = R.elementwise_chain_cost(100, 3, fused=True, extra_input_bytes=100)
    assert extra.bytes == 2 * 100 * 4 + 100
    with pytest.raises(TypeError):
        R.elementwise_chain_cost(10, 2, fused="yes")


def test_layernorm_and_softmax_costs_match_tensor_sizes():
    x = torch.randn(32, 96)
    ln = torch.nn.LayerNorm(96)
    y = ln(x)
    cost = R.layernorm_cost(32, 96, torch.float32)
    assert cost.bytes == x.nbytes + y.nbytes + ln.weight.nbytes + ln.bias.nbytes
    assert cost.flops == 8 * x.numel()
    assert R.layernorm_cost(32, 96, affine=False).bytes == x.nbytes + y.nbytes
    s = R.softmax_cost(32, 96, "fp16")
    assert s.bytes == 2 * x.numel() * 2 and s.flops == 5 * x.numel()
    # both are about 1 FLOP/byte or less: memory-bound on any real device
    assert cost.intensity < 1.1 and s.intensity < 1.5


def test_ridge_attainable_bound():
    peak, bw = 1e12, 1e11  # ridge at 10 FLOP/byte
    assert R.ridge_point(peak, bw) == 10
    assert R.attainable(1, peak, bw) == 1e11
    assert R.attainable(10, peak, bw) == peak
    assert R.attainable(1000, peak, bw) == peak
    assert R.bound(9.99, peak, bw) == "memory"
    assert R.bound(10, peak, bw) == "compute"
    for bad in (0, -1, math.inf, math.nan):
        with pytest.raises(ValueError):
            R.attainable(bad, peak, bw)
    with pytest.raises(TypeError):
        R.ridge_point("1e12", bw)


def test_attainable_is_continuous_and_monotone():
    peak, bw = 3e11, 2e10
    xs = [10 ** (e / 10) for e in range(-30, 40)]
    ys = [R.attainable(x, peak, bw) for x in xs]
    assert ys == sorted(ys) and max(ys) == peak
    r = R.ridge_point(peak, bw)
    assert R.attainable(r * (1 - 1e-9), peak, bw) == pytest.approx(peak)


def test_place_fraction_and_bandwidth():
    cost = R.OpCost("op", flops=2e9, bytes=1e9)  # 2 FLOP/byte
    p = R.place(cost, 0.5, peak_flops=1e12, bandwidth=1e10)  # roof at 2e10 FLOP/s
    assert p.achieved_flops == 4e9 and p.bound == "memory"
    assert p.fraction == pytest.approx(0.2)
    assert p.achieved_bandwidth == pytest.approx(2e9)
    big = R.place(R.matmul_cost(2048, 2048, 2048), 1.0, 1e11, 1e10)
    assert big.bound == "compute" and big.ceiling_flops == 1e11
    with pytest.raises(TypeError):
        R.place((1, 2), 1.0, 1e11, 1e10)
    with pytest.raises(ValueError):
        R.place(cost, 0.0, 1e11, 1e10)
    with pytest.raises(ValueError):
        R.OpCost("x", 1.0, 0.0)


def test_table_and_plot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [R.place(R.matmul_cost(256, 256, 256), 1e-3, 2e11, 2e10), R.place(R.softmax_cost(64, 64), 1e-4, 2e11, 2e10)]
    t = R.table(pts)
    assert "compute" in t and "memory" in t and t.count("\n") == 3
    ax = R.plot({"fp32": 1e11, "bf16": 4e11}, 2e10, pts)
    labels = [ln.get_label() for ln in ax.get_lines()]
    assert any(lbl.startswith("fp32") for lbl in labels) and any(lbl.startswith("bf16") for lbl in labels)
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    plt.close(ax.figure)
    with pytest.raises(ValueError):
        R.plot({}, 1e10)
    with pytest.raises(ValueError):
        R.plot({"fp32": -1.0}, 1e10)


def test_nb07_exercises_grade_right_and_wrong_answers():
    from labkit.check import evaluate
    from labkit.exercises import nb07

    def ok(i, a):
        return evaluate(i, a).status == "correct"

    assert ok("07.axpy-intensity", 2 / 12) and not ok("07.axpy-intensity", 6.0)
    assert ok("07.matmul-intensity", lambda m, n, k, b: 2 * m * n * k / ((m * k + k * n + m * n) * b))
    assert not ok("07.matmul-intensity", lambda m, n, k, b: 2 * m * n * k / ((m * k + k * n) * b))
    assert not ok("07.matmul-intensity", lambda m, n, k, b: m * n * k / ((m * k + k * n + m * n) * b))
    top_self = max(nb07.PROFILE_TABLE, key=lambda r: r[1])[0]
    top_total = max(nb07.PROFILE_TABLE, key=lambda r: r[2])[0]
    assert top_self != top_total  # the exercise's trap: total time double counts children
    assert ok("07.optimise-first", top_self) and not ok("07.optimise-first", top_total)
    from labkit.profiling import ops_to_cover

    total = sum(r[1] for r in nb07.PROFILE_TABLE)
    assert ok("07.ops-for-80", ops_to_cover([r[1] / total for r in nb07.PROFILE_TABLE], 0.8))
    assert not ok("07.ops-for-80", 12)
    assert ok("07.bound", ("compute", "memory", "memory"))
    assert not ok("07.bound", ("compute", "memory", "compute"))
    assert evaluate("07.bound", ...).status == "not attempted"


def test_nb07_exercises_reference_and_wrong_answers():
    from labkit.check import NOT_GIVEN, evaluate
    from labkit.exercises import nb07

    for ex in nb07.EXERCISES:
        assert ex.reference is not NOT_GIVEN and ex.wrong is not NOT_GIVEN, ex.id
        assert evaluate(ex.id, ex.reference).status == "correct", ex.id
        assert evaluate(ex.id, ex.wrong).status == "wrong", ex.id
    assert evaluate("07.matmul-intensity", lambda m, n, k, b: None).status == "not attempted"


def test_nb07_peak_formula_is_the_datasheet_figure_and_names_each_typical_mistake():
    """07.peak-formula: devices x SMs x clock x FLOPs per SM per clock; each typical mistake gets its own message."""
    from labkit.check import evaluate
    from labkit.exercises import nb07

    d = nb07.DGX_A100
    per_gpu = d["sms_per_gpu"] * d["boost_clock_mhz"] * 1e6 * d["dense_fp16_fma_per_sm_per_clock"] * 2
    assert round(per_gpu / 1e12) == 312  # the A100 datasheet's dense FP16 tensor-core figure, TFLOP/s
    peak = d["gpus"] * per_gpu

    def verdict(answer):
        v = evaluate("07.peak-formula", answer)
        return v.status, v.message

    assert verdict(peak)[0] == "correct" and verdict(d["gpus"] * 312e12)[0] == "correct"  # the rounded datasheet value
    for answer, words in ((peak / 2, "FMA"), (peak * 2, "sparse"), (per_gpu, "one GPU"), (per_gpu / 2, "one GPU"),
                          (peak / 1e6, "units"), (peak / 1e12, "TFLOP/s"), (peak / 1e15, "units"),
                          (peak / 2e12, "units")):
        status, message = verdict(answer)
        assert status == "wrong" and words in message, (answer, message)
        assert "2.5" not in message and "312" not in message  # the mistake is named, the answer is not
    assert verdict(peak * 7.3)[0] == "wrong"
    assert verdict(-peak)[0] == "wrong" and verdict(float("nan"))[0] == "wrong"
    assert "Not counted" in verdict("2.5 PFLOP/s")[1] and "Not counted" in verdict(True)[1]
    assert evaluate("07.peak-formula", ...).status == "not attempted"
