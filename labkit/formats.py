"""Floating-point formats as data, and a hand-written codec to take them apart bit by bit.

Covers FP64, FP32, TF32, FP16, BF16, FP8 E4M3FN and FP8 E5M2 (notebook 01), and the microscaling
formats of notebook 17: the scale format E8M0 (``e8m0fnu``: no sign, no mantissa, NaN at 0xFF) and the
element formats FP6 E2M3/E3M2 and FP4 E2M1 (``e2m3fn``, ``e3m2fn``, ``e2m1fn``: no inf, no NaN).
``decode`` turns a bit pattern into its exact value, ``encode`` rounds a number to the nearest pattern
(round-to-nearest, ties to even) with the format's own overflow rule, and ``fields`` names the sign,
exponent and mantissa. Vectorised numpy versions (``decode_array``, ``encode_array``, ``round_array``)
serve the later notebooks.

This is teaching code, written for reading; ``tests/test_formats.py`` checks it exhaustively against
torch casts and ml_dtypes.

Overflow on E4M3FN is where libraries disagree: E4M3FN has no infinity, and ml_dtypes (like the OCP FP8
spec's non-saturating mode) turns an overflow into NaN, while torch's cast *saturates* to ±448. Both
are available here by name: ``encode(x, "e4m3fn", overflow="nan")`` (the default, as ml_dtypes) and
``overflow="saturate"`` (as torch).

The microscaling formats, as the OCP MX v1.0 spec and ml_dtypes define them:

- E8M0 (``e8m0fnu``) is a power of two and nothing else: 8 exponent bits, bias 127, no sign bit and no
  mantissa, so the pattern E stands for 2^(E-127), from 2^-127 (0x00) to 2^127 (0xFE); 0xFF is NaN. It has
  no zero, no negative numbers and no infinity: ``encode`` gives NaN for 0, negative numbers and -inf (as
  ml_dtypes; torch's cast drops the sign and maps 0 to 2^-127), rounds a tie between 2^k and 2^(k+1) up
  (ties to even on the significand 1.1b), sends a positive number below 2^-127 to 2^-127 (the nearest
  value) and an overflow to NaN (``overflow="saturate"``: to 2^127).
- FP6 E2M3 (max 7.5), FP6 E3M2 (max 28) and FP4 E2M1 (max 6) use every pattern for a number: no inf, no
  NaN. Overflow and ±inf saturate to ±max, as ml_dtypes does (and the MX spec asks). NaN has no pattern:
  ``encode`` refuses it (ValueError) and ``round_to``/``round_array`` return NaN, where ml_dtypes' cast
  silently writes -0.
- FP4 E2M1's 16 values: ±{0, 0.5, 1, 1.5, 2, 3, 4, 6} (``FP4_E2M1_VALUES``).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal, NamedTuple

import numpy as np

from labkit._validate import safe_repr

__all__ = [
    "FORMATS",
    "FP4_E2M1_VALUES",
    "MICROSCALING_FORMATS",
    "OVERFLOW_RULES",
    "Fields",
    "FloatFormat",
    "decode",
    "decode_array",
    "encode",
    "encode_array",
    "fields",
    "fields_from_bits",
    "get_format",
    "neighbours",
    "next_down",
    "next_up",
    "round_array",
    "round_to",
    "table",
    "ulp",
]

Overflow = Literal["inf", "nan", "saturate"]
OVERFLOW_RULES: tuple[str, ...] = ("inf", "nan", "saturate")
Number = int | float | Fraction | np.integer | np.floating


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format: field widths, bias and how it handles specials and overflow.

    ``nan_style`` is "ieee" (all-ones exponent with a non-zero mantissa is NaN, all-ones exponent with
    a zero mantissa is ±inf), "fn" (finite-only, as E4M3FN: no inf, and only the all-ones pattern
    S.1111.111 is NaN, so the top exponent still holds normal numbers; E8M0, with no mantissa, loses its
    whole top exponent to NaN) or "none" (FP6, FP4: no inf and no NaN, every pattern is a number).
    ``overflow`` is the default rule for values beyond ``max``: "inf", "nan" or "saturate".
    ``signed`` is False for E8M0, which has no sign bit. A format without mantissa bits (E8M0) has no
    zero and no subnormals: exponent field 0 stands for 2^-bias.

    Introduced in notebook 01.
    """

    name: str
    exp_bits: int
    man_bits: int
    nan_style: Literal["ieee", "fn", "none"]
    overflow: Overflow
    description: str
    specials: str
    torch_dtype: str | None = None
    numpy_dtype: str | None = None
    signed: bool = True

    @property
    def total_bits(self) -> int:
        """Sign (if any) + exponent + mantissa bits."""
        return int(self.signed) + self.exp_bits + self.man_bits

    @property
    def sign_bit(self) -> int:
        """The mask of the sign bit, 0 for an unsigned format (E8M0)."""
        return 1 << (self.total_bits - 1) if self.signed else 0

    @property
    def has_nan(self) -> bool:
        """Whether the format has a NaN pattern (FP6 and FP4 have none)."""
        return self.nan_style != "none"

    @property
    def has_subnormals(self) -> bool:
        """Whether exponent field 0 holds zero and subnormals (not in E8M0, which has no mantissa)."""
        return self.man_bits > 0

    @property
    def bias(self) -> int:
        """The exponent bias, 2^(e-1) - 1."""
        return (1 << (self.exp_bits - 1)) - 1

    @property
    def has_inf(self) -> bool:
        """Whether the format has ±inf."""
        return self.nan_style == "ieee"

    @property
    def emin(self) -> int:
        """The exponent of the smallest normal number (E8M0: of its smallest value, 2^-127)."""
        return 1 - self.bias if self.has_subnormals else -self.bias

    @property
    def emax(self) -> int:
        """The exponent of the largest finite number."""
        top = (1 << self.exp_bits) - 1
        top_is_special = self.nan_style == "ieee" or (self.nan_style == "fn" and self.man_bits == 0)
        return (top - 1 if top_is_special else top) - self.bias

    @property
    def max_mantissa(self) -> int:
        """The largest mantissa field at exponent ``emax`` (E4M3FN keeps all-ones for NaN)."""
        full = (1 << self.man_bits) - 1
        return full - 1 if self.nan_style == "fn" and self.man_bits > 0 else full

    @property
    def max(self) -> float:
        """The largest finite value."""
        return math.ldexp(1 + self.max_mantissa / (1 << self.man_bits), self.emax)

    @property
    def smallest_normal(self) -> float:
        """The smallest positive normal value, 2^emin."""
        return math.ldexp(1.0, self.emin)

    @property
    def smallest_subnormal(self) -> float:
        """The smallest positive value, 2^(emin - mantissa bits)."""
        return math.ldexp(1.0, self.emin - self.man_bits)

    @property
    def eps(self) -> float:
        """Machine epsilon: the gap between 1 and the next value, 2^-mantissa_bits."""
        return math.ldexp(1.0, -self.man_bits)

    @property
    def precision_digits(self) -> float:
        """About how many decimal digits the mantissa holds, log10(2^(m+1))."""
        return (self.man_bits + 1) * math.log10(2)

    @property
    def nan_bits(self) -> int:
        """The canonical (quiet, positive) NaN pattern; ValueError for a format without NaN."""
        if self.nan_style == "none":
            raise ValueError(f"{self.name} has no NaN: every one of its patterns is a number")
        if self.nan_style == "fn":
            return (1 << (self.exp_bits + self.man_bits)) - 1
        return (((1 << self.exp_bits) - 1) << self.man_bits) | (1 << (self.man_bits - 1))

    @property
    def inf_bits(self) -> int | None:
        """The +inf pattern, or None for a format without infinity."""
        return ((1 << self.exp_bits) - 1) << self.man_bits if self.has_inf else None

    @property
    def max_bits(self) -> int:
        """The pattern of +max."""
        return ((self.emax + self.bias) << self.man_bits) | self.max_mantissa

    def __repr__(self) -> str:
        return f"FloatFormat({self.name}: {int(self.signed)}+{self.exp_bits}+{self.man_bits} bits, bias {self.bias})"


