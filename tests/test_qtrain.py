"""labkit.qtrain: emulated FP8/MX/NVFP4 matmuls and linear layers (notebook 17), checked against torch and
labkit.microscaling (itself checked against torchao and ml_dtypes)."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from torch import nn

from labkit import formats, microscaling, qtrain


def _x(shape=(8, 64), seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64) * scale


# --- stochastic rounding ------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2", "e2m1fn", "bf16"])
def test_stochastic_round_lands_on_a_neighbour_and_is_unbiased(fmt):
    v = _x((4096,), seed=1, scale=2.0)
    f = formats.get_format(fmt)
    v = v.clamp(-f.max, f.max)
    g = torch.Generator().manual_seed(0)
    draws = torch.stack([qtrain.stochastic_round(v, fmt, g) for _ in range(400)])
    # every draw is a value of the format, and one of the two that bracket v
    assert np.array_equal(formats.round_array(draws.numpy(), fmt), draws.numpy())
    grid_lo = torch.where(draws <= v, draws, -np.inf).amax(0)
    grid_hi = torch.where(draws >= v, draws, np.inf).amin(0)
    assert torch.all((draws == grid_lo) | (draws == grid_hi))
    nearest = torch.from_numpy(formats.round_array(v.numpy(), fmt))
    assert torch.all((grid_lo <= v) & (v <= grid_hi)) and torch.all((nearest == grid_lo) | (nearest == grid_hi))
    # unbiased: the mean error is far below round-to-nearest's, relative to the spacing
    spacing = (grid_hi - grid_lo).clamp(min=1e-30)
    assert float(((draws.mean(0) - v) / spacing).abs().mean()) < 0.05
    assert float(((nearest - v) / spacing).abs().mean()) > 0.15


def test_stochastic_round_keeps_representable_values_saturates_and_keeps_nan():
    exact = torch.tensor([0.0, 0.5, -1.5, 6.0, -6.0], dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        assert torch.equal(qtrain.stochastic_round(exact, "e2m1fn", g), exact)
    out = qtrain.stochastic_round(torch.tensor([100.0, -1e9, float("nan")]), "e2m1fn", g)
    assert out[0] == 6 and out[1] == -6 and torch.isnan(out[2]) and out.dtype == torch.float32
    with pytest.raises(TypeError):
        qtrain.stochastic_round([1.0], "e2m1fn")
    with pytest.raises(ValueError):
        qtrain.stochastic_round(exact, "e8m0fnu")


# --- Hadamard rotation --------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 16, 64])
def test_hadamard_rotation_is_orthogonal_and_a_signed_hadamard_matrix(n):
    r = qtrain.hadamard_rotation(n, torch.Generator().manual_seed(3))
    assert torch.allclose(r @ r.t(), torch.eye(n, dtype=torch.float64), atol=1e-12)
    # Walsh-Hadamard by its closed form, H[i, j] = (-1)^popcount(i & j), independent of Sylvester's doubling
    h = torch.tensor([[(-1.0) ** bin(i & j).count("1") for j in range(n)] for i in range(n)], dtype=torch.float64)
    signs = torch.sign(r[0] * np.sqrt(n) / h[0])  # column signs
    assert torch.allclose(r * np.sqrt(n), h * signs, atol=1e-12)
    for bad in (0, 3, 12, True, 16.0):
        with pytest.raises(ValueError):
            qtrain.hadamard_rotation(bad)


# --- quantise and qmm ---------------------------------------------------------------------------------------

def test_quantise_is_microscaling_and_torch():
    x = _x((16, 128), seed=2, scale=3.0)
    assert torch.equal(qtrain.quantise(x, "bf16"), x.to(torch.bfloat16).double())
    assert torch.equal(qtrain.quantise(x, "fp8-tensor"), microscaling.per_tensor(x, "e4m3fn").dequantise())
    assert torch.equal(qtrain.quantise(x, "fp8-row", grad=True), microscaling.rowwise(x, "e5m2").dequantise())
    assert torch.equal(qtrain.quantise(x, "mxfp8"), microscaling.mx(x, scale_rounding="rceil").dequantise())
    assert torch.equal(qtrain.quantise(x, "mxfp8-floor"), microscaling.mx(x).dequantise())
    assert torch.equal(qtrain.quantise(x, "nvfp4"), microscaling.nvfp4(x).dequantise())
    # torch's own FP8 cast agrees on the rowwise path: scale, cast, unscale
    s = (x.abs().amax(1, keepdim=True) / 448).float().double()
    torch_rt = (x / s).to(torch.float8_e4m3fn).double() * s
    assert torch.equal(qtrain.quantise(x, "fp8-row"), torch_rt)
    assert qtrain.quantise(x.float(), "mxfp8").dtype == torch.float32
    with pytest.raises(ValueError, match="recipe"):
        qtrain.quantise(x, "fp4")
    with pytest.raises(TypeError):
        qtrain.quantise(x.long(), "bf16")


def test_stochastic_quantise_keeps_the_scales_and_averages_to_x():
    x = _x((4, 64), seed=4)
    g = torch.Generator().manual_seed(0)
    draws = torch.stack([qtrain.quantise(x, "nvfp4", stochastic=True, generator=g) for _ in range(300)])
    rne = qtrain.quantise(x, "nvfp4")
    assert float((draws.mean(0) - x).norm()) < 0.3 * float((rne - x).norm())
    q = microscaling.nvfp4(x)  # every draw is an E2M1 element times the same block and tensor scales
    per_elem = q.scales.double().repeat_interleave(16, 1) * q.tensor_scale
    elems = (draws / per_elem).numpy()
    assert np.allclose(formats.round_array(elems, "e2m1fn"), elems, rtol=0, atol=1e-12)


def test_qmm_is_the_product_of_the_quantised_operands_and_rotation_keeps_it():
    a, b = _x((8, 64), seed=5), _x((6, 64), seed=6)
    for r in qtrain.RECIPES:
        assert torch.equal(qtrain.qmm(a, b, r), qtrain.quantise(a, r) @ qtrain.quantise(b, r).t())
    rot = qtrain.hadamard_rotation(16, torch.Generator().manual_seed(0))
    exact = a @ b.t()
    rotated = qtrain.qmm(a, b, "bf16", rotation=rot)
    assert float((rotated - exact).norm() / exact.norm()) < 2e-2  # only bf16's rounding remains
    with pytest.raises(ValueError, match="share K"):
        qtrain.qmm(a, _x((6, 32)), "bf16")
    with pytest.raises(ValueError, match="multiple"):
        qtrain.qmm(_x((2, 24)), _x((2, 24)), "bf16", rotation=rot)
    with pytest.raises(TypeError):
        qtrain.qmm(a[0], b, "bf16")


# --- QLinear ------------------------------------------------------------------------------------------------

def test_qlinear_runs_the_three_quantised_matmuls():
    torch.manual_seed(0)
    lin = nn.Linear(64, 32).double()
    q = qtrain.QLinear(lin, qtrain.QuantConfig("fp8-row"))
    assert q.weight is lin.weight and q.bias is lin.bias
    x = _x((2, 16, 64), seed=7).requires_grad_()
    y = q(x)
    x2 = x.detach().reshape(-1, 64)
    Q = qtrain.quantise
    want = Q(x2, "fp8-row") @ Q(lin.weight.detach(), "fp8-row").t() + lin.bias.detach()
    assert torch.equal(y.detach().reshape(-1, 32), want)
    dy = _x((2, 16, 32), seed=8)
    y.backward(dy)
    dy2 = dy.reshape(-1, 32)
    w = lin.weight.detach()
    assert torch.equal(x.grad.reshape(-1, 64), Q(dy2, "fp8-row", grad=True) @ Q(w.t(), "fp8-row").t())
    assert torch.equal(lin.weight.grad, Q(dy2.t(), "fp8-row", grad=True) @ Q(x2.t(), "fp8-row").t())
    assert torch.equal(lin.bias.grad, dy2.sum(0))


def test_qlinear_bf16_gradients_track_autograd_and_the_tricks_are_seeded():
    torch.manual_seed(0)
    lin = nn.Linear(64, 32, bias=False).double()
    x = _x((32, 64), seed=9)
    ref = x.clone().requires_grad_()
    (lin(ref) ** 2).sum().backward()
    want = lin.weight.grad.clone()
    lin.weight.grad = None
    q = qtrain.QLinear(lin, qtrain.QuantConfig("bf16"))
    (q(x) ** 2).sum().backward()
    assert float((lin.weight.grad - want).norm() / want.norm()) < 2e-2
    grads = []
    for _ in range(2):
        lin.weight.grad = None
        q = qtrain.QLinear(lin, qtrain.QuantConfig("nvfp4", stochastic=True, hadamard=True, seed=4))
        (q(x) ** 2).sum().backward()
        grads.append(lin.weight.grad.clone())
    assert torch.equal(grads[0], grads[1])  # the same seed, the same draws


def test_quantise_linears_swaps_all_but_skipped_and_checks_input():
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Sequential(nn.Linear(32, 32)), nn.Linear(32, 4))
    names = qtrain.quantise_linears(model, qtrain.QuantConfig("mxfp8"), skip=("3",))
    assert names == ["0", "2.0"]
    assert isinstance(model[0], qtrain.QLinear) and isinstance(model[2][0], qtrain.QLinear)
    assert isinstance(model[3], nn.Linear)
    assert model[0].cfg.seed != model[2][0].cfg.seed  # each layer draws its own random numbers
    with pytest.raises(TypeError):
        qtrain.quantise_linears(model, "mxfp8")
    with pytest.raises(TypeError):
        qtrain.quantise_linears(model, qtrain.QuantConfig(), skip="3")
    with pytest.raises(ValueError):
        qtrain.QuantConfig("int8")
    with pytest.raises(TypeError):
        qtrain.QuantConfig("nvfp4", stochastic=1)


# --- the hardware lines -------------------------------------------------------------------------------------

def test_native_formats_reads_the_compute_capability():
    def caps(cc):
        return types.SimpleNamespace(tier="cuda" if cc else "cpu", cuda_capability=cc, device_name="X")
    assert "no CUDA GPU" in qtrain.native_formats(caps(None))
    assert "no FP8" in qtrain.native_formats(caps((8, 0)))
    assert "FP8" in qtrain.native_formats(caps((9, 0))) and "only emulated" in qtrain.native_formats(caps((9, 0)))
    assert "NVFP4" in qtrain.native_formats(caps((10, 0))) and "emulated" not in qtrain.native_formats(caps((12, 0)))
    with pytest.raises(TypeError):
        qtrain.native_formats("cuda")


def test_float8_speedup_says_why_it_did_not_run_without_a_gpu():
    def caps(device_type, cc):  # a GPU machine runs it for real: make gpu-check
        return types.SimpleNamespace(device_type=device_type, cuda_capability=cc, device_name="X")
    assert "CUDA GPU" in qtrain.float8_speedup(caps=caps("cpu", None))
    assert "no FP8 tensor cores" in qtrain.float8_speedup(caps=caps("cuda", (8, 0)))
