"""TF32 on any machine: round fp32 inputs to a 10-bit mantissa and measure what a matmul loses.

An NVIDIA tensor core in TF32 mode (Ampere and later) reads fp32 inputs, keeps their 8-bit exponent and
the top 10 of their 23 mantissa bits, multiplies exactly and accumulates in fp32. So TF32 is "fp16's
precision with fp32's range", and emulating it needs only one rounding step per input:

- :func:`round_mantissa` rounds an fp32 tensor to ``man_bits`` mantissa bits (round to nearest, ties to
  even) with integer arithmetic on the bit pattern; ``round_mantissa(x, 10)`` is TF32,
  ``round_mantissa(x, 7)`` is bf16. :func:`emulate` does it by format name (fp16 uses the real cast).
  ``tests/test_tf32.py`` checks both against ``labkit.formats.round_array`` and torch's bf16 cast.
- :func:`input_rounding_error` measures the relative error (Frobenius norm) of a matmul whose inputs were
  rounded to a format, products and sums in fp64: deterministic on every machine.
- :func:`matmul_error` measures a *real* matmul in a torch dtype on this device against fp64; it
  includes the kernel's accumulation and output rounding, so its digits depend on the machine.
- :func:`time_tf32` times fp32, TF32 and bf16 matmuls in one run on a CUDA GPU with TF32 hardware, and
  returns ``None`` everywhere else (a CPU has no TF32 units).

Hardware may round a fp32 input to TF32 differently (some kernels truncate); the error is of the same
size. Introduced in notebook 05.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from labkit import device as dev_gate
from labkit._validate import check_dense, safe_repr

__all__ = [
    "EMULATED_FORMATS",
    "emulate",
    "input_rounding_error",
    "matmul_error",
    "round_mantissa",
    "tf32_matmul",
    "time_tf32",
]

#: Formats :func:`emulate` accepts, with their explicit mantissa bits.
EMULATED_FORMATS: dict[str, int] = {"fp32": 23, "tf32": 10, "fp16": 10, "bf16": 7}


def _check_fp32(x: Any) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(x).__name__}")
    check_dense("the tensor", x)
    if x.dtype != torch.float32:
        raise TypeError(f"expected a float32 tensor (TF32 rounds fp32 inputs), got {x.dtype}")
    return x


def _check_matrices(a: Any, b: Any) -> None:
    _check_fp32(a), _check_fp32(b)
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"expected matrices (m, k) and (k, n), got {tuple(a.shape)} and {tuple(b.shape)}")


def round_mantissa(x: torch.Tensor, man_bits: int) -> torch.Tensor:
    """Round a float32 tensor to ``man_bits`` explicit mantissa bits (RNE), keeping fp32's exponent range.

    Works on the bit pattern: add half a unit of the last kept bit (minus one, plus the kept bit's
    parity, which makes ties go to even), then clear the dropped bits. A carry may ripple into the
    exponent, which is exactly right (1.111…1 rounds up to 2.0); past fp32's maximum it gives inf.
    NaN and inf pass through. Introduced in notebook 05.
    """
    x = _check_fp32(x)
    if isinstance(man_bits, bool) or not isinstance(man_bits, int) or not 0 <= man_bits <= 23:
        raise ValueError(f"man_bits must be an int in [0, 23], got {safe_repr(man_bits)}")
    if man_bits == 23:
        return x.clone()
    drop = 23 - man_bits
    bits = x.contiguous().view(torch.int32)
    lsb = (bits >> drop) & 1
    rounded = (bits + ((1 << (drop - 1)) - 1) + lsb) & ~((1 << drop) - 1)
    out = rounded.view(torch.float32)
    return torch.where(torch.isfinite(x), out, x)


def emulate(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """Return fp32 tensor ``x`` rounded to ``fmt`` ("fp32", "tf32", "bf16", "fp16"), still stored as fp32.

    tf32 and bf16 use :func:`round_mantissa` (fp32's range); fp16 uses torch's real cast, so values
    beyond 65504 become inf and tiny ones flush to zero. Introduced in notebook 05.
    """
    x = _check_fp32(x)
    if fmt not in EMULATED_FORMATS:
        raise ValueError(f"fmt must be one of {list(EMULATED_FORMATS)}, got {safe_repr(fmt)}")
    if fmt == "fp16":
        return x.half().float()
    return round_mantissa(x, EMULATED_FORMATS[fmt])


def tf32_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Multiply fp32 matrices the way a TF32 tensor core does: inputs rounded to TF32, fp32 accumulation.

    Introduced in notebook 05.
    """
    _check_matrices(a, b)
    return emulate(a, "tf32") @ emulate(b, "tf32")


def _rel(c: torch.Tensor, ref: torch.Tensor) -> float:
    return float(torch.linalg.norm(c.double() - ref) / torch.linalg.norm(ref))


def input_rounding_error(a: torch.Tensor, b: torch.Tensor, fmt: str) -> float:
    """Return ``||round(a) @ round(b) - a @ b||_F / ||a @ b||_F`` with inputs rounded to ``fmt``, sums in fp64.

    Only the input rounding counts here, so the figure is the same on every machine (inf if fp16
    overflows). Introduced in notebook 05.
    """
    _check_matrices(a, b)
    ref = a.double() @ b.double()
    c = emulate(a, fmt).double() @ emulate(b, fmt).double()
    return _rel(c, ref) if bool(torch.isfinite(c).all()) else math.inf


def matmul_error(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype = torch.float32) -> float:
    """Return the relative error (Frobenius) of a real ``a @ b`` computed in ``dtype`` on ``a``'s device vs fp64.

    The kernel's accumulation order and output rounding are included, so the value depends on the
    machine (and, for fp32, on ``float32_matmul_precision``). Introduced in notebook 05.
    """
    _check_matrices(a, b)
    if not isinstance(dtype, torch.dtype) or dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"dtype must be torch.float32, torch.bfloat16 or torch.float16, got {safe_repr(dtype)}")
    ref = a.double().cpu() @ b.double().cpu()
    c = (a.to(dtype) @ b.to(dtype)).cpu()
    return _rel(c, ref)