FORMATS: dict[str, FloatFormat] = {
    f.name: f
    for f in [
        FloatFormat("fp64", 11, 52, "ieee", "inf", "IEEE 754 binary64 (double)",
                    "±inf: exponent all ones, mantissa 0; NaN: exponent all ones, mantissa ≠ 0; overflow → inf",
                    "float64", "float64"),
        FloatFormat("fp32", 8, 23, "ieee", "inf", "IEEE 754 binary32 (single)",
                    "±inf: exponent all ones, mantissa 0; NaN: exponent all ones, mantissa ≠ 0; overflow → inf",
                    "float32", "float32"),
        FloatFormat("tf32", 8, 10, "ieee", "inf",
                    "NVIDIA TensorFloat-32: FP32's range with FP16's 10-bit mantissa, used inside tensor cores;"
                    " stored in memory as FP32",
                    "as FP32: ±inf and NaN at exponent all ones; overflow → inf", None, None),
        FloatFormat("fp16", 5, 10, "ieee", "inf", "IEEE 754 binary16 (half)",
                    "±inf: exponent 11111, mantissa 0; NaN: exponent 11111, mantissa ≠ 0; overflow → inf",
                    "float16", "float16"),
        FloatFormat("bf16", 8, 7, "ieee", "inf", "bfloat16 (brain float): FP32's range, 7-bit mantissa",
                    "as FP32: ±inf and NaN at exponent all ones; overflow → inf", "bfloat16", "bfloat16"),
        FloatFormat("e4m3fn", 4, 3, "fn", "nan",
                    "FP8 E4M3FN (OCP): 4 exponent bits, 3 mantissa bits, finite-only; for forward tensors",
                    "no inf; NaN only S.1111.111; overflow → NaN in ml_dtypes (OCP non-saturating), "
                    "but torch's cast saturates to ±448",
                    "float8_e4m3fn", "float8_e4m3fn"),
        FloatFormat("e5m2", 5, 2, "ieee", "inf",
                    "FP8 E5M2 (OCP): 5 exponent bits, 2 mantissa bits, IEEE-like; for gradients",
                    "±inf: exponent 11111, mantissa 00; NaN: exponent 11111, mantissa ≠ 0; overflow → inf "
                    "(torch and ml_dtypes agree)",
                    "float8_e5m2", "float8_e5m2"),
        FloatFormat("e8m0fnu", 8, 0, "fn", "nan",
                    "E8M0 (OCP MX): the shared scale of an MX block, a power of two 2^(E-127); unsigned, "
                    "no mantissa",
                    "no sign, no zero, no inf; NaN only 0xFF; 0 and negatives → NaN, overflow → NaN "
                    "(ml_dtypes); torch's cast maps 0 to 2^-127 and drops the sign",
                    "float8_e8m0fnu", "float8_e8m0fnu", signed=False),
        FloatFormat("e2m3fn", 2, 3, "none", "saturate",
                    "FP6 E2M3 (OCP MX): MXFP6 element, 2 exponent bits, 3 mantissa bits",
                    "no inf, no NaN; overflow and ±inf saturate to ±7.5", None, "float6_e2m3fn"),
        FloatFormat("e3m2fn", 3, 2, "none", "saturate",
                    "FP6 E3M2 (OCP MX): MXFP6 element, 3 exponent bits, 2 mantissa bits",
                    "no inf, no NaN; overflow and ±inf saturate to ±28", None, "float6_e3m2fn"),
        FloatFormat("e2m1fn", 2, 1, "none", "saturate",
                    "FP4 E2M1 (OCP MX, NVIDIA): MXFP4 and NVFP4 element, 16 values ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}",
                    "no inf, no NaN; overflow and ±inf saturate to ±6 (torch stores pairs: float4_e2m1fn_x2)",
                    None, "float4_e2m1fn"),
    ]
}

