"""Block scaling for low-precision tensors: the FP8 scaling ladder, MX and NVFP4, written to be read.

Introduced in notebook 17 ("17 · The low-precision frontier: FP8 scaling, MX and NVFP4").

A narrow format holds few values over a small range, so a tensor is stored as *elements* in that format
times a *scale*: ``x ≈ element × scale``. The blocks that share one scale get finer down the ladder; the
finer they are, the less one outlier costs its neighbours, and the more bytes the scales take:

====================  ==================================  ==========================  ===============
scheme                block that shares a scale           scale                       function
====================  ==================================  ==========================  ===============
per-tensor (current)  the whole tensor                    FP32                        ``per_tensor``
rowwise               one row (1 × K)                     FP32                        ``rowwise``
blockwise             1 × 128 activations,                FP32                        ``blockwise``
(DeepSeek-V3)         128 × 128 weights
MX (OCP MX v1.0)      1 × 32                              E8M0: a power of two        ``mx``
NVFP4 (NVIDIA)        1 × 16                              E4M3, and one FP32          ``nvfp4``
                                                          per tensor
====================  ==================================  ==========================  ===============

Every function returns a ``Quantised``: ``elements`` (values of the element format, exact in float32,
shaped as the input), ``scales`` (one per block, float32, over the input seen as a matrix: leading dims
flattened into rows, the last dim as columns), ``tensor_scale`` (NVFP4's second level) and
``dequantise()``, which returns the exact value the encoding stands for, in float64.
``scale_bytes_per_element`` and ``bits_per_element`` say what the scales cost. Elements are rounded by
``labkit.formats.round_array`` (round to nearest, ties to even, saturating at ±max as the MX spec asks
and torch's FP8 casts do), the codec that ``tests/test_formats.py`` checks against ml_dtypes.

The MX shared scale is 2^k with k = floor(log2(amax)) - emax, emax being the exponent of the element
format's largest value (8 for E4M3, 15 for E5M2, 2 for E2M3 and E2M1, 4 for E3M2): the OCP spec's rule
(``scale_rounding="floor"``). Its largest element can then land above the format's max and saturate.
``scale_rounding="rceil"`` rounds the scale up instead, k = ceil(log2(amax / max)), so nothing saturates:
the fix of "Recipes for Pre-training LLMs with MXFP8" (Mishra et al., NVIDIA, 2025), which is also
cuBLAS's and torchao's RCEIL mode.

Stated behaviour (each case is tested in ``tests/test_microscaling.py``):

- an all-zero block gets the scale 1 (FP32 schemes), 2^-127 (MX) or 2^-6 (NVFP4, whose block scales
  are clamped to [2^-6, 448] as torchao does); its elements are zero and it dequantises to zero;
- one huge outlier changes only its own block's scale: every other block is quantised bit for bit as
  without it (per-tensor scaling, where the block is the tensor, flushes the small values to zero);
- a subnormal amax: FP32 scales are float32(amax / max), never 0 (at least 2^-149); an MX scale below
  2^-127 is clamped to 2^-127 (and above 2^127 to 2^127, where the elements saturate); NVFP4 of a
  tensor whose amax is a float32 subnormal saturates every nonzero element to ±6, because 1 / tensor
  scale overflows float32 (as in torchao: that is the recipe's float32 arithmetic);
- a NaN or ±inf in a block makes that block's scale NaN, its elements 0, and it dequantises to NaN;
  for two-level NVFP4, whose tensor scale comes from the amax of the whole tensor, the whole tensor.

Checked bit for bit (elements and scales) against torchao 0.18's reference code,
``torchao.prototype.mx_formats.mx_tensor.to_mx`` and ``nvfp4_tensor.nvfp4_quantize``, where it is
installed (``pip install labkit[lowprecision]``). Where they differ, on purpose:

- MX blocks whose scale is 2^-127 (amax below about 2^-119 for E4M3): torchao stores 2^-127 but divides
  by 2^-126 (FLOOR: it clamps the float32 scale to the smallest normal) or by 1 (RCEIL); here the
  elements are x / 2^-127, so that dequantising gives x back;
- a block with ±inf (no NaN): torchao takes a finite scale from the exponent bits of inf and saturates;
  here the block is NaN, as for NaN (where torchao also stores the NaN scale 0xFF);
- NVFP4 of an all-zero tensor: torchao divides 0 by a zero tensor scale and gets NaN; here the tensor
  scale is 1 and everything is zero;
- MX ``rceil``: torchao's eager code takes ceil(log2(amax / max)) in float32, which can round an
  amax / max just above a power of two down to it; here k is exact (as the hardware's conversion is).

NVFP4 is computed in float32, step by step as NVIDIA describes it and torchao does: tensor scale
amax / (448 × 6), block scale E4M3(amax_block / 6 / tensor scale), elements E2M1(x × ((1 / tensor
scale) / block scale)). The other schemes divide in float64, which is exact for these scales.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from labkit import formats
from labkit._validate import safe_repr

__all__ = [
    "ACTIVATION_BLOCK",
    "ELEMENT_FORMATS",
    "MX_BLOCK",
    "NVFP4_BLOCK",
    "SCALE_ROUNDINGS",
    "WEIGHT_BLOCK",
    "Quantised",
    "bits_per_element",
    "block_amax",
    "blockwise",
    "mx",
    "mx_scale_exponent",
    "nvfp4",
    "per_tensor",
    "round_tensor",
    "rowwise",
    "scale_bytes_per_element",
]

#: The element formats a block can hold: FP8 E4M3/E5M2, FP6 E2M3/E3M2, FP4 E2M1.
ELEMENT_FORMATS: tuple[str, ...] = ("e4m3fn", "e5m2", "e2m3fn", "e3m2fn", "e2m1fn")
#: How the MX shared exponent is rounded: the OCP spec's floor, or rounded up (MXFP8 recipe, 2025).
SCALE_ROUNDINGS: tuple[str, ...] = ("floor", "rceil")
#: DeepSeek-V3's FP8 blocks: 1 × 128 for activations, 128 × 128 for weights.
ACTIVATION_BLOCK: tuple[int, int] = (1, 128)
WEIGHT_BLOCK: tuple[int, int] = (128, 128)
#: The OCP MX block and the NVFP4 block, along the last dimension.
MX_BLOCK = 32
NVFP4_BLOCK = 16

_E4M3_MAX, _E2M1_MAX = 448.0, 6.0
_E4M3_TINY = 2.0**-6  # the smallest normal E4M3 value: NVFP4 block scales are clamped to [2^-6, 448]
_FP32_TINY = 2.0**-149  # the smallest float32 subnormal


@dataclass(frozen=True, eq=False)
class Quantised:
    """A tensor stored as low-precision elements and one scale per block: ``x ≈ element × scale``.

    ``elements`` has the input's shape (float32 holding values of ``element_format``); ``scales`` has
    one entry per ``block`` (rows, columns) of the input seen as a matrix (leading dims flattened), in
    float32 holding values of ``scale_format``; ``tensor_scale`` is NVFP4's per-tensor FP32 scale.
    Introduced in notebook 17.
    """

    scheme: str
    elements: torch.Tensor
    scales: torch.Tensor
    block: tuple[int, int]
    element_format: str
    scale_format: str
    tensor_scale: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.elements, torch.Tensor) or not isinstance(self.scales, torch.Tensor):
            raise TypeError("elements and scales must be torch tensors")
        if not (isinstance(self.block, tuple) and len(self.block) == 2):
            raise TypeError(f"block must be a (rows, cols) tuple, got {safe_repr(self.block)}")
        formats.get_format(self.element_format)
        formats.get_format(self.scale_format)

    def element_scales(self) -> torch.Tensor:
        """Each element's scale (block scale × tensor scale), float64, in the elements' shape."""
        cols = self.elements.shape[-1] if self.elements.dim() else 1
        s = _expand(self.scales.to(torch.float64), self.block)
        s = s * (1.0 if self.tensor_scale is None else self.tensor_scale)
        return s.reshape(-1, cols).reshape(self.elements.shape)

    def dequantise(self) -> torch.Tensor:
        """Return element × block scale (× tensor scale), exactly, as float64 in the input's shape."""
        return self.elements.to(torch.float64) * self.element_scales()

    def element_codes(self) -> np.ndarray:
        """The elements' bit patterns in ``element_format`` (labkit.formats.encode_array)."""
        return formats.encode_array(self.elements.double().numpy(), self.element_format)

    def scale_codes(self) -> np.ndarray:
        """The scales' bit patterns in ``scale_format`` (for MX: the biased E8M0 exponents, NaN = 0xFF)."""
        return formats.encode_array(self.scales.double().numpy(), self.scale_format)


