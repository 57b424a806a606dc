"""labkit.fp8 against the real thing: torch float8 casts, ml_dtypes, labkit.formats and torch._scaled_mm."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch

from labkit import data, formats, fp8, models
from labkit import device as dev_gate

MLD = {"e4m3fn": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}


def wide(n: int = 20_000, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.exp2(torch.randint(-24, 20, (n,), generator=g).float())
    edges = torch.tensor([0.0, 448.0, 463.9, 464.0, 464.1, 480.0, 57344.0, 61439.0, 61440.0, 1e6, 2.0**-9,
                          2.0**-10, 3 * 2.0**-11, 2.0**-16, 2.0**-17, 3 * 2.0**-18])
    return torch.cat([x, edges, -edges])


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.double(), b.double()
    return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())


@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
def test_fp8_max_and_threshold_from_formats(fmt):
    assert fp8.fp8_max(fmt) == {"e4m3fn": 448.0, "e5m2": 57344.0}[fmt]
    t, inclusive = fp8.overflow_threshold(fmt)
    # the threshold agrees with labkit.formats' own rounding, just below, at and just above it
    f = formats.get_format(fmt)
    rule = "inf" if f.has_inf else "nan"
    assert formats.round_to(np.nextafter(t, 0), f, overflow=rule) == f.max
    assert not math.isfinite(formats.round_to(np.nextafter(t, math.inf), f, overflow=rule))
    assert (not math.isfinite(formats.round_to(t, f, overflow=rule))) == inclusive


@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
@pytest.mark.parametrize("scale", [1.0, 2.0**-7, 37.5])
def test_quantize_matches_ml_dtypes_and_formats(fmt, scale):
    x = wide()
    v = (x * scale).numpy()  # fp32 product, as quantize forms it
    nan_rule = "nan" if fmt == "e4m3fn" else "inf"   # ml_dtypes' own rule for each format
    want_ml = torch.from_numpy(v.astype(MLD[fmt]).astype(np.float32))
    assert same(fp8.quantize(x, fmt, scale, overflow=nan_rule).float(), want_ml)
    want_sat = torch.from_numpy(formats.round_array(v, fmt, overflow="saturate"))
    assert same(fp8.quantize(x, fmt, scale, overflow="saturate").float(), want_sat)
    assert same(fp8.roundtrip(x, fmt, scale), (want_sat / scale).float())


def test_torch_plain_cast_rules_are_what_the_overflow_names_say():
    x = torch.tensor([500.0, -1e6, math.inf, 1.0])
    assert same(x.to(torch.float8_e4m3fn).float(), fp8.quantize(x, "e4m3fn", overflow="saturate").float())
    y = torch.tensor([70000.0, -1e6, math.inf, 1.0])
    assert same(y.to(torch.float8_e5m2).float(), fp8.quantize(y, "e5m2", overflow="inf").float())
    assert torch.isnan(fp8.quantize(x, "e4m3fn", overflow="nan").float()[:3]).all()


def test_compute_scale():
    assert fp8.compute_scale(2.0, "e4m3fn") == 224.0
    assert fp8.compute_scale(2.0, "e4m3fn", margin=1) == 112.0
    assert fp8.compute_scale(1e-3, "e5m2") == pytest.approx(57344e3)
    assert fp8.compute_scale(0.0, "e4m3fn", previous=8.0) == 8.0
    assert fp8.compute_scale(math.inf, "e5m2", previous=3.0) == 3.0
    assert fp8.compute_scale(math.nan, "e5m2", previous=3.0) == 3.0
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0)) * 1e-3
    s = fp8.compute_scale(fp8.amax(x), "e4m3fn")
    q = fp8.quantize(x, "e4m3fn", s).float()
    assert q.abs().max() == 448.0  # the largest value lands exactly on the format's maximum


def test_scaling_rescues_small_gradients_in_e5m2():
    g = torch.randn(4096, generator=torch.Generator().manual_seed(1)) * 1e-6
    raw = fp8.quant_stats(g, "e5m2", 1.0)
    scaled = fp8.quant_stats(g, "e5m2", fp8.compute_scale(fp8.amax(g), "e5m2"))
    assert raw.underflow > 0.5 and raw.rel_error > 0.5
    assert scaled.underflow < 0.01 and scaled.rel_error < 0.15 and scaled.saturated == 0.0


def test_quant_stats_counts_saturation():
    x = torch.tensor([1.0, 2.0, 1000.0, 0.0])
    st = fp8.quant_stats(x, "e4m3fn", 1.0)
    assert st.saturated == 0.25 and st.underflow == 0.0
    assert fp8.quant_stats(torch.tensor([1e-4, 1.0]), "e4m3fn").underflow == 0.5


def test_delayed_scaling_uses_the_history():
    ds = fp8.DelayedScaling("e4m3fn", history_len=3, margin=0)
    assert ds.scale == 1.0
    out = ds.quantize(torch.tensor([2.0, -1.0]))
    assert out.scale == 1.0 and ds.scale == 224.0           # scale used, then updated from amax 2
    ds.quantize(torch.tensor([4.0]))
    assert ds.scale == 112.0                                 # max(2, 4)
    ds.quantize(torch.tensor([1.0]))
    assert ds.scale == 112.0                                 # still max(2, 4, 1)
    ds.quantize(torch.tensor([1.0]))
    assert ds.scale == 112.0                                 # history (4, 1, 1)
    ds.quantize(torch.tensor([1.0]))
    assert ds.scale == 448.0 and list(ds.history) == [1.0, 1.0, 1.0]   # the 4 fell out of the window
    # a sudden jump saturates with delayed scaling, not with current scaling
    st = ds.quantize(torch.tensor([10.0, 1.0]))
    assert st.dequantize()[0] == 1.0 and fp8.current_scaling(torch.tensor([10.0, 1.0])).dequantize()[0] == 10.0
    recent = fp8.DelayedScaling("e5m2", history_len=4, algo="most_recent")
    recent.update(8.0), recent.update(2.0)
    assert recent.scale == 57344.0 / 2.0
    ds.update(0.0)
    assert math.isfinite(ds.scale)


def test_scaled_tensor_roundtrip():
    x = torch.randn(64, generator=torch.Generator().manual_seed(2))
    st = fp8.current_scaling(x, "e4m3fn", margin=1)
    assert st.data.dtype == torch.float8_e4m3fn and st.fmt == "e4m3fn"
    assert torch.allclose(st.dequantize(), x, rtol=2**-3, atol=1e-6)


def test_scaled_mm_matches_the_dequantised_reference():
    from labkit import device as dev_gate

    if not dev_gate.computes(torch.float8_e4m3fn, "cpu"):  # some CPU classes have no oneDNN E4M3 matmul
        with pytest.raises(RuntimeError):
            fp8.scaled_mm(torch.ones(16, 16), torch.ones(16, 16))
        return
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(32, 64, generator=g) * 5, torch.randn(64, 48, generator=g) * 0.01
    for fa, fb in (("e4m3fn", "e4m3fn"), ("e5m2", "e4m3fn"), ("e4m3fn", "e5m2")):
        out = fp8.scaled_mm(a, b, fa, fb)
        ref = fp8.scaled_mm_reference(a, b, fa, fb)
        assert out.dtype == torch.float32 and out.shape == (32, 48)
        assert torch.allclose(out.double(), ref, rtol=1e-5, atol=1e-6 * float(ref.abs().max()))
    exact = a.double() @ b.double()
    err = float((fp8.scaled_mm(a, b).double() - exact).norm() / exact.norm())
    assert 1e-3 < err < 0.1   # FP8 rounding is visible, but the scaled result is close
    bf = fp8.scaled_mm(a, b, out_dtype=torch.bfloat16)
    assert bf.dtype == torch.bfloat16
    # given scales are used as given
    out = fp8.scaled_mm(a, b, scale_a=1.0, scale_b=1.0)
    assert torch.allclose(out.double(), fp8.scaled_mm_reference(a, b, scale_a=1.0, scale_b=1.0), rtol=1e-5,
                          atol=1e-9)


def test_tensor_tap_captures_linear_inputs_and_output_grads():
    task = data.make_token_task("reverse", n=16, n_digits=4, vocab_size=8, seed=0)
    model = models.TinyGPT(vocab_size=task.vocab_size, seq_len=task.seq_len, d_model=32, n_layers=1, seed=0)
    with fp8.TensorTap(model, layers=["blocks.0.mlp.0", "head"]) as tap:
        out = {}
        model.blocks[0].mlp[0].register_forward_hook(lambda m, i, o: out.setdefault("h", o))
        loss = models.lm_loss(model(task.inputs), task.targets)
        out["h"].retain_grad()
        loss.backward()
    assert set(tap.activations) == {"blocks.0.mlp.0", "head"}
    act, grad = tap.activations["blocks.0.mlp.0"][0], tap.gradients["blocks.0.mlp.0"][0]
    assert act.shape == (16, task.seq_len, 32) and grad.shape == (16, task.seq_len, 128)
    assert torch.equal(grad, out["h"].grad)
    # the hooks are gone after the with-block
    model(task.inputs)
    assert len(tap.activations["head"]) == 1
    with pytest.raises(ValueError):
        fp8.TensorTap(model, layers=["nope"])


def test_time_fp8_matmul_is_gated():
    if dev_gate.capabilities().fp8_matmul:
        pytest.skip("this test checks the answer without fp8 hardware")
    assert fp8.time_fp8_matmul(64, "cpu") is None
    with pytest.raises(ValueError):
        fp8.time_fp8_matmul(100, "cpu")


def test_bad_input():
    with pytest.raises(ValueError):
        fp8.quantize(torch.ones(2), "e3m4")
    with pytest.raises(TypeError):
        fp8.quantize([1.0], "e4m3fn")
    with pytest.raises(ValueError):
        fp8.quantize(torch.ones(2), "e4m3fn", overflow="inf")
    with pytest.raises(ValueError):
        fp8.quantize(torch.ones(2), "e4m3fn", scale=0.0)
    with pytest.raises(TypeError):
        fp8.quantize(torch.ones(2, dtype=torch.long), "e4m3fn")
    with pytest.raises(ValueError):
        fp8.compute_scale(-1.0)
    with pytest.raises(ValueError):
        fp8.compute_scale(1.0, margin=-1)
    with pytest.raises(ValueError):
        fp8.DelayedScaling(history_len=0)
    with pytest.raises(ValueError):
        fp8.DelayedScaling(algo="mean")
    with pytest.raises(ValueError):
        fp8.scaled_mm(torch.ones(2, 3), torch.ones(2, 3))
    with pytest.raises(ValueError):
        fp8.amax(torch.ones(0))


def test_nb05_exercises_tell_reference_from_wrong():
    from labkit.check import evaluate
    from labkit.exercises import nb05

    for ex in nb05.EXERCISES:
        assert evaluate(ex.id, ex.reference).status == "correct", ex.id
        assert evaluate(ex.id, ex.wrong).status == "wrong", ex.id
        assert evaluate(ex.id, ...).status == "not attempted", ex.id
    assert evaluate("05.choose-format", {k: "bf16" for k in nb05.WORKLOADS}).status == "wrong"
    assert evaluate("05.choose-format", {**nb05.EXERCISES[0].reference, "fp8-forward": "e4m3"}).status == "correct"
    assert "Upside down" in evaluate("05.fp8-scale", fp8.amax(nb05.exercise_tensor()) / 448.0).message
    assert evaluate("05.delayed-scale", lambda h, n, m, k: ...).status == "not attempted"


@pytest.mark.parametrize("name, fn, ok", [
    ("identity", lambda x: x, False),  # meets the error bound by not quantising at all
    ("fp16", lambda x: x.half().float(), False),
    ("bf16", lambda x: x.to(torch.bfloat16).float(), False),
    ("power-of-two scale", lambda x: (x * (s := 2 ** torch.floor(torch.log2(448 / x.abs().max())))).to(
        torch.float8_e4m3fn).float() / s, True),  # another honest per-tensor scale
])
def test_fp8_roundtrip_grader_wants_values_on_e4m3s_grid(name, fn, ok, monkeypatch):
    from labkit.check import evaluate

    monkeypatch.setenv("LABKIT_PROGRESS", "off")
    verdict = evaluate("05.fp8-roundtrip", fn)
    assert verdict.status == ("correct" if ok else "wrong"), (name, verdict.message)
    if not ok:
        assert "distinct values" in verdict.message or "off" in verdict.message