#: The formats of the OCP Microscaling (MX) spec and NVFP4 (notebook 17): the E8M0 scale and the FP6/FP4 elements.
MICROSCALING_FORMATS: tuple[str, ...] = ("e8m0fnu", "e2m3fn", "e3m2fn", "e2m1fn")

#: FP4 E2M1's 16 values, in the order of their bit patterns 0x0 ... 0xF (the sign is the top bit).
FP4_E2M1_VALUES: tuple[float, ...] = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                                      -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)

_ALIASES = {
    "float64": "fp64", "double": "fp64", "binary64": "fp64",
    "float32": "fp32", "single": "fp32", "float": "fp32", "binary32": "fp32",
    "tensorfloat32": "tf32", "tensorfloat-32": "tf32",
    "float16": "fp16", "half": "fp16", "binary16": "fp16",
    "bfloat16": "bf16",
    "float8_e4m3fn": "e4m3fn", "fp8_e4m3fn": "e4m3fn", "fp8-e4m3fn": "e4m3fn", "fp8_e4m3": "e4m3fn",
    "e4m3": "e4m3fn", "fp8-e4m3": "e4m3fn",
    "float8_e5m2": "e5m2", "fp8_e5m2": "e5m2", "fp8-e5m2": "e5m2",
    "float8_e8m0fnu": "e8m0fnu", "e8m0": "e8m0fnu", "fp8_e8m0": "e8m0fnu", "ue8m0": "e8m0fnu",
    "float6_e2m3fn": "e2m3fn", "e2m3": "e2m3fn", "fp6_e2m3": "e2m3fn",
    "float6_e3m2fn": "e3m2fn", "e3m2": "e3m2fn", "fp6_e3m2": "e3m2fn",
    "float4_e2m1fn": "e2m1fn", "e2m1": "e2m1fn", "fp4_e2m1": "e2m1fn", "fp4": "e2m1fn",
}


