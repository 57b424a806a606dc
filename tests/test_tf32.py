"""labkit.tf32 against the real thing: labkit.formats' TF32 rounding, torch's bf16 and fp16 casts."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit import device as dev_gate
from labkit import formats, tf32


def wide_fp32(n: int = 50_000, seed: int = 0) -> torch.Tensor:
    """Random fp32 values over nearly every binade, subnormals included, plus edge cases and ties."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.exp2(torch.randint(-150, 127, (n,), generator=g).float())
    ties = torch.tensor([1 + 2**-11, 1 + 3 * 2**-11, -(1 + 2**-11), 2 - 2**-12, 2 - 2**-24, 1 + 2**-8, 1 + 3 * 2**-8],
                        dtype=torch.float32)
    edges = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, 3.4028235e38, -3.4028235e38, 2**-149, 2**-126],
                         dtype=torch.float32)
    return torch.cat([x, ties, edges])


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equal (so the sign of zero counts), any NaN equal to any NaN."""
    nan = torch.isnan(a) & torch.isnan(b)
    return bool(((a.view(torch.int32) == b.view(torch.int32)) | nan).all())


def test_tf32_rounding_matches_labkit_formats():
    x = wide_fp32()
    want = torch.from_numpy(formats.round_array(x.numpy(), "tf32", overflow="inf")).float()
    assert same(tf32.round_mantissa(x, 10), want)
    assert same(tf32.emulate(x, "tf32"), want)


def test_bf16_rounding_matches_torch_cast():
    x = wide_fp32(seed=1)
    assert same(tf32.round_mantissa(x, 7), x.bfloat16().float())
    assert same(tf32.emulate(x, "bf16"), x.bfloat16().float())


@settings(max_examples=200, deadline=None)
@given(st.floats(width=32, allow_nan=False), st.integers(min_value=0, max_value=22))
def test_round_mantissa_is_nearest_on_the_grid(v, bits):
    x = torch.tensor([v], dtype=torch.float32)
    r = float(tf32.round_mantissa(x, bits)[0])
    if math.isinf(v):
        assert r == v
        return
    # r has at most `bits` mantissa bits, and no value on that grid is closer to v.
    if r != 0 and math.isfinite(r):
        m, e = math.frexp(abs(r))
        assert (m * 2 ** (bits + 1)) == int(m * 2 ** (bits + 1)) or abs(r) < 2**-126
    if math.isfinite(r):
        e = max(math.frexp(abs(v))[1] - 1, -126)
        assert abs(r - v) <= 2.0 ** (e - bits) / 2


def test_fp16_emulation_is_the_real_cast_with_its_range():
    x = torch.tensor([1e5, 1e-9, 1.0 + 2**-11, 3.0])
    out = tf32.emulate(x, "fp16")
    assert math.isinf(out[0]) and out[1] == 0.0 and out[2] == 1.0 and out[3] == 3.0
    t = tf32.emulate(x, "tf32")  # TF32 keeps fp32's range
    assert float(t[0]) == 99968.0  # 1e5 = 1562.5 * 64 (ulp 64 at 2^16): the tie goes to even, 1562 * 64
    assert 0 < float(t[1]) == pytest.approx(1e-9, rel=2**-10)


def test_input_rounding_error_sizes():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 96, generator=g), torch.randn(96, 32, generator=g)
    e = {f: tf32.input_rounding_error(a, b, f) for f in ("fp32", "tf32", "fp16", "bf16")}
    assert e["fp32"] == 0.0
    # each input carries a relative error of about 2^-(p+1) / sqrt(3); two inputs, random signs
    assert 2.0**-13 < e["tf32"] < 2.0**-10
    assert 2.0**-10 < e["bf16"] < 2.0**-7
    assert e["tf32"] == pytest.approx(e["fp16"], rel=1e-6)  # same 10-bit mantissa, values well inside fp16
    big = a * 2.0**17  # exact scaling: values up to ~5e5, beyond fp16's 65504
    assert math.isinf(tf32.input_rounding_error(big, b, "fp16"))   # fp16 overflows, TF32 does not
    assert tf32.input_rounding_error(big, b, "tf32") == pytest.approx(e["tf32"], rel=1e-9)


def test_tf32_matmul_equals_rounded_inputs_in_fp32():
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(16, 16, generator=g), torch.randn(16, 16, generator=g)
    want = tf32.emulate(a, "tf32") @ tf32.emulate(b, "tf32")
    assert torch.equal(tf32.tf32_matmul(a, b), want)
    assert not torch.equal(want, a @ b)


def test_real_matmul_errors_are_ordered():
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(128, 128, generator=g), torch.randn(128, 128, generator=g)
    before = dev_gate.set_float32_matmul_precision("highest")
    try:
        e32 = tf32.matmul_error(a, b, torch.float32)
    finally:
        dev_gate.set_float32_matmul_precision(before["float32_matmul_precision"]
                                            if before["float32_matmul_precision"] != "mixed" else "highest")
    assert e32 < 1e-6
    if dev_gate.computes(torch.bfloat16, "cpu"):
        assert tf32.matmul_error(a, b, torch.bfloat16) > 1e-3


def test_time_tf32_is_none_without_cuda():
    if dev_gate.is_cuda():
        pytest.skip("this test checks the CPU answer")
    assert tf32.time_tf32(64, "cpu") is None


def test_bad_input():
    with pytest.raises(TypeError):
        tf32.round_mantissa(torch.ones(3, dtype=torch.float64), 10)
    with pytest.raises(TypeError):
        tf32.emulate(np.ones(3), "tf32")
    with pytest.raises(ValueError):
        tf32.round_mantissa(torch.ones(3), 24)
    with pytest.raises(ValueError):
        tf32.emulate(torch.ones(3), "fp8")
    with pytest.raises(ValueError):
        tf32.input_rounding_error(torch.ones(2, 3), torch.ones(2, 3), "tf32")
    with pytest.raises(ValueError):
        tf32.matmul_error(torch.ones(2, 2), torch.ones(2, 2), torch.float64)


def test_matmul_precision_settings_roundtrip():
    before = dev_gate.set_float32_matmul_precision("medium")
    try:
        s = dev_gate.fp32_matmul_settings()
        assert s["float32_matmul_precision"] == "medium" and s["allow_tf32"] is True
    finally:
        dev_gate.set_float32_matmul_precision("highest")
    s = dev_gate.fp32_matmul_settings()
    assert s["float32_matmul_precision"] == "highest" and s["allow_tf32"] is False
    assert before["float32_matmul_precision"] in ("highest", "high", "medium", "mixed")
    with pytest.raises(ValueError):
        dev_gate.set_float32_matmul_precision("low")
    with pytest.raises(TypeError):
        dev_gate.set_float32_matmul_precision(3)


def test_mixed_legacy_and_new_precision_settings_do_not_crash_the_gate():
    """set_float32_matmul_precision("high") then allow_tf32=False leaves torch refusing to report one precision."""
    try:
        dev_gate.set_float32_matmul_precision("high")
        dev_gate.set_tf32(False)
        assert dev_gate.fp32_matmul_settings()["float32_matmul_precision"] == "mixed"
        assert dev_gate.capabilities("cpu").float32_matmul_precision == "mixed"
        assert dev_gate.set_tf32(True)["float32_matmul_precision"] == "mixed"
    finally:
        dev_gate.set_tf32(True)
        dev_gate.set_float32_matmul_precision("highest")  # back to PyTorch's defaults
    s = dev_gate.fp32_matmul_settings()
    assert (s["float32_matmul_precision"], s["allow_tf32"], s["cudnn_allow_tf32"]) == ("highest", False, True)
