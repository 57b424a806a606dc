"""labkit.microscaling against the real thing: torch and ml_dtypes casts, and torchao's MX and NVFP4 reference code.

The torchao comparisons need ``pip install labkit[lowprecision]`` (torchao, pure Python on a CPU: its CUDA
extensions fail to load there and are not used); without it they skip, and under CI=true they fail.
"""

from __future__ import annotations

import importlib
import math
import warnings

import ml_dtypes
import numpy as np
import pytest
import torch
from needs import unavailable

from labkit import formats as F
from labkit import microscaling as M

MLD = {"e4m3fn": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2, "e2m3fn": ml_dtypes.float6_e2m3fn,
       "e3m2fn": ml_dtypes.float6_e3m2fn, "e2m1fn": ml_dtypes.float4_e2m1fn}


def sample(rows: int = 32, cols: int = 256, seed: int = 0) -> torch.Tensor:
    """Gaussian rows of very different magnitudes, with exact powers of two and ties sprinkled in."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * torch.exp2(torch.randint(-30, 30, (rows, 1), generator=g).float())
    x[0, :8] = torch.tensor([448.0, 1.0, 0.5, 3.0, -6.0, 2.0**-9, 1.5, -0.0])
    x[1, :32] = torch.linspace(-7.5, 7.5, 32)  # many ties of the element formats
    return x


def adversarial(cols: int = 64) -> torch.Tensor:
    """Finite blocks that stress the scale: zeros, one outlier, a tiny neighbour, amax at and near powers of two."""
    rows = [torch.zeros(cols), torch.full((cols,), 1e-3), torch.full((cols,), 1e-3),
            torch.full((cols,), 448.0), torch.full((cols,), 448.0 * 2**10), torch.full((cols,), 2.0**20),
            torch.full((cols,), 6.0 * 2**-3), torch.linspace(-1, 1, cols) * 3e38]
    rows[2][5] = 1e30  # one huge outlier
    rows[4][3] = float(np.nextafter(np.float32(448.0 * 2**10), np.float32(np.inf)))  # amax just above max × 2^k
    rows[5][0] = -(2.0**20) * 1.75
    return torch.stack(rows)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal value for value, NaN where the other is NaN, the sign of zero ignored."""
    a, b = a.double(), b.double()
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


# --- the scales and the elements, against torch and ml_dtypes casts ---------------------------------------

@pytest.mark.parametrize("fmt", M.ELEMENT_FORMATS)
@pytest.mark.parametrize("rounding", M.SCALE_ROUNDINGS)
def test_mx_elements_are_ml_dtypes_casts_of_x_over_the_scale(fmt, rounding):
    x = sample()
    q = M.mx(x, fmt, scale_rounding=rounding)
    scale = q.scales.double().repeat_interleave(32, dim=1)
    f = F.get_format(fmt)
    v = (x.double() / scale).numpy().clip(-f.max, f.max)  # the spec's clamp, then ml_dtypes' RNE cast
    assert np.array_equal(q.elements.double().numpy(), v.astype(MLD[fmt]).astype(np.float64))
    assert set(np.unique(q.scale_codes())) <= set(range(255))  # finite data: no NaN scale
    assert bool((torch.exp2(torch.log2(q.scales)) == q.scales).all())  # every scale a power of two


def test_mx_shared_exponent_by_hand():
    amax = torch.tensor([448.0, 449.0, 500.0, 512.0, 1.0, 0.0, 2.0**-140, 3e38])
    floor = M.mx_scale_exponent(amax, "e4m3fn", "floor").tolist()
    up = M.mx_scale_exponent(amax, "e4m3fn", "rceil").tolist()
    assert floor == [0, 0, 0, 1, -8, -127, -127, 119]  # floor(log2 amax) - 8
    assert up == [0, 1, 1, 1, -8, -127, -127, 120]  # ceil(log2(amax / 448))
    assert M.mx_scale_exponent(torch.tensor([6.0, 6.5, 8.0]), "e2m1fn", "floor").tolist() == [0, 0, 1]
    assert M.mx_scale_exponent(torch.tensor([6.0, 6.5, 8.0]), "e2m1fn", "rceil").tolist() == [0, 1, 1]


def test_floor_saturates_and_rceil_does_not():
    x = torch.full((1, 32), 1.0)
    x[0, 0] = 480.0  # floor: 2^(8 - 8) = 1, and 480 saturates to 448; rceil: 2^1, and 480 / 2 = 240 fits
    fl, up = M.mx(x, scale_rounding="floor"), M.mx(x, scale_rounding="rceil")
    assert fl.scales.item() == 1.0 and fl.elements[0, 0].item() == 448.0 == fl.dequantise()[0, 0].item()
    assert up.scales.item() == 2.0 and up.dequantise()[0, 0].item() == 480.0