def get_format(fmt: FloatFormat | str) -> FloatFormat:
    """Return the FloatFormat for a name such as "fp16", "bfloat16" or "float8_e4m3fn" (or a FloatFormat).

    Raises ``ValueError`` for an unknown name and ``TypeError`` for anything but a str or FloatFormat.
    Introduced in notebook 01.
    """
    if isinstance(fmt, FloatFormat):
        return fmt
    if not isinstance(fmt, str):
        raise TypeError(f"format must be a name such as 'fp16' or a FloatFormat, got {type(fmt).__name__}")
    key = fmt.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in FORMATS:
        raise ValueError(f"unknown float format {safe_repr(fmt)}; known formats: {', '.join(FORMATS)}")
    return FORMATS[key]


def _check_bits(bits: object, f: FloatFormat) -> int:
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)):
        raise TypeError(f"bits must be an int bit pattern, got {type(bits).__name__}")
    bits = int(bits)
    if not 0 <= bits < (1 << f.total_bits):
        raise ValueError(f"bit pattern {bits:#x} does not fit {f.name} ({f.total_bits} bits: 0 to "
                         f"{(1 << f.total_bits) - 1:#x})")
    return bits


def _check_overflow(overflow: str | None, f: FloatFormat) -> str:
    if overflow is None:
        return f.overflow
    if not isinstance(overflow, str):
        raise TypeError(f"overflow must be one of {OVERFLOW_RULES} or None, got {type(overflow).__name__}")
    if overflow not in OVERFLOW_RULES:
        raise ValueError(f"overflow must be one of {OVERFLOW_RULES} or None, got {safe_repr(overflow)}")
    if overflow == "inf" and not f.has_inf:
        raise ValueError(f"{f.name} has no infinity; use overflow='nan' or 'saturate'"
                         if f.has_nan else f"{f.name} has no infinity; use overflow='saturate'")
    if overflow == "nan" and not f.has_nan:
        raise ValueError(f"{f.name} has no NaN; use overflow='saturate'")
    return overflow


def _split(bits: int, f: FloatFormat) -> tuple[int, int, int]:
    sign = bits >> (f.total_bits - 1) if f.signed else 0
    return sign, (bits >> f.man_bits) & ((1 << f.exp_bits) - 1), bits & ((1 << f.man_bits) - 1)


def _kind(e: int, m: int, f: FloatFormat) -> str:
    top = (1 << f.exp_bits) - 1
    if f.nan_style == "ieee" and e == top:
        return "inf" if m == 0 else "nan"
    if f.nan_style == "fn" and e == top and m == (1 << f.man_bits) - 1:
        return "nan"  # E4M3FN: S.1111.111; E8M0 (no mantissa): 0xFF
    if e == 0 and f.has_subnormals:
        return "zero" if m == 0 else "subnormal"
    return "normal"  # E8M0's exponent field 0 is 2^-127, a number like any other


def decode(bits: int, fmt: FloatFormat | str, *, exact: bool = False) -> float | Fraction:
    """Return the value a bit pattern stands for in ``fmt``: a float, or a Fraction with ``exact=True``.

    Every value of these formats is exactly a Python float, so the float is exact too; ``exact=True``
    is for arithmetic on the value. Inf and NaN are returned as floats in both cases. E8M0's pattern E
    is 2^(E-127) (0xFF: NaN). Introduced in notebook 01.
    """
    f = get_format(fmt)
    bits = _check_bits(bits, f)
    if not isinstance(exact, bool):
        raise TypeError(f"exact must be True or False, got {type(exact).__name__}")
    s, e, m = _split(bits, f)
    kind = _kind(e, m, f)
    sign = -1 if s else 1
    if kind == "nan":
        return math.nan
    if kind == "inf":
        return sign * math.inf
    if kind in ("zero", "subnormal"):
        value = Fraction(m, 1 << f.man_bits) * Fraction(2) ** f.emin
    else:
        value = (1 + Fraction(m, 1 << f.man_bits)) * Fraction(2) ** (e - f.bias)
    if exact:
        return sign * value
    return math.copysign(float(value), -1.0 if s else 1.0)