# --- checks at the door ------------------------------------------------------------------------------

def _as_matrix(x: object) -> torch.Tensor:
    """x as a float64 matrix: leading dims flattened into rows, the last dim as columns."""
    if isinstance(x, np.ndarray):
        if x.dtype.kind != "f":
            raise TypeError(f"x must hold floating-point numbers, got numpy dtype {x.dtype}")
        x = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64))
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor or a numpy array, got {type(x).__name__}")
    if x.layout != torch.strided:
        raise TypeError(f"x must be a dense (strided) tensor, got layout {x.layout}")
    if x.device.type == "meta":
        raise ValueError(f"x must be a tensor with values, got one on {x.device}")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got {x.dtype}")
    if x.dim() == 0 or x.numel() == 0:
        raise ValueError(f"x must have at least one dimension and one element, got shape {tuple(x.shape)}")
    return x.detach().cpu().to(torch.float64).reshape(-1, x.shape[-1])


def _element_format(fmt: object) -> formats.FloatFormat:
    if not isinstance(fmt, (str, formats.FloatFormat)):
        raise TypeError(f"fmt must be an element format name such as 'e4m3fn', got {type(fmt).__name__}")
    f = formats.get_format(fmt)
    if f.name not in ELEMENT_FORMATS:
        raise ValueError(f"fmt must be one of {ELEMENT_FORMATS}, got {safe_repr(fmt)}")
    return f