@pytest.mark.parametrize("scheme", ["per_tensor", "rowwise", "blockwise"])
def test_fp32_scaled_elements_are_torch_casts(scheme):
    x = sample()
    q = {"per_tensor": M.per_tensor(x), "rowwise": M.rowwise(x), "blockwise": M.blockwise(x, (1, 128))}[scheme]
    assert q.scale_format == "fp32" and q.scales.dtype == torch.float32
    s = q.scales.double().repeat_interleave(q.block[0], 0).repeat_interleave(q.block[1], 1)
    want = (x.double() / s).clamp(-448, 448).float().to(torch.float8_e4m3fn).float()
    # x / s in float64 then float32: exact enough, the float32 rounding cannot move a value across an E4M3 tie
    assert same(q.elements, want)
    amax = q.elements.abs().reshape(-1).max().item()
    assert amax == 448.0  # the largest element of the tensor lands on the format's max


def test_blockwise_weights_128x128_and_the_scale_grid():
    x = torch.randn(256, 384, generator=torch.Generator().manual_seed(1))
    q = M.blockwise(x, M.WEIGHT_BLOCK)
    assert q.scales.shape == (2, 3) and q.block == (128, 128)
    amax = x.abs().reshape(2, 128, 3, 128).amax(dim=(1, 3))
    assert torch.equal(q.scales, (amax.double() / 448).float())
    assert M.rowwise(torch.randn(4, 3, 16)).scales.shape == (12, 1)  # leading dims flattened into rows


@pytest.mark.parametrize("make", [lambda x: M.per_tensor(x), lambda x: M.rowwise(x), lambda x: M.blockwise(x),
                                  lambda x: M.mx(x), lambda x: M.mx(x, "e2m1fn", scale_rounding="rceil"),
                                  lambda x: M.nvfp4(x)])
def test_dequantise_is_close_and_exact_arithmetic(make):
    x = torch.randn(8, 256, generator=torch.Generator().manual_seed(2))
    q = make(x)
    d = q.dequantise()
    assert d.dtype == torch.float64 and d.shape == x.shape
    e_bits = F.get_format(q.element_format).man_bits
    rel = ((d - x.double()).norm() / x.double().norm()).item()
    assert rel < 2.0 ** -e_bits  # well within one element ulp overall
    assert torch.equal(q.dequantise(), d)


@pytest.mark.parametrize("name,make", [("blockwise", lambda x: M.blockwise(x, (4, 32))), ("mx", lambda x: M.mx(x)),
                                       ("nvfp4", lambda x: M.nvfp4(x))])