def _to_fraction(x: object) -> Fraction | float:
    """Return x as an exact Fraction, or as a float when it is inf or NaN."""
    if isinstance(x, bool):
        raise TypeError("expected a real number, got bool")
    if isinstance(x, Fraction):
        return x
    if isinstance(x, (int, np.integer)):
        return Fraction(int(x))
    if isinstance(x, (float, np.floating)):
        xf = float(x)
        return xf if not math.isfinite(xf) else Fraction(xf)
    if isinstance(x, numbers.Rational):
        return Fraction(x.numerator, x.denominator)
    raise TypeError(f"expected a real number (int, float, Fraction or numpy scalar), got {type(x).__name__}")


def _round_half_even(q: Fraction) -> int:
    n, r = divmod(q.numerator, q.denominator)
    twice = 2 * r
    if twice > q.denominator or (twice == q.denominator and n % 2 == 1):
        n += 1
    return n


def encode(x: Number, fmt: FloatFormat | str, overflow: Overflow | None = None) -> int:
    """Round ``x`` to the nearest value of ``fmt`` (ties to even) and return its bit pattern as an int.

    Beyond ``max``, the overflow rule applies: "inf" (IEEE formats), "nan" (E4M3FN as in ml_dtypes) or
    "saturate" (clamp to ±max, as torch's E4M3FN cast does, also for ±inf). NaN becomes the canonical
    NaN with x's sign bit; signed zeros keep their sign. A format without NaN (FP6, FP4) raises
    ``ValueError`` for NaN. The unsigned E8M0 has no pattern for 0 or a negative number: they become its
    NaN, as in ml_dtypes. Introduced in notebook 01 (E8M0, FP6 and FP4 in notebook 17).
    """
    f = get_format(fmt)
    rule = _check_overflow(overflow, f)
    v = _to_fraction(x)
    if isinstance(v, float):  # inf or nan
        neg = math.copysign(1.0, v) < 0
        if math.isnan(v):
            if not f.has_nan:
                raise ValueError(f"{f.name} has no NaN pattern; NaN cannot be encoded (round_to keeps it as NaN)")
            return f.nan_bits | (f.sign_bit if neg else 0)
        if neg and not f.signed:
            return f.nan_bits  # -inf: E8M0 has no negative numbers
        return _overflow_bits(neg, f, rule)
    neg = v < 0 or (v == 0 and isinstance(x, (float, np.floating)) and math.copysign(1.0, float(x)) < 0)
    a = abs(v)
    if not f.signed and (neg or a == 0):
        return f.nan_bits  # E8M0 has no zero and no negative numbers
    s = f.sign_bit if neg else 0
    if a == 0:
        return s
    if not f.has_subnormals and a < f.smallest_normal:
        return s  # E8M0: no zero below its smallest value 2^-127, which is therefore the nearest
    e = a.numerator.bit_length() - a.denominator.bit_length()  # floor(log2 a) or one more
    if Fraction(2) ** e > a:
        e -= 1
    e = max(e, f.emin)  # below emin, the quantum stays that of the subnormals
    quantum = Fraction(2) ** (e - f.man_bits)
    m = _round_half_even(a / quantum)
    if m == 1 << (f.man_bits + 1):  # rounding carried into the next binade
        m >>= 1
        e += 1
    if m < (1 << f.man_bits):  # subnormal (or rounded to zero)
        return s | m
    if e > f.emax or (e == f.emax and m - (1 << f.man_bits) > f.max_mantissa):
        return _overflow_bits(neg, f, rule)
    return s | ((e + f.bias) << f.man_bits) | (m - (1 << f.man_bits))


def _overflow_bits(neg: bool, f: FloatFormat, rule: str) -> int:
    s = f.sign_bit if neg else 0
    if rule == "inf":
        return s | f.inf_bits  # type: ignore[operator]
    if rule == "nan":
        return s | f.nan_bits
    return s | f.max_bits


def round_to(x: Number, fmt: FloatFormat | str, overflow: Overflow | None = None) -> float:
    """Return ``x`` rounded to ``fmt`` (RNE, the format's overflow rule), as a float.

    NaN stays NaN, also for FP6 and FP4, which have no pattern for it (``encode`` refuses it there).
    Introduced in notebook 01.
    """
    f = get_format(fmt)
    rule = _check_overflow(overflow, f)
    if not f.has_nan and isinstance(x, (float, np.floating)) and math.isnan(x):
        return math.nan
    return float(decode(encode(x, f, rule), f))