def _positive_int(v: object, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{what} must be a positive int, got {type(v).__name__}")
    if v < 1:
        raise ValueError(f"{what} must be a positive int, got {safe_repr(v)}")
    return int(v)


def _check_block(x2: torch.Tensor, block: object) -> tuple[int, int]:
    if not isinstance(block, (tuple, list)) or len(block) != 2:
        raise TypeError(f"block must be a (rows, cols) pair of ints, got {safe_repr(block)}")
    bm, bn = _positive_int(block[0], "block rows"), _positive_int(block[1], "block cols")
    rows, cols = x2.shape
    if rows % bm or cols % bn:
        raise ValueError(f"a {bm} x {bn} block must tile the {rows} x {cols} matrix (leading dims flattened "
                         "into rows): pad the tensor or pick a block that divides it")
    return bm, bn


# --- the pieces ----------------------------------------------------------------------------------------

def block_amax(x: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """Return the largest |x| of every ``block`` of the matrix ``x``: shape (rows / bm, cols / bn).

    NaN where the block holds a NaN, inf where it holds ±inf. Introduced in notebook 17.
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.is_floating_point() or x.layout != torch.strided:
        raise TypeError("x must be a dense (strided) 2-D floating-point torch.Tensor")
    bm, bn = _check_block(x, block)
    rows, cols = x.shape
    return x.abs().reshape(rows // bm, bm, cols // bn, bn).amax(dim=(1, 3))


def _expand(s: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """Repeat each block's value over the block's elements."""
    return s.repeat_interleave(block[0], dim=0).repeat_interleave(block[1], dim=1)


def round_tensor(v: torch.Tensor, fmt: str | formats.FloatFormat) -> torch.Tensor:
    """Round every value of ``v`` to ``fmt``: nearest, ties to even, saturating at ±max; float64 on the CPU.

    The codec of ``labkit.formats`` on a tensor (NaN stays NaN). Introduced in notebook 17.
    """
    if not isinstance(v, torch.Tensor):
        raise TypeError(f"v must be a torch.Tensor, got {type(v).__name__}")
    f = formats.get_format(fmt)  # a format name or FloatFormat; anything else is refused here
    if v.device.type == "meta":
        raise ValueError("v is a meta tensor: it has no values to round")
    return torch.from_numpy(np.asarray(formats.round_array(v.detach().cpu().double().numpy(), f, overflow="saturate")))


def _round_elements(v: torch.Tensor, f: formats.FloatFormat) -> torch.Tensor:
    """round_tensor, stored as float32 (every element and scale format fits float32 exactly)."""
    return round_tensor(v, f).float()


def _quantise(x2: torch.Tensor, scale: torch.Tensor, block: tuple[int, int],
              f: formats.FloatFormat) -> torch.Tensor:
    """elements = round(x / scale); a block with a NaN scale keeps zeros (its NaN scale says it all)."""
    s = _expand(scale.double(), block)
    return _round_elements(torch.where(torch.isnan(s), 0.0, x2 / s), f)


# --- the FP8 ladder: FP32 scales ------------------------------------------------------------------------

def _fp32_scaled(x: object, block: object, fmt: object, scheme: str) -> Quantised:
    f = _element_format(fmt)
    x2 = _as_matrix(x)
    block = (x2.shape[0], x2.shape[1]) if block is None else block
    bm, bn = _check_block(x2, block)
    amax = block_amax(x2, (bm, bn))
    scale = (amax / f.max).float()  # x ≈ element × scale: the block's amax lands on the format's max
    scale = torch.where(amax == 0, 1.0, scale)  # an all-zero block: any scale gives zeros
    scale = torch.where((scale == 0) & (amax > 0), _FP32_TINY, scale)  # amax / max underflowed float32
    scale = torch.where(torch.isfinite(amax), scale, math.nan)  # NaN or ±inf in the block
    elements = _quantise(x2, scale, (bm, bn), f)
    shape = torch.Size(x.shape)  # type: ignore[attr-defined]
    return Quantised(scheme, elements.reshape(shape), scale, (bm, bn), f.name, "fp32")


def per_tensor(x: torch.Tensor, fmt: str = "e4m3fn") -> Quantised:
    """Quantise ``x`` with one FP32 scale for the whole tensor, amax / max (per-tensor *current* scaling).

    Introduced in notebook 17.
    """
    return _fp32_scaled(x, None, fmt, "per-tensor")


def rowwise(x: torch.Tensor, fmt: str = "e4m3fn") -> Quantised:
    """Quantise ``x`` with one FP32 scale per row (the last dimension shares a scale), as torchao's rowwise.

    Introduced in notebook 17.
    """
    x2 = _as_matrix(x)
    return _fp32_scaled(x, (1, x2.shape[1]), fmt, "rowwise")


def blockwise(x: torch.Tensor, block: tuple[int, int] = ACTIVATION_BLOCK, fmt: str = "e4m3fn") -> Quantised:
    """Quantise ``x`` with one FP32 scale per ``block`` (DeepSeek-V3: (1, 128) activations, (128, 128) weights).

    The block must tile ``x`` seen as a matrix (leading dims flattened into rows). Introduced in notebook 17.
    """
    return _fp32_scaled(x, block, fmt, f"blockwise {block[0]}x{block[1]}" if isinstance(block, tuple)
                        and len(block) == 2 else "blockwise")


# --- MX: a shared power of two per 32 elements ----------------------------------------------------------

def mx_scale_exponent(amax: torch.Tensor, fmt: str = "e4m3fn", scale_rounding: str = "floor") -> torch.Tensor:
    """Return the shared exponent k of each MX block (its scale is 2^k), clamped to E8M0's [-127, 127].

    ``"floor"`` (OCP MX v1.0): k = floor(log2(amax)) - emax of the element format. ``"rceil"`` (rounded
    up, the 2025 MXFP8 recipe): k = ceil(log2(amax / max)), the smallest k with amax ≤ max × 2^k. An
    amax of 0 gives -127; NaN/inf give a meaningless k (``mx`` makes those blocks NaN). Exact in float64.
    Introduced in notebook 17.
    """
    f = _element_format(fmt)
    if not isinstance(amax, torch.Tensor) or not amax.is_floating_point() or amax.layout != torch.strided:
        raise TypeError("amax must be a dense (strided) floating-point torch.Tensor")
    if amax.device.type == "meta":
        raise ValueError("amax must be a tensor with values, got one on the meta device")
    if not isinstance(scale_rounding, str):
        raise TypeError(f"scale_rounding must be one of {SCALE_ROUNDINGS}, got {type(scale_rounding).__name__}")
    if scale_rounding not in SCALE_ROUNDINGS:
        raise ValueError(f"scale_rounding must be one of {SCALE_ROUNDINGS}, got {safe_repr(scale_rounding)}")
    a = amax.detach().cpu().double()
    finite = torch.where(torch.isfinite(a), a, 1.0)
    if scale_rounding == "floor":
        _, e = torch.frexp(finite)  # amax = m × 2^e with 0.5 ≤ m < 1, so floor(log2(amax)) = e - 1
        k = (e.long() - 1) - f.emax
    else:
        _, e = torch.frexp(finite / f.max)  # a first guess: amax / max ≤ 2^e
        e = e.long()
        k = torch.where(finite <= torch.ldexp(torch.full_like(finite, f.max), e - 1), e - 1, e)
    k = torch.where(finite == 0, -127, k)  # an all-zero block: the smallest scale
    return k.clamp(-127, 127)


def mx(x: torch.Tensor, fmt: str = "e4m3fn", *, block: int = MX_BLOCK, scale_rounding: str = "floor") -> Quantised:
    """Quantise ``x`` to an MX format: one E8M0 scale 2^k per ``block`` elements along the last dimension.

    ``fmt``: "e4m3fn"/"e5m2" (MXFP8), "e2m3fn"/"e3m2fn" (MXFP6), "e2m1fn" (MXFP4). ``scale_rounding``:
    "floor" (OCP spec) or "rceil" (rounded up), see ``mx_scale_exponent``. Introduced in notebook 17.
    """
    f = _element_format(fmt)
    x2 = _as_matrix(x)
    bn = _positive_int(block, "block")
    amax = block_amax(x2, (1, bn))
    k = mx_scale_exponent(amax, f, scale_rounding)
    scale = torch.ldexp(torch.ones_like(amax), k)  # 2^k: exact (2^-127 is a float32 subnormal)
    scale = torch.where(torch.isfinite(amax), scale, math.nan).float()  # E8M0's NaN: 0xFF
    elements = _quantise(x2, scale, (1, bn), f)
    return Quantised(f"MX{_short(f)}", elements.reshape(x.shape), scale, (1, bn), f.name, "e8m0fnu")


def _short(f: formats.FloatFormat) -> str:
    return {"e4m3fn": "FP8 E4M3", "e5m2": "FP8 E5M2", "e2m3fn": "FP6 E2M3", "e3m2fn": "FP6 E3M2",
            "e2m1fn": "FP4 E2M1"}[f.name]


# --- NVFP4: E4M3 scale per 16 elements, and one FP32 scale per tensor --------------------------------------

def nvfp4(x: torch.Tensor, *, block: int = NVFP4_BLOCK, tensor_scale: bool = True) -> Quantised:
    """Quantise ``x`` to NVFP4: E2M1 elements, an E4M3 scale per ``block`` (16), an FP32 scale per tensor.

    All in float32, as NVIDIA and torchao compute it: tensor scale s = amax / (448 × 6); block scale
    E4M3(clamp(amax_block / 6 / s, 2^-6, 448)); elements E2M1(clamp(x × ((1 / s) / block scale), ±6)).
    A tensor scale of 0 (an all-zero tensor, or amax / 2688 below float32) is taken as 1.
    ``tensor_scale=False`` is the single-level variant (block scales E4M3(amax_block / 6)).
    Introduced in notebook 17.
    """
    if not isinstance(tensor_scale, bool):
        raise TypeError(f"tensor_scale must be True or False, got {type(tensor_scale).__name__}")
    e2m1, e4m3 = formats.get_format("e2m1fn"), formats.get_format("e4m3fn")
    x2 = _as_matrix(x).float()  # float32 arithmetic throughout, as the hardware recipe
    bn = _positive_int(block, "block")
    amax_b = block_amax(x2, (1, bn))
    decode_block = amax_b / _E2M1_MAX  # the block scale that maps amax_block onto E2M1's max, 6
    s_t: float | None = None
    if tensor_scale:
        amax_t = x2.abs().amax()
        s_t = float(amax_t / (_E4M3_MAX * _E2M1_MAX))  # float32: maps the tensor's amax onto 448 × 6
        s_t = s_t if s_t != 0 else 1.0
        if not math.isfinite(s_t):  # NaN or ±inf anywhere: the whole tensor is NaN
            nan = torch.full_like(amax_b, math.nan)
            return Quantised("NVFP4", torch.zeros_like(x2).reshape(x.shape), nan, (1, bn), "e2m1fn", "e4m3fn",
                             math.nan)
        decode_block = decode_block / torch.tensor(s_t, dtype=torch.float32)
    s_b = _round_elements(decode_block.clamp(_E4M3_TINY, _E4M3_MAX), e4m3)  # the stored E4M3 block scale
    s_b = torch.where(torch.isfinite(amax_b), s_b, math.nan)
    recip = 1.0 / s_b if s_t is None else (1.0 / torch.tensor(s_t, dtype=torch.float32)) / s_b
    scaled = x2 * _expand(recip, (1, bn))  # float32 multiply, as torchao and NVIDIA's kernels
    elements = _round_elements(torch.where(_expand(torch.isnan(s_b), (1, bn)), 0.0,
                                           scaled.clamp(-_E2M1_MAX, _E2M1_MAX)), e2m1)
    return Quantised("NVFP4", elements.reshape(x.shape), s_b, (1, bn), "e2m1fn", "e4m3fn", s_t)


# --- what the scales cost ---------------------------------------------------------------------------------

def scale_bytes_per_element(q: Quantised) -> float:
    """Return the bytes of scales per element: FP32 scales 4 bytes, E8M0 and E4M3 1 byte, per block.

    MX: 1 / 32; NVFP4: 1 / 16 + 4 / numel; blockwise 1 × 128: 4 / 128. Introduced in notebook 17.
    """
    if not isinstance(q, Quantised):
        raise TypeError(f"q must be a Quantised (from per_tensor, rowwise, blockwise, mx or nvfp4), "
                        f"got {type(q).__name__}")
    per_scale = formats.get_format(q.scale_format).total_bits / 8
    total = q.scales.numel() * per_scale + (4 if q.tensor_scale is not None else 0)
    return total / q.elements.numel()


def bits_per_element(q: Quantised) -> float:
    """Return the storage per element in bits, elements and scales together (MXFP8: 8.25, NVFP4: 4.5+).

    Introduced in notebook 17.
    """
    if not isinstance(q, Quantised):
        raise TypeError(f"q must be a Quantised, got {type(q).__name__}")
    return formats.get_format(q.element_format).total_bits + 8 * scale_bytes_per_element(q)