def test_element_scales_are_each_elements_block_scale(name, make):
    x = torch.randn(3, 8, 64, generator=torch.Generator().manual_seed(5))  # leading dims flattened into rows
    q = make(x)
    s = q.element_scales()
    assert s.shape == x.shape and s.dtype == torch.float64
    bm, bn = q.block
    for r, c in [(0, 0), (5, 63), (23, 31), (17, 40)]:  # by hand: the scale of the block holding (r, c)
        want = float(q.scales[r // bm, c // bn]) * (q.tensor_scale or 1.0)
        assert s.reshape(-1, 64)[r, c].item() == want
    assert torch.equal(q.dequantise(), q.elements.double() * s)


@pytest.mark.parametrize("fmt", M.ELEMENT_FORMATS)
def test_round_tensor_is_the_ml_dtypes_cast_saturated(fmt):
    x = sample().double().clamp(-1e4, 1e4)
    top = float(ml_dtypes.finfo(MLD[fmt]).max)
    want = torch.from_numpy(x.clamp(-top, top).numpy().astype(MLD[fmt]).astype(np.float64))
    got = M.round_tensor(x, fmt)
    assert got.dtype == torch.float64 and same(got, want)
    with pytest.raises(TypeError, match="torch.Tensor"):
        M.round_tensor([1.0], fmt)


# --- stated behaviour: zeros, an outlier, a subnormal amax, NaN and inf -----------------------------------

ALL = [("per-tensor", lambda x: M.per_tensor(x)), ("rowwise", lambda x: M.rowwise(x)),
       ("blockwise", lambda x: M.blockwise(x, (1, 32))), ("mx", lambda x: M.mx(x)),
       ("mxfp4", lambda x: M.mx(x, "e2m1fn")), ("nvfp4", lambda x: M.nvfp4(x)),
       ("nvfp4-1", lambda x: M.nvfp4(x, tensor_scale=False))]


@pytest.mark.parametrize("name,make", ALL)
def test_all_zero_blocks_dequantise_to_zero(name, make):
    x = torch.zeros(2, 64)
    x[1] = torch.randn(64, generator=torch.Generator().manual_seed(3))
    q = make(x)
    assert bool((q.dequantise()[0] == 0).all()) and bool(q.scales.isfinite().all())
    want = {"fp32": 1.0, "e8m0fnu": 2.0**-127, "e4m3fn": 2.0**-6}[q.scale_format]
    if name != "per-tensor":
        assert q.scales.reshape(-1)[0].item() == want
    z = make(torch.zeros(2, 64))
    assert bool((z.dequantise() == 0).all()) and not bool(z.elements.isnan().any())
    assert z.tensor_scale in (None, 1.0)


@pytest.mark.parametrize("name,make", ALL)
def test_one_outlier_changes_only_its_own_block(name, make):
    x = torch.randn(4, 128, generator=torch.Generator().manual_seed(4))
    y = x.clone()
    y[0, 0] = 1e4
    qx, qy = make(x), make(y)
    block_of_outlier = torch.zeros(4, 128, dtype=torch.bool)
    bm, bn = qy.block
    block_of_outlier[:bm, :bn] = True
    same_elsewhere = torch.equal(qx.elements[~block_of_outlier], qy.elements[~block_of_outlier])
    if name == "per-tensor":  # the block is the tensor: every other element changes, small ones flush to zero
        rest = torch.ones(4, 128, dtype=torch.bool)
        rest[0, 0] = False
        assert not bool((qx.elements[rest] == qy.elements[rest]).any())
        assert (qy.elements == 0).sum() > (qx.elements == 0).sum() + 5
    elif name == "nvfp4":  # the tensor scale moves too, so the other blocks' E4M3 scales are rounded anew
        assert (qy.dequantise() - y.double())[~block_of_outlier].abs().max() < 0.5
    else:
        assert same_elsewhere and torch.equal(qx.scales.reshape(-1)[1:], qy.scales.reshape(-1)[1:])


def test_subnormal_amax():
    tiny = torch.full((1, 32), 1e-40)  # a float32 subnormal
    tiny[0, 1] = -3e-41
    q = M.per_tensor(tiny)
    assert 0 < q.scales.item() < 2.0**-126 and bool(q.dequantise().isfinite().all())
    assert (q.dequantise() - tiny.double()).abs().max() < 1e-41
    assert M.per_tensor(torch.full((1, 4), 1e-45)).scales.item() == 2.0**-149  # amax / 448 underflowed: 2^-149
    m = M.mx(tiny)
    assert m.scale_codes().tolist() == [[0]] and m.scales.item() == 2.0**-127  # clamped to E8M0's smallest
    assert (m.dequantise() - tiny.double()).abs().max() <= 2.0**-127 * 2**-9  # within one E4M3 subnormal step
    n = M.nvfp4(tiny)
    assert n.tensor_scale == float(torch.tensor(1e-40) / 2688.0) and bool(n.dequantise().isfinite().all())
    # float32 arithmetic, as NVIDIA and torchao: 1 / tensor scale overflows to inf, every element saturates to ±6
    assert n.elements.abs().unique().tolist() == [6.0] and n.scales.tolist() == [[448.0, 448.0]]


@pytest.mark.parametrize("name,make", ALL)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nan_or_inf_makes_the_block_nan(name, make, bad):
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(5))
    x[0, 3] = bad
    q = make(x)
    d = q.dequantise()
    assert bool(d[0, : q.block[1]].isnan().all())  # the block holding it
    if name in ("per-tensor", "nvfp4"):  # the tensor is the block, or the tensor scale comes from its amax
        assert bool(d.isnan().all())
    else:
        assert bool(d[1].isfinite().all())
    assert not bool(q.elements.isnan().any())  # elements stay encodable (FP4 has no NaN)
    if q.scale_format == "e8m0fnu":
        assert q.scale_codes()[0, 0] == 0xFF


# --- bytes of scales --------------------------------------------------------------------------------------

def test_scale_bytes_per_element():
    x = torch.randn(256, 256)
    assert M.scale_bytes_per_element(M.per_tensor(x)) == 4 / 65536
    assert M.scale_bytes_per_element(M.rowwise(x)) == 4 / 256
    assert M.scale_bytes_per_element(M.blockwise(x, (1, 128))) == 4 / 128
    assert M.scale_bytes_per_element(M.blockwise(x, (128, 128))) == 4 / 128**2
    assert M.scale_bytes_per_element(M.mx(x)) == 1 / 32
    assert M.scale_bytes_per_element(M.nvfp4(x)) == 1 / 16 + 4 / 65536
    assert M.bits_per_element(M.mx(x)) == 8.25 and M.bits_per_element(M.mx(x, "e2m1fn")) == 4.25
    assert M.bits_per_element(M.nvfp4(x, tensor_scale=False)) == 4.5


# --- bad input ----------------------------------------------------------------------------------------------

def test_bad_input_is_refused():
    x = torch.randn(4, 64)
    with pytest.raises(TypeError, match="torch.Tensor or a numpy array"):
        M.mx([1.0, 2.0])
    with pytest.raises(TypeError, match="floating-point"):
        M.mx(torch.ones(4, 64, dtype=torch.int32))
    with pytest.raises(ValueError, match="at least one dimension"):
        M.per_tensor(torch.tensor(1.0))
    with pytest.raises(ValueError, match="must tile"):
        M.mx(torch.randn(4, 48))
    with pytest.raises(ValueError, match="must tile"):
        M.blockwise(x, (128, 128))
    with pytest.raises(ValueError, match="fmt must be one of"):
        M.mx(x, "bf16")
    with pytest.raises(ValueError, match="scale_rounding"):
        M.mx(x, scale_rounding="nearest")
    with pytest.raises(TypeError):
        M.mx(x, block=32.0)
    with pytest.raises(ValueError):
        M.mx(x, block=0)
    with pytest.raises(TypeError):
        M.nvfp4(x, tensor_scale=1)
    with pytest.raises(TypeError):
        M.scale_bytes_per_element(x)
    with pytest.raises(ValueError, match="values"):
        M.rowwise(torch.empty(4, 4, device="meta"))
    sparse = x.to_sparse()
    for bad in (lambda: M.mx_scale_exponent(sparse), lambda: M.block_amax(sparse, (1, 32)),
                lambda: M.mx(sparse), lambda: M.nvfp4(sparse), lambda: M.rowwise(sparse)):
        with pytest.raises(TypeError, match="dense"):
            bad()
    assert M.mx(x.numpy()).elements.shape == (4, 64)  # numpy arrays are welcome


# --- torchao's reference code, bit for bit --------------------------------------------------------------------

@pytest.fixture(scope="module")
def tao():
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mx_tensor = importlib.import_module("torchao.prototype.mx_formats.mx_tensor")
            nvfp4_tensor = importlib.import_module("torchao.prototype.mx_formats.nvfp4_tensor")
            kernels = importlib.import_module("torchao.prototype.mx_formats.kernels")
            config = importlib.import_module("torchao.prototype.mx_formats.config")
            constants = importlib.import_module("torchao.prototype.mx_formats.constants")
    except ImportError as e:
        unavailable(f"torchao is not installed (pip install 'labkit[lowprecision]'): {e}")
    return mx_tensor, nvfp4_tensor, kernels, config, constants


def tao_mx(tao, x, fmt, rounding):
    mx_tensor, _, kernels, config, constants = tao
    dtype = {"e4m3fn": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "e2m3fn": constants.DTYPE_FP6_E2M3,
             "e3m2fn": constants.DTYPE_FP6_E3M2, "e2m1fn": torch.float4_e2m1fn_x2}[fmt]
    mode = {"floor": config.ScaleCalculationMode.FLOOR, "rceil": config.ScaleCalculationMode.RCEIL}[rounding]
    scale, data = mx_tensor.to_mx(x.contiguous(), dtype, 32, scaling_mode=mode)
    if fmt in ("e4m3fn", "e5m2"):
        elements = data.float()
    elif fmt == "e2m3fn":
        elements = kernels.f6_e2m3_unpacked_to_f32(data)
    elif fmt == "e3m2fn":
        elements = kernels.f6_e3m2_unpacked_to_f32(data)
    else:
        elements = kernels.f4_unpacked_to_f32(kernels.unpack_uint4(data))
    return scale.view(torch.uint8).numpy(), elements.reshape(x.shape)


@pytest.mark.parametrize("fmt", M.ELEMENT_FORMATS)
@pytest.mark.parametrize("rounding", M.SCALE_ROUNDINGS)
def test_mx_matches_torchao_bit_for_bit(tao, fmt, rounding):
    hard = adversarial()
    if rounding == "rceil":  # row 4's amax is just above 448 × 2^10: a stated difference, tested below
        hard = hard[[0, 1, 2, 3, 5, 6, 7]]
    for x in (sample(), sample(16, 512, seed=7), hard):
        codes, elements = tao_mx(tao, x, fmt, rounding)
        q = M.mx(x, fmt, scale_rounding=rounding)
        assert np.array_equal(q.scale_codes(), codes), (fmt, rounding)
        assert torch.equal(q.elements, elements), (fmt, rounding)


@pytest.mark.parametrize("rounding", M.SCALE_ROUNDINGS)
def test_mx_differences_from_torchao_are_the_stated_ones(tao, rounding):
    # a block whose scale is 2^-127: the same scale code 0, but torchao divides by 2^-126 (FLOOR) or 1 (RCEIL)
    x = torch.full((1, 32), 3e-38)
    codes, elements = tao_mx(tao, x, "e4m3fn", rounding)
    q = M.mx(x, scale_rounding=rounding)
    assert codes.tolist() == q.scale_codes().tolist() == [[0]]
    divisor = 2.0**-126 if rounding == "floor" else 1.0
    want = F.round_array(x.double().numpy() / divisor, "e4m3fn", overflow="saturate")
    assert np.array_equal(elements.double().numpy(), want) and not torch.equal(elements, q.elements)
    assert (q.dequantise() - x.double()).abs().max() < (elements.double() * 2.0**-127 - x.double()).abs().max()
    # NaN: both store the NaN scale 0xFF; ±inf: torchao a finite scale, labkit NaN
    y = torch.ones(2, 32)
    y[0, 1], y[1, 2] = math.nan, math.inf
    codes, _ = tao_mx(tao, y, "e4m3fn", rounding)
    assert codes[0, 0] == 0xFF == M.mx(y, scale_rounding=rounding).scale_codes()[0, 0]
    assert codes[1, 0] != 0xFF and M.mx(y, scale_rounding=rounding).scale_codes()[1, 0] == 0xFF
    # rceil: an amax one float32 step above 448 × 2^10 needs 2^11; torchao's float32 log2 rounds it to 2^10
    z = torch.ones(1, 32)
    z[0, 0] = float(np.nextafter(np.float32(448.0 * 2**10), np.float32(np.inf)))
    codes, elements = tao_mx(tao, z, "e4m3fn", rounding)
    q = M.mx(z, scale_rounding=rounding)
    if rounding == "rceil":
        assert q.scale_codes()[0, 0] == 127 + 11 and codes[0, 0] == 127 + 10
        assert elements[0, 0].item() == 448.0 and q.dequantise()[0, 0].item() == 448.0 * 2**10
    else:
        assert q.scale_codes()[0, 0] == codes[0, 0] == 127 + 10 and torch.equal(q.elements, elements)


@pytest.mark.parametrize("two_level", [True, False])
def test_nvfp4_matches_torchao_bit_for_bit(tao, two_level):
    _, nvfp4_tensor, kernels, _, _ = tao
    for x in (sample(), sample(16, 512, seed=8), adversarial()[1:7] * 1e-3, adversarial()[:7]):
        pts = nvfp4_tensor.per_tensor_amax_to_scale(x.abs().amax()) if two_level else None
        scales, data = nvfp4_tensor.nvfp4_quantize(x.contiguous(), 16, pts)
        elements = kernels.f4_unpacked_to_f32(kernels.unpack_uint4(data)).reshape(x.shape)
        q = M.nvfp4(x, tensor_scale=two_level)
        assert torch.equal(q.scales, scales.float()) and torch.equal(q.elements, elements)
        assert (q.tensor_scale is None) == (not two_level) and (pts is None or q.tensor_scale == pts.item())


def test_nvfp4_all_zero_tensor_differs_from_torchao_as_stated(tao):
    _, nvfp4_tensor, _, _, _ = tao
    x = torch.zeros(2, 32)
    pts = nvfp4_tensor.per_tensor_amax_to_scale(x.abs().amax())
    scales, _ = nvfp4_tensor.nvfp4_quantize(x, 16, pts)
    assert bool(scales.float().isnan().all())  # torchao: 0 / 0
    q = M.nvfp4(x)
    assert q.tensor_scale == 1.0 and bool((q.scales == 2.0**-6).all()) and bool((q.dequantise() == 0).all())