class Fields(NamedTuple):
    """The fields of one encoded value, with what each means.

    Introduced in notebook 01.
    """

    format: str
    bits: int
    sign: int
    exponent: int
    mantissa: int
    kind: str
    unbiased_exponent: int | None
    value: float

    @property
    def bitstring(self) -> str:
        """The bits as "s|eeeee|mmmmmmmmmm" (E8M0, no sign and no mantissa: "eeeeeeee")."""
        f = get_format(self.format)
        parts = [str(self.sign)] if f.signed else []
        parts.append(f"{self.exponent:0{f.exp_bits}b}")
        if f.man_bits:
            parts.append(f"{self.mantissa:0{f.man_bits}b}")
        return "|".join(parts)

    @property
    def meaning(self) -> str:
        """The value written out: (-1)^s × 2^(e-bias) × 1.mmm (or 0.mmm for subnormals; E8M0: 2^(e-bias))."""
        f = get_format(self.format)
        mbits = f"{self.mantissa:0{f.man_bits}b}"
        if self.kind in ("nan", "inf"):
            return {"nan": "NaN", "inf": ("-" if self.sign else "+") + "inf"}[self.kind]
        if not f.man_bits:
            return f"2^({self.exponent}-{f.bias}) = {_fmt_exact(self.value)}"
        lead = "1" if self.kind == "normal" else "0"
        e = self.exponent if self.kind == "normal" else 1
        return (f"(-1)^{self.sign} × 2^({e}-{f.bias}) × {lead}.{mbits}b = {_fmt_exact(self.value)}")


def _fmt_exact(v: float) -> str:
    """A value as its shortest round-trip repr (exact for these formats' values)."""
    if math.isnan(v) or math.isinf(v):
        return repr(v)
    if v == int(v) and abs(v) < 2**53:
        return str(int(v)) if v != 0 or math.copysign(1, v) > 0 else "-0"
    return repr(v)


def fields_from_bits(bits: int, fmt: FloatFormat | str) -> Fields:
    """Take a bit pattern apart into sign, exponent and mantissa, with kind and value.

    Introduced in notebook 01.
    """
    f = get_format(fmt)
    bits = _check_bits(bits, f)
    s, e, m = _split(bits, f)
    kind = _kind(e, m, f)
    unb = None if kind in ("nan", "inf") else (f.emin if e == 0 else e - f.bias)
    return Fields(f.name, bits, s, e, m, kind, unb, float(decode(bits, f)))


def fields(x: Number, fmt: FloatFormat | str, overflow: Overflow | None = None) -> Fields:
    """Encode ``x`` in ``fmt`` and return its sign, exponent and mantissa fields with their meaning.

    Introduced in notebook 01.
    """
    f = get_format(fmt)
    return fields_from_bits(encode(x, f, overflow), f)


def _step(bits: int, f: FloatFormat, up: bool) -> int:
    """The next pattern towards +inf (up) or -inf (down), on the finite values and infinities."""
    if not f.signed:  # E8M0: the patterns are in the order of the values
        nxt = bits + 1 if up else bits - 1
        if not 0 <= nxt <= f.max_bits:
            raise ValueError(f"no {f.name} value {'above' if up else 'below'} {decode(bits, f)}")
        return nxt
    sign_bit = 1 << (f.total_bits - 1)
    mag = bits & (sign_bit - 1)
    neg = bool(bits & sign_bit)
    if mag == 0:
        return 1 if up else sign_bit | 1
    away = up != neg  # moving away from zero
    mag = mag + 1 if away else mag - 1
    if away and mag > f.max_bits:
        if not f.has_inf:
            raise ValueError(f"no {f.name} value beyond ±max ({f.max})")
        mag = f.inf_bits  # type: ignore[assignment]
    return (sign_bit if neg and mag else 0) | mag


def next_up(x: Number, fmt: FloatFormat | str) -> float:
    """Return the smallest ``fmt`` value greater than ``x`` rounded to ``fmt``. Introduced in notebook 01."""
    f = get_format(fmt)
    b = encode(x, f)
    k = _kind(*_split(b, f)[1:], f)
    if k == "nan" or (k == "inf" and not (b >> (f.total_bits - 1))):
        raise ValueError(f"no {f.name} value above {decode(b, f)}")
    if k == "inf":
        return -f.max
    return float(decode(_step(b, f, True), f))