def time_tf32(
    n: int = 4096, device: torch.device | str | None = None, warmup: int = 3, repeats: int = 10
) -> Any:
    """Time an n x n matmul in fp32, TF32 and bf16 in one interleaved run on a CUDA GPU; ``None`` elsewhere.

    Needs compute capability >= 8.0 (TF32 tensor cores). Returns a ``labkit.bench.Comparison`` with fp32
    as the baseline; the matmul precision is restored afterwards. Introduced in notebook 05.
    """
    from labkit import bench

    dev = dev_gate.resolve(device)
    caps = dev_gate.capabilities(dev)
    if caps.device_type != "cuda" or caps.cuda_capability is None or caps.cuda_capability < (8, 0):
        return None
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=g).to(dev), torch.randn(n, n, generator=g).to(dev)
    a16, b16 = a.bfloat16(), b.bfloat16()
    before = dev_gate.fp32_matmul_settings()

    def with_precision(p: str) -> Any:
        def run() -> torch.Tensor:
            dev_gate.set_float32_matmul_precision(p)
            return a @ b
        return run

    try:
        cmp = bench.compare({"fp32": with_precision("highest"), "tf32": with_precision("high"),
                             "bf16": lambda: a16 @ b16}, baseline="fp32", warmup=warmup, repeats=repeats, device=dev)
    finally:
        prev = before["float32_matmul_precision"]
        dev_gate.set_float32_matmul_precision(prev if prev in ("highest", "high", "medium") else "highest")
    cmp.extra["n"] = n
    cmp.extra["flops"] = 2 * n**3
    return cmp