def next_down(x: Number, fmt: FloatFormat | str) -> float:
    """Return the largest ``fmt`` value less than ``x`` rounded to ``fmt``. Introduced in notebook 01."""
    f = get_format(fmt)
    if f.signed:
        return -next_up(-_to_fraction_or_raise(x), f)
    b = encode(x, f)  # E8M0: no negative values to mirror through
    if b == f.nan_bits:
        raise ValueError(f"no {f.name} value below NaN")
    return float(decode(_step(b, f, False), f))


def _to_fraction_or_raise(x: Number) -> Number:
    _to_fraction(x)
    return x


def ulp(x: Number, fmt: FloatFormat | str) -> float:
    """Return the unit in the last place at ``x``: the gap from |x| rounded to ``fmt`` to the next value up.

    For subnormals it is the smallest subnormal; at ``max`` it is the gap below max.
    Introduced in notebook 01.
    """
    f = get_format(fmt)
    v = abs(round_to(x, f))
    if math.isnan(v) or math.isinf(v):
        raise ValueError(f"ulp is defined for finite values; {safe_repr(x)} is not finite in {f.name}")
    if v >= f.max:
        return f.max - next_down(f.max, f)
    return next_up(v, f) - v


def neighbours(x: Number, fmt: FloatFormat | str) -> tuple[float | None, float, float | None]:
    """Return (the value below, ``x`` rounded to ``fmt``, the value above); None past the ends.

    Introduced in notebook 01.
    """
    f = get_format(fmt)
    v = round_to(x, f)
    if math.isnan(v):
        return (None, v, None)
    try:
        below: float | None = next_down(v, f)
    except ValueError:
        below = None
    try:
        above: float | None = next_up(v, f)
    except ValueError:
        above = None
    return (below, v, above)


# --- vectorised numpy versions --------------------------------------------------------------------

def _uint_dtype(f: FloatFormat) -> type:
    return {4: np.uint8, 6: np.uint8, 8: np.uint8, 16: np.uint16, 19: np.uint32, 32: np.uint32,
            64: np.uint64}[f.total_bits]


def decode_array(bits: np.ndarray, fmt: FloatFormat | str) -> np.ndarray:
    """Decode an array of bit patterns to float64 values (vectorised ``decode``).

    Introduced in notebook 01.
    """
    f = get_format(fmt)
    b = np.asarray(bits)
    if b.dtype.kind not in "ui":
        raise TypeError(f"bits must be an integer array, got dtype {b.dtype}")
    if f.name == "fp64":
        if b.dtype.kind == "i" and b.size and b.min() < 0:
            raise ValueError("fp64 bit patterns must be non-negative")
        return b.astype(np.uint64).view(np.float64).copy()
    b = b.astype(np.int64)
    if b.size and (b.min() < 0 or b.max() >= (1 << f.total_bits)):
        raise ValueError(f"bit patterns must lie in [0, {(1 << f.total_bits) - 1:#x}] for {f.name}")
    s = b >> (f.total_bits - 1) if f.signed else np.zeros_like(b)
    e = (b >> f.man_bits) & ((1 << f.exp_bits) - 1)
    m = b & ((1 << f.man_bits) - 1)
    frac = m.astype(np.float64) / (1 << f.man_bits)
    subnormal = (e == 0) & f.has_subnormals
    with np.errstate(over="ignore"):
        val = np.where(subnormal, np.ldexp(frac, f.emin), np.ldexp(1.0 + frac, (e - f.bias).astype(np.int32)))
    top = (1 << f.exp_bits) - 1
    if f.nan_style == "ieee":
        val = np.where((e == top) & (m == 0), np.inf, val)
        val = np.where((e == top) & (m != 0), np.nan, val)
    elif f.nan_style == "fn":
        val = np.where((e == top) & (m == (1 << f.man_bits) - 1), np.nan, val)
    return np.where(s == 1, -val, val)


def round_array(x: np.ndarray, fmt: FloatFormat | str, overflow: Overflow | None = None) -> np.ndarray:
    """Round every element of ``x`` to ``fmt`` (RNE, overflow rule) and return float64 values.

    This is how the workbook emulates TF32, FP8, FP6 and FP4 on any machine. NaN stays NaN (also for
    FP6/FP4, which have no pattern for it); for E8M0, 0 and negative numbers become NaN.
    Introduced in notebook 01.
    """
    f = get_format(fmt)
    rule = _check_overflow(overflow, f)
    a = np.asarray(x)
    if a.dtype.kind not in "fiu" or a.dtype.kind == "b":
        raise TypeError(f"x must be a real numeric array, got dtype {a.dtype}")
    a = a.astype(np.float64)
    if f.name == "fp64":
        return a.copy()
    mag = np.abs(a)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        _, e2 = np.frexp(mag)  # mag = fr * 2**e2, fr in [0.5, 1)
        e = np.maximum(e2.astype(np.int64) - 1, f.emin)
        q = np.ldexp(1.0, (e - f.man_bits).astype(np.int32))
        r = np.rint(mag / q) * q  # exact: mag/q only shifts the exponent; rint rounds ties to even
    over = r > f.max
    if rule == "inf":
        r = np.where(over, np.inf, r)
    elif rule == "nan":
        r = np.where(over, np.nan, r)
    else:
        r = np.where(over, f.max, r)
    r = np.where(np.isnan(a), np.nan, r)
    if rule == "saturate":
        r = np.where(np.isinf(a), f.max, r)
    if not f.signed:  # E8M0: nothing below its smallest value, no zero, no negative numbers
        r = np.where(mag < f.smallest_normal, f.smallest_normal, r)
        return np.where((a <= 0) | np.isnan(a), np.nan, r)
    return np.copysign(r, a)


def encode_array(x: np.ndarray, fmt: FloatFormat | str, overflow: Overflow | None = None) -> np.ndarray:
    """Encode every element of ``x`` to ``fmt`` bit patterns (vectorised ``encode``), as unsigned ints.

    Introduced in notebook 01.
    """
    f = get_format(fmt)
    a = np.asarray(x)
    if a.dtype.kind not in "fiu" or a.dtype.kind == "b":
        raise TypeError(f"x must be a real numeric array, got dtype {a.dtype}")
    r = round_array(a, f, overflow)
    if f.name == "fp64":
        return r.view(np.uint64).copy()
    if not f.has_nan and np.isnan(r).any():
        raise ValueError(f"{f.name} has no NaN pattern; x holds NaN, which cannot be encoded")
    neg = np.signbit(r)
    mag = np.abs(r)
    with np.errstate(divide="ignore", invalid="ignore"):
        _, e2 = np.frexp(mag)
        e = e2.astype(np.int64) - 1
        normal = mag >= f.smallest_normal
        m_norm = np.where(normal, np.ldexp(mag, (f.man_bits - e).astype(np.int32)) - (1 << f.man_bits), 0)
        m_sub = np.ldexp(mag, f.man_bits - f.emin)
    m = np.where(normal, m_norm, m_sub)
    m = np.nan_to_num(m, nan=0.0, posinf=0.0).astype(np.int64)
    ef = np.where(normal, e + f.bias, 0)
    bits = (ef << f.man_bits) | m
    if f.has_inf:
        bits = np.where(np.isinf(mag), f.inf_bits, bits)
    if f.has_nan:
        bits = np.where(np.isnan(mag), f.nan_bits, bits)
    bits = bits | np.where(neg, f.sign_bit, 0)
    return bits.astype(_uint_dtype(f))


def table(names: list[str] | None = None) -> str:
    """Return a fixed-width table of each format's bits, bias, max, smallest normal/subnormal and eps.

    ``names=None`` tabulates notebook 01's formats (FP64 to E5M2); name the microscaling formats
    (``MICROSCALING_FORMATS``) to see them, or pass ``list(FORMATS)`` for all. Introduced in notebook 01.
    """
    if names is not None and (isinstance(names, str) or not isinstance(names, (list, tuple))):
        raise TypeError(f"names must be a list of format names such as ['fp16', 'bf16'], or None, got {safe_repr(names)}")
    default = [n for n in FORMATS if n not in MICROSCALING_FORMATS]
    fs = [get_format(n) for n in (names or default)]

    def p2(v: float) -> str:
        k = math.frexp(v)[1] - 1
        return f"2^{k}" if math.ldexp(1.0, k) == v else f"{v:.6g}"

    rows = [("format", "s+e+m", "bias", "max", "min normal", "min subnormal", "eps", "digits")]
    for f in fs:
        rows.append((f.name, f"{int(f.signed)}+{f.exp_bits}+{f.man_bits}", str(f.bias), f"{f.max:.6g}",
                     p2(f.smallest_normal), p2(f.smallest_subnormal), p2(f.eps), f"{f.precision_digits:.1f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in rows)
