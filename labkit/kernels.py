"""Fused kernels in Triton: the mode (interpreter or compiled), the launchers, and their unfused torch twins.

Triton decides when it *decorates* a kernel (``@triton.jit``) whether the kernel is compiled for a GPU or run by
its interpreter, from ``$TRITON_INTERPRET``. :func:`setup` asks the device gate (:mod:`labkit.device`) and sets
that variable before any kernel is defined: compiled on a CUDA GPU, interpreted on the CPU everywhere else. The
reference kernels live in ``labkit/_triton_kernels.py`` and are decorated by :func:`load`, after :func:`setup`.

Launchers (:func:`bias_gelu`, :func:`softmax`, :func:`layernorm`, :func:`adamw_step`, :func:`flash_attention`)
allocate the outputs, choose the grid and launch a kernel: the reference one, or any kernel with the same
signature (``kernel=``), which is how the exercises run a learner's kernel. Each has an unfused torch twin
(``*_unfused``), the op-by-op sequence a fused kernel replaces.

The bytes they move are counted in :mod:`labkit.traffic`. Introduced in notebook 08.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import os
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from labkit import device as dev_gate
from labkit import precision
from labkit._validate import as_float, check_dense, safe_repr
from labkit.i18n import gettext as _
from labkit.i18n import tidy

__all__ = [
    "FlashAttention",
    "INTERPRETER_MATMUL_CONFIG",
    "KernelRef",
    "LayerNorm",
    "MATMUL_CONFIGS",
    "MAX_ROW_BLOCK",
    "Mode",
    "adamw_step",
    "adamw_torch",
    "adamw_unfused",
    "as_kernel",
    "attention_tolerance",
    "bias_gelu",
    "bias_gelu_unfused",
    "cast",
    "close",
    "flash_attention",
    "flash_attention_bwd",
    "flash_attention_fwd",
    "flash_attention_unfused",
    "install_hint",
    "kernel_sum",
    "layernorm",
    "layernorm_bwd",
    "layernorm_unfused",
    "load",
    "matmul",
    "matmul_close",
    "matmul_configs",
    "mode",
    "randn",
    "setup",
    "softmax",
    "softmax_looped",
    "softmax_unfused",
    "source",
    "tolerance",
    "triton_available",
]

_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_TORCH_DTYPES = (*_FLOAT_DTYPES, torch.float64)  # the torch twins also compute float64 references
_MODE: Mode | None = None


# ---------------------------------------------------------------------------------------------------------------
# the mode: interpreter on the CPU, compiled on a CUDA GPU
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mode:
    """How Triton runs kernels in this process: ``name`` is "interpreter" or "compiled", on ``device``.

    Introduced in notebook 08.
    """

    name: str
    device: torch.device
    reason: str

    @property
    def interpreted(self) -> bool:
        """True when kernels run in Triton's interpreter (NumPy on the CPU, one program after another)."""
        return self.name == "interpreter"

    def __str__(self) -> str:
        if self.interpreted:
            return _("Triton mode: interpreter (TRITON_INTERPRET=1), because {reason}. Every program of a kernel "
                     "runs one after another as NumPy code on the CPU: right answers, meaningless timings.").format(
                         reason=self.reason)
        return _("Triton mode: compiled, because {reason}. Kernels are compiled to GPU code on first launch.").format(
            reason=self.reason)


def triton_available() -> bool:
    """Say whether the ``triton`` package can be imported here (it is the ``kernels`` extra). Introduced in notebook 08."""
    return importlib.util.find_spec("triton") is not None


def install_hint() -> str:
    """Return how to install Triton for notebook 08 (the ``kernels`` extra), without a CUDA torch.

    Introduced in notebook 08.
    """
    return tidy(" ".join((
        _("Triton is not installed."),
        _("`make lab` installs it; in this workbook's environment run  pip install -e '.[kernels]'  (or  pip install "
          "triton==3.7.1 , the version torch 2.13.0's CUDA build requires; triton has no dependencies, so the torch "
          "build you have stays)."),
        _("Triton ships wheels for Linux only; on macOS or Windows use a Linux machine, WSL or a container."))))


def _env_forces_interpreter() -> bool:
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes")


def setup(device: torch.device | str | None = None) -> Mode:
    """Choose how Triton runs here, from the device gate, and set ``$TRITON_INTERPRET`` before any kernel exists.

    A CUDA device (``device``, or what :func:`labkit.device.pick_device` picks) gets compiled kernels, unless
    ``$TRITON_INTERPRET=1`` was set by hand; anything else (CPU, MPS) gets the interpreter on the CPU. The choice
    holds for the whole process: ``@triton.jit`` reads the variable when it decorates, so call this first, in the
    imports cell, before ``import triton`` (if triton.language was imported already, its own jit functions are
    decorated again for the chosen mode). Calling again with a device that would change the choice raises
    ``ValueError`` (restart the kernel instead). Raises ``ModuleNotFoundError`` with :func:`install_hint` when
    Triton is missing. Introduced in notebook 08.
    """
    global _MODE
    dev = dev_gate.resolve(device)
    if dev.type == "cuda" and not _env_forces_interpreter():
        want = Mode("compiled", dev, _("the device gate picked {device} ({gpu})").format(device=dev,
                                                                                       gpu=_cuda_name(dev)))
    elif dev.type == "cuda":
        want = Mode("interpreter", torch.device("cpu"), _("TRITON_INTERPRET=1 was set by hand (a GPU is present)"))
    else:
        want = Mode("interpreter", torch.device("cpu"),
                    _("the device gate picked {device}: no CUDA GPU for Triton").format(device=dev))
    if _MODE is not None:
        if _MODE.name != want.name:
            raise ValueError(f"Triton already runs {_MODE.name} in this process ({_MODE.reason}); a {want.name} "
                             "mode needs a fresh process (restart the kernel)")
        return _MODE
    if not triton_available():
        raise ModuleNotFoundError(install_hint())
    if want.interpreted:
        os.environ["TRITON_INTERPRET"] = "1"
    _align_triton_language(want.interpreted)
    _MODE = want
    return want


def _align_triton_language(interpreted: bool) -> None:
    """Re-decorate triton.language's own jit functions (``tl.max``, ``tl.sum``, ``tl.rand`` ...) if triton was
    imported before the mode was set: they were decorated then, for the other mode, and an interpreted kernel
    calling a compiled-mode ``tl.max`` fails ("Cannot call @triton.jit'd outside of the scope of a kernel")."""
    import sys

    lang = sys.modules.get("triton.language")
    if lang is None or _is_interpreted(lang.standard.max) == interpreted:
        return
    for name in ("triton.language.standard", "triton.language.random", "triton.language"):
        importlib.reload(sys.modules[name])


def _cuda_name(dev: torch.device) -> str:
    props = dev_gate.cuda_properties(dev) or {}
    cc = props.get("capability")
    return f"{props.get('name', 'CUDA GPU')}, sm{cc[0]}{cc[1]}" if cc else str(props.get("name", "CUDA GPU"))


def mode() -> Mode:
    """Return the mode :func:`setup` chose (calling it with the picked device if it has not run yet).

    Introduced in notebook 08.
    """
    return _MODE if _MODE is not None else setup()


def load() -> ModuleType:
    """Return the module of reference kernels, decorated in this process's mode (:func:`setup` first).

    ``bias_gelu_kernel``, ``softmax_kernel``, ``layernorm_kernel``, ``adamw_kernel``, ``flash_attention_kernel``,
    ``cast_kernel`` and ``sum_kernel``. If the module was imported earlier under the other mode, it is imported
    again so that its kernels match. Introduced in notebook 08.
    """
    m = mode()
    mod = importlib.import_module("labkit._triton_kernels")
    if _is_interpreted(mod.softmax_kernel) != m.interpreted:
        mod = importlib.reload(mod)
    return mod


def _is_interpreted(kernel: Any) -> bool:
    return type(kernel).__name__ == "InterpretedFunction"


def _is_jitted(obj: Any) -> bool:
    return type(obj).__name__ in ("InterpretedFunction", "JITFunction") and callable(getattr(obj, "fn", None))


class KernelRef:
    """A reference, by name, to a kernel of ``labkit/_triton_kernels.py``, resolved only when it is launched.

    The exercises name their reference answers and typical mistakes this way, so that importing the exercise
    registry neither needs Triton nor fixes its mode. Introduced in notebook 08.
    """

    def __init__(self, name: str) -> None:
        if not isinstance(name, str):
            raise TypeError(f"name must be a str naming a kernel of labkit._triton_kernels, got {type(name).__name__}")
        if not name.isidentifier():
            raise ValueError(f"name must be a Python identifier, got {safe_repr(name)}")
        self.name = name

    def resolve(self) -> Any:
        """Return the decorated kernel (imports Triton, in the mode of :func:`mode`)."""
        kernel = getattr(load(), self.name, None)
        if not _is_jitted(kernel):
            raise ValueError(f"labkit._triton_kernels has no kernel named {safe_repr(self.name)}")
        return kernel

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"{self.name} is a Triton kernel: launch it as kernel[grid](...), or through a launcher "
                        "such as labkit.kernels.softmax(x, kernel=...)")

    def __repr__(self) -> str:
        return f"KernelRef({self.name!r})"


_JIT_CACHE: dict[Any, Any] = {}


def as_kernel(obj: Any) -> Any:
    """Return ``obj`` as a launchable Triton kernel of this process's mode.

    Accepts a ``@triton.jit`` kernel, a :class:`KernelRef`, or a plain function written as a kernel (it is
    decorated here). A kernel decorated before :func:`setup` chose the mode raises ``ValueError`` (run the
    imports cell first, then redefine it). Introduced in notebook 08.
    """
    if isinstance(obj, KernelRef):
        return obj.resolve()
    if _is_jitted(obj):
        if _is_interpreted(obj) != mode().interpreted:
            raise ValueError(f"{obj.fn.__name__} was decorated for the "
                             f"{'interpreter' if _is_interpreted(obj) else 'GPU'}, but Triton runs "
                             f"{mode().name} here: run kernels.setup() before defining kernels, then redefine it")
        return obj
    if inspect.isfunction(obj):
        mode()
        if obj not in _JIT_CACHE:
            import triton

            _JIT_CACHE[obj] = triton.jit(obj)
        return _JIT_CACHE[obj]
    raise TypeError(f"expected a @triton.jit kernel (or a KernelRef), got {type(obj).__name__}")


def source(obj: Any) -> str:
    """Return the source code of a kernel (decorator included) or of a Python function, for a notebook to print.

    Introduced in notebook 08.
    """
    if isinstance(obj, KernelRef):
        obj = obj.resolve()
    fn = obj.fn if _is_jitted(obj) else obj
    if not (inspect.isfunction(fn) or inspect.isclass(fn) or inspect.ismethod(fn)):
        raise TypeError(f"expected a kernel, a function or a class, got {type(obj).__name__}")
    return textwrap.dedent(inspect.getsource(fn))


# ---------------------------------------------------------------------------------------------------------------
# inputs and tolerances
# ---------------------------------------------------------------------------------------------------------------


def _dtype(dtype: Any) -> torch.dtype:
    allowed = (torch.float32, torch.bfloat16, torch.float16)
    if isinstance(dtype, str):
        try:
            dt = precision.dtype(dtype)
        except (KeyError, ValueError):
            dt = None
        if dt not in allowed:
            raise ValueError(f"dtype must be fp32, bf16 or fp16 (a name or a torch dtype), got {safe_repr(dtype)}")
        return dt
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype or a name such as 'bf16', got {type(dtype).__name__}")
    if dtype not in _FLOAT_DTYPES:
        raise ValueError(f"the kernels take float32, bfloat16 or float16, got {dtype}")
    return dtype


def _posint(name: str, v: Any, low: int = 1, high: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if v < low:
        raise ValueError(f"{name} must be >= {low}, got {safe_repr(v)}")
    if high is not None and v > high:
        raise ValueError(f"{name} must be at most {high:,}, got {safe_repr(v)}")
    return v


def _number(name: str, v: Any, low: float | None = None, high: float | None = None) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(v).__name__}")
    if not math.isfinite(as_float(name, v)) or (low is not None and v < low) or (high is not None and v > high):
        raise ValueError(f"{name} must be a finite number in [{low}, {high}], got {safe_repr(v)}")
    return float(v)


def randn(*shape: int, seed: int = 0, scale: float = 1.0, shift: float = 0.0, dtype: Any = "fp32",
          device: torch.device | str | None = None) -> torch.Tensor:
    """Return ``shift + scale * N(0, 1)`` samples of ``shape``, the same bits on every machine.

    Drawn by NumPy's generator (torch's CPU ``randn`` differs between CPU classes), then cast to ``dtype`` and
    moved to ``device`` (default: the mode's device). Introduced in notebook 08.
    """
    if not shape or len(shape) > 4:
        raise ValueError(f"give 1 to 4 dimensions, got {safe_repr(shape)}")
    dims = tuple(_posint("shape", s) for s in shape)
    if math.prod(dims) > 2**28:
        raise ValueError(f"{dims} holds more than 2**28 elements")
    seed = _posint("seed", seed, 0)
    scale, shift = _number("scale", scale), _number("shift", shift)
    dt = _dtype(dtype)
    dev = mode().device if device is None else dev_gate.resolve(device)
    x = np.random.default_rng(seed).standard_normal(dims, dtype=np.float32) * np.float32(scale) + np.float32(shift)
    return torch.from_numpy(x).to(device=dev, dtype=dt)


def tolerance(dtype: Any) -> tuple[float, float]:
    """Return ``(rtol, atol)`` for comparing a kernel's output in ``dtype`` with torch's float64 result.

    fp32: ``(1e-5, 1e-6)``, a few fp32 roundings apart (a kernel sums in another order than torch, and a GPU's
    ``tl.exp``, division and ``sqrt`` are fast approximations of a few ulp). bf16 / fp16 outputs: one unit in the
    last place of the format (``2**-7`` / ``2**-10`` relative) more, the single rounding when the kernel stores.
    The same on a CPU and a GPU for fp32 tiles (labkit's FlashAttention asks ``tl.dot`` for IEEE fp32, not TF32);
    its 16-bit tensor-core path on a GPU rounds more: :func:`attention_tolerance`.
    Introduced in notebook 08.
    """
    dt = _dtype(dtype)
    rtol, atol = 1e-5, 1e-6
    if dt == torch.bfloat16:
        rtol += 2.0**-7
    elif dt == torch.float16:
        rtol += 2.0**-10
    return rtol, atol


def attention_tolerance(v: torch.Tensor, compiled: bool | None = None) -> tuple[float, float]:
    """Return ``(rtol, atol)`` for comparing :func:`flash_attention` on ``v``'s dtype with torch's float64 result.

    The tiles are fp32 (in the interpreter, and for fp32 inputs): :func:`tolerance`. Compiled for a GPU with
    bf16/fp16 inputs, the kernel rounds each probability tile P to the 16-bit format before ``P @ V`` (the tensor
    cores' input), while the row sum ``l`` keeps the fp32 values. Each weight is then off by up to half an ulp,
    ``u = eps / 2`` of itself (``2**-8`` for bf16, 8 significant bits; ``2**-11`` for fp16, whose weights below
    ``2**-14`` are subnormal and err more, which matters only beyond some 10^4 keys), so the output
    ``sum(p v) / l`` is off by up to ``u * max|v|`` in absolute terms, however small the output itself:
    ``atol = 2 u max|v|`` (a factor 2 of margin) on top of :func:`tolerance`. ``compiled`` defaults to the mode :func:`setup` chose. Introduced in notebook 08.
    """
    check_dense("v", v)
    if not v.is_floating_point():
        raise TypeError(f"v must be a floating-point tensor, got {v.dtype}")
    if compiled is None:
        compiled = not mode().interpreted
    elif not isinstance(compiled, bool):
        raise TypeError(f"compiled must be True, False or None, got {type(compiled).__name__}")
    rtol, atol = tolerance(v.dtype)
    half_ulp = torch.finfo(v.dtype).eps / 2 if v.dtype in (torch.bfloat16, torch.float16) else None
    if compiled and half_ulp is not None and v.numel():
        atol += 2 * half_ulp * float(v.detach().abs().max())
    return rtol, atol


def close(got: torch.Tensor, want: torch.Tensor, dtype: Any = None,
          tol: tuple[float, float] | None = None) -> tuple[bool, float]:
    """Compare ``got`` with ``want`` (torch's fp32 result) within :func:`tolerance`; return ``(ok, worst)``.

    ``worst`` is the largest ``|got - want| / (atol + rtol * |want|)``: at most 1 passes. NaN or inf in ``got``
    fails. ``dtype`` (whose tolerance applies) defaults to ``got``'s; ``tol=(rtol, atol)`` replaces it (e.g.
    :func:`attention_tolerance`). Introduced in notebook 08.
    """
    if not isinstance(got, torch.Tensor) or not isinstance(want, torch.Tensor):
        raise TypeError("got and want must be tensors")
    for name, t in (("got", got), ("want", want)):
        check_dense(name, t)
    if got.shape != want.shape:
        raise ValueError(f"shapes differ: {tuple(got.shape)} vs {tuple(want.shape)}")
    if not (got.is_floating_point() and want.is_floating_point()):
        raise TypeError("got and want must be floating-point tensors")
    if tol is None:
        rtol, atol = tolerance(got.dtype if dtype is None else dtype)
    elif (not isinstance(tol, tuple) or len(tol) != 2 or not all(isinstance(t, (int, float)) for t in tol)
          or not all(math.isfinite(t) and t >= 0 for t in tol)):
        raise TypeError(f"tol must be a pair (rtol, atol) of finite numbers >= 0, got {safe_repr(tol)}")
    else:
        rtol, atol = (float(t) for t in tol)
    g, w = got.detach().double().cpu(), want.detach().double().cpu()
    if g.numel() == 0:
        return True, 0.0
    ratio = (g - w).abs() / (atol + rtol * w.abs())
    ratio = torch.where(torch.isfinite(g), ratio, torch.full_like(ratio, math.inf))
    worst = float(ratio.max())
    return bool(worst <= 1.0), worst


# ---------------------------------------------------------------------------------------------------------------
# launchers (and the unfused torch sequences they replace)
# ---------------------------------------------------------------------------------------------------------------


def _tensor(name: str, t: Any, ndim: int | None = None, dtypes: tuple[torch.dtype, ...] = _FLOAT_DTYPES) -> torch.Tensor:
    """``t`` checked (a contiguous, non-empty float tensor with ``ndim`` dims), detached: a kernel is no autograd op."""
    check_dense(name, t)
    if t.dim() == 0:
        raise ValueError(f"{name} must have at least one dimension")
    if t.dtype not in dtypes:
        raise ValueError(f"{name} must be one of {[str(d).replace('torch.', '') for d in dtypes]}, got {t.dtype}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    if t.numel() == 0:
        raise ValueError(f"{name} is empty")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (call .contiguous())")
    return t.detach()


def _on_mode_device(*ts: torch.Tensor) -> None:
    want = mode().device.type
    for t in ts:
        if t.device.type != want:
            raise ValueError(f"Triton runs {mode().name} here, so tensors must be on {want}, got one on {t.device}")


def _out(name: str, out: Any, like: torch.Tensor, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    shape = tuple(like.shape) if shape is None else shape
    if out is None:
        return torch.empty(shape, dtype=like.dtype, device=like.device)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != shape or out.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"{name} must be a float tensor of shape {shape}")
    if not out.is_contiguous() or out.device != like.device:
        raise ValueError(f"{name} must be contiguous and on {like.device}")
    return out


#: The longest row a one-block row kernel takes. A row lives in registers: with 16 warps (512 threads) a block of
#: 16384 fp32 values is 32 registers per thread per live copy (x, then exp(x - m)), well inside the 255 a thread
#: may have; 65536 would be 128 per copy and spill to local memory. Longer rows loop (notebook 16's
#: ``softmax_looped``).
MAX_ROW_BLOCK = 16384


def _row_block(n_cols: int) -> tuple[int, int]:
    if n_cols > MAX_ROW_BLOCK:
        raise ValueError(f"rows of up to {MAX_ROW_BLOCK} columns fit in one block (a longer row would spill its "
                         f"registers on a GPU), got {n_cols}: loop over the row instead (softmax_looped)")
    block = 1 << max(n_cols - 1, 0).bit_length()
    return block, 4 if block < 2048 else 8 if block < 8192 else 16


def _block(name: str, block: Any) -> int:
    b = _posint(name, block, 16)
    if b & (b - 1) or b > 2**16:
        raise ValueError(f"{name} must be a power of two from 16 to 65536, got {b}")
    return b


def bias_gelu(x: torch.Tensor, bias: torch.Tensor, *, kernel: Any = None, out: torch.Tensor | None = None,
              block: int = 1024) -> torch.Tensor:
    """Return ``gelu(x + bias)`` (exact, erf GELU) from one Triton kernel over a contiguous ``(rows, cols)`` x.

    One program per ``block`` elements: ``cdiv(x.numel(), block)`` programs, the last one masked.
    Introduced in notebook 08.
    """
    x, bias = _tensor("x", x, 2), _tensor("bias", bias, 1)
    if bias.shape[0] != x.shape[1]:
        raise ValueError(f"bias must have x.shape[1] = {x.shape[1]} elements, got {bias.shape[0]}")
    _on_mode_device(x, bias)
    block = _block("block", block)
    y = _out("out", out, x)
    k = as_kernel(load().bias_gelu_kernel if kernel is None else kernel)
    k[(math.ceil(x.numel() / block),)](x, bias, y, x.numel(), x.shape[1], BLOCK=block)
    return y


def bias_gelu_unfused(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``gelu(x + bias)`` as two torch ops, each a pass through memory. Introduced in notebook 08."""
    x, bias = _tensor("x", x, 2, _TORCH_DTYPES), _tensor("bias", bias, 1, _TORCH_DTYPES)
    if bias.shape[0] != x.shape[1]:
        raise ValueError(f"bias must have x.shape[1] = {x.shape[1]} elements, got {bias.shape[0]}")
    h = x + bias
    return F.gelu(h)


def softmax(x: torch.Tensor, *, kernel: Any = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Return the softmax over the last dim of a contiguous ``(rows, cols)`` x from one Triton kernel.

    One program per row, the whole row in one block of the next power of two >= cols.
    Introduced in notebook 08.
    """
    x = _tensor("x", x, 2)
    _on_mode_device(x)
    y = _out("out", out, x)
    block, warps = _row_block(x.shape[1])
    k = as_kernel(load().softmax_kernel if kernel is None else kernel)
    k[(x.shape[0],)](x, y, x.shape[1], x.stride(0), BLOCK=block, num_warps=warps)
    return y


def softmax_unfused(x: torch.Tensor) -> torch.Tensor:
    """The stable softmax over the last dim as five torch ops: max, subtract, exp, sum, divide.

    Introduced in notebook 08.
    """
    x = _tensor("x", x, None, _TORCH_DTYPES)
    m = x.amax(-1, keepdim=True)
    z = x - m
    e = z.exp()
    s = e.sum(-1, keepdim=True)
    return e / s


def layernorm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5, *, kernel: Any = None,
              out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return ``(y, mean, rstd)`` of LayerNorm over the last dim of a contiguous ``(rows, cols)`` x, one kernel.

    ``mean`` and ``rstd`` (1/std, fp32, one per row) are what ``torch.ops.aten.native_layer_norm`` also returns
    for the backward pass. Introduced in notebook 08.
    """
    dtypes = _TORCH_DTYPES if kernel is None else _FLOAT_DTYPES  # float64: labkit's kernel, for gradcheck
    x, weight, bias = _tensor("x", x, 2, dtypes), _tensor("weight", weight, 1, dtypes), _tensor("bias", bias, 1, dtypes)
    if weight.shape[0] != x.shape[1] or bias.shape[0] != x.shape[1]:
        raise ValueError(f"weight and bias must have x.shape[1] = {x.shape[1]} elements")
    eps = _number("eps", eps, 0.0, 1.0)
    _on_mode_device(x, weight, bias)
    y = _out("out", out, x) if x.dtype != torch.float64 else torch.empty_like(x)
    f64 = x.dtype == torch.float64
    # NaN until the kernel stores them: a kernel that forgets cannot inherit a previous launch's values
    mean = torch.full((x.shape[0],), math.nan, dtype=torch.float64 if f64 else torch.float32, device=x.device)
    rstd = torch.full_like(mean, math.nan)
    block, warps = _row_block(x.shape[1])
    k = as_kernel(load().layernorm_kernel if kernel is None else kernel)
    extra = {"CDT": _tl().float64} if f64 else {}
    k[(x.shape[0],)](x, weight, bias, y, mean, rstd, x.shape[1], x.stride(0), eps, BLOCK=block, num_warps=warps,
                     **extra)
    return y, mean, rstd


def layernorm_unfused(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """LayerNorm over the last dim written op by op: mean, subtract, square, mean, add eps, rsqrt, scale, shift.

    Introduced in notebook 08.
    """
    x, weight, bias = (_tensor(n, t, d, _TORCH_DTYPES) for n, t, d in (("x", x, None), ("weight", weight, 1),
                                                                        ("bias", bias, 1)))
    if weight.shape[0] != x.shape[-1] or bias.shape[0] != x.shape[-1]:
        raise ValueError(f"weight and bias must have x.shape[-1] = {x.shape[-1]} elements")
    eps = _number("eps", eps, 0.0, 1.0)
    mean = x.mean(-1, keepdim=True)
    xc = x - mean
    var = (xc * xc).mean(-1, keepdim=True)
    rstd = torch.rsqrt(var + eps)
    return xc * rstd * weight + bias


def _adamw_args(p: Any, g: Any, m: Any, v: Any, step: Any, lr: Any, betas: Any, eps: Any,
                weight_decay: Any, state_dtypes: tuple[torch.dtype, ...] = (torch.float32,)
                ) -> tuple[int, float, float, float, float, float]:
    for name, t in (("p", p), ("m", m), ("v", v), ("g", g)):
        _tensor(name, t, None, _TORCH_DTYPES if torch.float64 in state_dtypes else _FLOAT_DTYPES)
        if name != "g" and t.dtype not in state_dtypes:
            raise ValueError(f"{name} must be float32 (master weights and Adam moments), got {t.dtype}")
    if not (p.shape == g.shape == m.shape == v.shape):
        raise ValueError("p, g, m and v must have the same shape")
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise TypeError(f"betas must be a pair (beta1, beta2), got {safe_repr(betas)}")
    b1, b2 = (_number("beta", b, 0.0, 0.999999) for b in betas)
    # the step counter is a float (torch keeps it in fp32 or on the host): whole numbers up to 2**53 are exact
    return (_posint("step", step, 1, 2**53), _number("lr", lr, 0.0, 10.0), b1, b2, _number("eps", eps, 0.0, 1.0),
            _number("weight_decay", weight_decay, 0.0, 10.0))


def adamw_step(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, step: int, lr: float = 1e-3,
               betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2, *,
               kernel: Any = None, block: int = 1024) -> None:
    """Apply AdamW step number ``step`` (1, 2, ...) to ``p``, ``m``, ``v`` in place, in one kernel.

    The same arithmetic as ``torch.optim.AdamW`` (``foreach=False``): p, m, v are fp32; the gradient ``g`` may
    be bf16 (read once, converted in registers). Introduced in notebook 08.
    """
    step, lr, b1, b2, eps, wd = _adamw_args(p, g, m, v, step, lr, betas, eps, weight_decay)
    p, g, m, v = (t.detach() for t in (p, g, m, v))  # a Parameter is updated in place, outside autograd
    _on_mode_device(p, g, m, v)
    block = _block("block", block)
    k = as_kernel(load().adamw_kernel if kernel is None else kernel)
    n = p.numel()
    k[(math.ceil(n / block),)](p, g, m, v, n, lr, b1, b2, eps, wd, 1.0 - b1**step, math.sqrt(1.0 - b2**step),
                               BLOCK=block)


def adamw_torch(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, step: int, lr: float = 1e-3,
                betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2,
                impl: str = "single", capturable: bool = False) -> Callable[[], None]:
    """Return a function that applies the same AdamW step with ``torch.optim.AdamW`` to ``p``, ``m``, ``v`` in place.

    ``impl``: "single" (``foreach=False``: op by op, the unfused sequence), "foreach" or "fused" (``fused=True``:
    PyTorch's own fused kernel). The optimizer is built here with ``m``, ``v`` as its state at ``step - 1``, so
    the returned function is just ``optimizer.step()``: call it once. p, m, v may also be float64 (a reference).
    ``capturable=True`` (CUDA only) keeps the step counter on ``p``'s device, as CUDA graphs need (torch.compile
    would move a host counter there itself): no host-device copy inside the step. Introduced in notebook 08.
    """
    step, lr, b1, b2, eps, wd = _adamw_args(p, g, m, v, step, lr, betas, eps, weight_decay,
                                            (torch.float32, torch.float64))
    if impl not in ("single", "foreach", "fused"):
        raise ValueError(f"impl must be 'single', 'foreach' or 'fused', got {safe_repr(impl)}")
    param = torch.nn.Parameter(p, requires_grad=True)  # shares p's storage: the step updates p
    param.grad = g.to(p.dtype) if g.dtype != p.dtype else g
    flags = {"single": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}[impl]
    if not isinstance(capturable, bool):
        raise TypeError(f"capturable must be True or False, got {type(capturable).__name__}")
    if capturable and p.device.type != "cuda":
        raise ValueError(f"capturable=True keeps the step on a CUDA device; p is on {p.device}")
    if capturable:
        flags["capturable"] = True
    opt = torch.optim.AdamW([param], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd, **flags)
    # the step counter: fp32, as torch keeps it; on the host unless the step is fused or capturable
    on_device = impl == "fused" or capturable
    opt.state[param] = {"step": torch.tensor(float(step - 1), device=p.device if on_device else "cpu"),
                        "exp_avg": m, "exp_avg_sq": v}

    def run() -> None:
        opt.step()

    return run


def adamw_unfused(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, step: int, lr: float = 1e-3,
                  betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2) -> None:
    """One AdamW step with ``torch.optim.AdamW(foreach=False)``: torch's op-by-op sequence. In place.

    Introduced in notebook 08.
    """
    adamw_torch(p, g, m, v, step, lr, betas, eps, weight_decay, impl="single")()


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, *, kernel: Any = None,
                    out: torch.Tensor | None = None, block_m: int = 32, block_n: int = 32) -> torch.Tensor:
    """Return softmax(q k^T / sqrt(d)) v for ``(batch, heads, seq, d)`` tensors from one FlashAttention kernel.

    The grid is ``(cdiv(seq, block_m), batch * heads)``; each program walks K and V in tiles of ``block_n`` keys
    with an online softmax, so no (seq, seq) matrix is ever stored. ``d`` must be a power of two >= 16. Compiled
    for a GPU with bf16/fp16 inputs, labkit's kernel feeds ``tl.dot`` the 16-bit tiles (tensor cores, fp32
    accumulation); in the interpreter, or with a ``kernel`` of your own, the tiles are fp32.
    Introduced in notebook 08.
    """
    q, k, v = (_tensor(n, t, 4) for n, t in (("q", q), ("k", k), ("v", v)))
    if not (q.shape == k.shape == v.shape):
        raise ValueError(f"q, k and v must have the same shape, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be True or False, got {type(causal).__name__}")
    b, h, n, d = q.shape
    if d < 16 or d & (d - 1) or d > 256:
        raise ValueError(f"the head dim must be a power of two from 16 to 256, got {d}")
    bm, bn = _block("block_m", block_m), _block("block_n", block_n)
    _on_mode_device(q, k, v)
    o = _out("out", out, q)
    kern = as_kernel(load().flash_attention_kernel if kernel is None else kernel)
    extra = {}
    if kernel is None and not mode().interpreted and q.dtype in (torch.bfloat16, torch.float16):
        extra["DOT_16BIT"] = True  # the reference kernel's tensor-core path (a learner's kernel has no such flag)
    kern[(math.ceil(n / bm), b * h)](q, k, v, o, n, d**-0.5, BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=d, CAUSAL=causal,
                                     **extra)
    return o


def flash_attention_unfused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """Attention the textbook way: the (seq, seq) scores and probabilities go through memory.

    Introduced in notebook 08.
    """
    q, k, v = (_tensor(n, t, 4, _TORCH_DTYPES) for n, t in (("q", q), ("k", k), ("v", v)))
    if not (q.shape == k.shape == v.shape) or len({q.dtype, k.dtype, v.dtype}) != 1:
        raise ValueError("q, k and v must have the same shape and dtype")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be True or False, got {type(causal).__name__}")
    s = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    if causal:
        n = q.shape[-2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def cast(x: torch.Tensor, dtype: Any) -> torch.Tensor:
    """Return ``x`` converted to ``dtype`` by a Triton kernel (``.to(...)`` inside the kernel), for comparing casts.

    Introduced in notebook 08.
    """
    x = _tensor("x", x)
    dt = _dtype(dtype)
    _on_mode_device(x)
    y = torch.empty(x.shape, dtype=dt, device=x.device)
    load().cast_kernel[(math.ceil(x.numel() / 1024),)](x, y, x.numel(), BLOCK=1024)
    return y


def kernel_sum(x: torch.Tensor, upcast: bool = True) -> float:
    """Return the sum of a 1-D ``x`` (at most 4096 elements) computed by a Triton kernel's ``tl.sum``.

    ``upcast=True`` converts to fp32 first; ``False`` sums in ``x``'s own dtype. Introduced in notebook 08.
    """
    x = _tensor("x", x, 1)
    if not isinstance(upcast, bool):
        raise TypeError(f"upcast must be True or False, got {type(upcast).__name__}")
    if x.numel() > 4096:
        raise ValueError(f"at most 4096 elements (one block), got {x.numel()}")
    _on_mode_device(x)
    out = torch.zeros(1, dtype=torch.float32, device=x.device)
    block = 1 << max(x.numel() - 1, 15).bit_length()
    load().sum_kernel[(1,)](x, out, x.numel(), BLOCK=block, UPCAST=upcast)
    return float(out[0])


# ---------------------------------------------------------------------------------------------------------------
# notebook 16: tiled matmul, looped softmax, FlashAttention forward and backward, LayerNorm backward
# ---------------------------------------------------------------------------------------------------------------


def _tl() -> Any:
    import triton.language as tl

    return tl


def _cdt(dtype: torch.dtype) -> Any:
    """The arithmetic dtype of a kernel: float64 for float64 tensors (gradcheck), fp32 for everything else."""
    return _tl().float64 if dtype == torch.float64 else _tl().float32


#: What ``@triton.autotune`` tries for labkit's matmul on a GPU: tile sizes (each program computes a BLOCK_M x
#: BLOCK_N tile of C, BLOCK_K of the sum at a time), GROUP_M (tile-rows per group of the launch order),
#: ``num_warps`` (threads per program, /32) and ``num_stages`` (K tiles the compiler prefetches ahead into shared
#: memory). Sizes like those of Triton's matmul tutorial for sm80/sm90.
MATMUL_CONFIGS: tuple[dict[str, int], ...] = (
    {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 8, "num_stages": 3},
    {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 4},
    {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 4},
    {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4, "num_stages": 3},
)
#: The interpreter cannot time a configuration (it has no GPU driver), so there the autotuner gets this one only.
INTERPRETER_MATMUL_CONFIG: dict[str, int] = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4,
                                             "num_warps": 4, "num_stages": 1}


def matmul_configs() -> list[Any]:
    """Return the ``triton.Config`` list ``@triton.autotune`` tries for :func:`matmul` in this mode.

    Compiled: :data:`MATMUL_CONFIGS` (the autotuner times each on the first call per (M, N, K) and keeps the
    fastest). Interpreted: :data:`INTERPRETER_MATMUL_CONFIG` alone, since nothing can be timed there.
    Introduced in notebook 16.
    """
    import triton

    chosen = [INTERPRETER_MATMUL_CONFIG] if mode().interpreted else list(MATMUL_CONFIGS)
    return [triton.Config({k: c[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")},
                          num_warps=c["num_warps"], num_stages=c["num_stages"]) for c in chosen]


_TUNED: dict[str, Any] = {}


def matmul(a: torch.Tensor, b: torch.Tensor, *, kernel: Any = None, out: torch.Tensor | None = None,
           blocks: tuple[int, int, int] = (32, 32, 32), group_m: int = 4) -> torch.Tensor:
    """Return ``a @ b`` for 2-D ``a`` (M, K) and ``b`` (K, N), any strides, from one tiled Triton kernel.

    labkit's kernel runs under ``@triton.autotune`` (:func:`matmul_configs`); a ``kernel`` of your own is
    launched with ``blocks = (BLOCK_M, BLOCK_N, BLOCK_K)`` and ``group_m``. The grid is one program per tile of C.
    Introduced in notebook 16.
    """
    import triton

    for name, t in (("a", a), ("b", b)):
        check_dense(name, t)
        if t.dim() != 2 or t.dtype not in _FLOAT_DTYPES or t.numel() == 0:
            raise ValueError(f"{name} must be a non-empty 2-D float32/bfloat16/float16 tensor, got {tuple(t.shape)} "
                             f"{t.dtype}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"a is {tuple(a.shape)} and b is {tuple(b.shape)}: a.shape[1] must equal b.shape[0]")
    if a.dtype != b.dtype:  # compiled, tl.dot takes two 16-bit tiles of one type (bf16 x fp16 does not compile)
        raise ValueError(f"a and b must have the same dtype, got {a.dtype} and {b.dtype}")
    a, b = a.detach(), b.detach()
    _on_mode_device(a, b)
    (m, k_dim), n = a.shape, b.shape[1]
    c = _out("out", out, a, (m, n))
    args = (a, b, c, m, n, k_dim, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
    if kernel is None:
        if "matmul" not in _TUNED:
            _TUNED["matmul"] = triton.autotune(configs=matmul_configs(), key=["M", "N", "K"])(load().matmul_kernel)
        tuned = _TUNED["matmul"]
        grid = lambda meta: (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)  # noqa: E731
        tuned[grid](*args, DOT_16BIT=not mode().interpreted and a.dtype != torch.float32)
        return c
    if not (isinstance(blocks, tuple) and len(blocks) == 3):
        raise TypeError(f"blocks must be a tuple (BLOCK_M, BLOCK_N, BLOCK_K), got {safe_repr(blocks)}")
    bm, bn, bk = (_block("blocks", x) for x in blocks)
    gm = _posint("group_m", group_m)
    as_kernel(kernel)[(triton.cdiv(m, bm) * triton.cdiv(n, bn),)](*args, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                                                                  GROUP_M=gm)
    return c


def matmul_close(got: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> tuple[bool, float]:
    """Compare a kernel's ``a @ b`` with the float64 product within the bound of an fp32 accumulation.

    Per element: ``K * 2**-24 * (|a| @ |b|)`` (K roundings of fp32 sums, each at most half an ulp of a partial
    sum, which is at most ``(|a| @ |b|)``: the standard bound; relative to the result it would be meaningless
    where terms cancel), plus ``2**-7 * |a @ b|`` for a 16-bit output (its rounding when stored; the
    interpreter truncates, a full ulp) and ``1e-6``. Returns ``(ok, worst)`` as :func:`close`.
    Introduced in notebook 16.
    """
    for name, t in (("got", got), ("a", a), ("b", b)):
        check_dense(name, t)
        if t.dim() != 2:
            raise ValueError(f"{name} must be a matrix (2-D), got {t.dim()}-D of shape {tuple(t.shape)}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"a is {tuple(a.shape)} and b is {tuple(b.shape)}: a's columns must equal b's rows")
    a64, b64 = a.detach().double().cpu(), b.detach().double().cpu()
    want = a64 @ b64
    if tuple(got.shape) != tuple(want.shape):
        raise ValueError(f"got is {tuple(got.shape)}, a @ b is {tuple(want.shape)}")
    bound = a.shape[1] * 2.0**-24 * (a64.abs() @ b64.abs()) + 1e-6
    if got.dtype in (torch.bfloat16, torch.float16):
        bound = bound + 2.0**-7 * want.abs()
    g = got.detach().double().cpu()
    ratio = torch.where(torch.isfinite(g), (g - want).abs() / bound, torch.full_like(g, math.inf))
    worst = float(ratio.max())
    return worst <= 1.0, worst


def softmax_looped(x: torch.Tensor, *, kernel: Any = None, out: torch.Tensor | None = None,
                   block: int = 1024) -> torch.Tensor:
    """Return the softmax over the last dim of a contiguous ``(rows, cols)`` x, rows of any length.

    One program per row, ``block`` columns at a time: an online pass for the max and the sum, a pass that writes.
    Introduced in notebook 16.
    """
    x = _tensor("x", x, 2)
    _on_mode_device(x)
    y = _out("out", out, x)
    k = as_kernel(load().softmax_looped_kernel if kernel is None else kernel)
    k[(x.shape[0],)](x, y, x.shape[1], x.stride(0), BLOCK=_block("block", block))
    return y


def _qkv(q: Any, k: Any, v: Any) -> tuple[torch.Tensor, ...]:
    q, k, v = (_tensor(n, t, 4, _TORCH_DTYPES) for n, t in (("q", q), ("k", k), ("v", v)))
    if not (q.shape == k.shape == v.shape) or len({q.dtype, k.dtype, v.dtype}) != 1:
        raise ValueError(f"q, k and v must have the same shape and dtype, got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    d = q.shape[-1]
    if d < 16 or d & (d - 1) or d > 256:
        raise ValueError(f"the head dim must be a power of two from 16 to 256, got {d}")
    _on_mode_device(q, k, v)
    return q, k, v


def flash_attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, *,
                        block_m: int = 16, block_n: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(o, lse)``: attention of ``(batch, heads, seq, d)`` tensors and the logsumexp of each query row's
    scaled scores, ``(batch, heads, seq)``, from FlashAttention-2's forward kernel (exp2, causal stop at the
    diagonal). float64 inputs compute in float64 (for gradcheck). Introduced in notebook 16.
    """
    q, k, v = _qkv(q, k, v)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be True or False, got {type(causal).__name__}")
    b, h, n, d = q.shape
    bm, bn = _block("block_m", block_m), _block("block_n", block_n)
    o = torch.empty_like(q)
    lse = torch.empty((b, h, n), dtype=torch.float64 if q.dtype == torch.float64 else torch.float32, device=q.device)
    load().flash_fwd_kernel[(math.ceil(n / bm), b * h)](q, k, v, o, lse, n, d**-0.5, BLOCK_M=bm, BLOCK_N=bn,
                                                        HEAD_DIM=d, CAUSAL=causal, CDT=_cdt(q.dtype))
    return o, lse


def flash_attention_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                        do: torch.Tensor, causal: bool = False, *, kernel: Any = None, block_m: int = 16,
                        block_n: int = 16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return ``(dq, dk, dv)`` of attention from the forward's ``o`` and ``lse`` and the output gradient ``do``.

    ``delta = rowsum(do * o)`` is computed first (torch here; a small kernel in FlashAttention-2), then one
    program per (key block, head) recomputes P from ``lse`` tile by tile (``kernel``: the reference
    ``flash_bwd_kernel`` or yours, same signature). dq starts at zero: the programs add into it.
    Introduced in notebook 16.
    """
    q, k, v = _qkv(q, k, v)
    o, do = _tensor("o", o, 4, _TORCH_DTYPES), _tensor("do", do, 4, _TORCH_DTYPES)
    lse = _tensor("lse", lse, 3, (torch.float32, torch.float64))
    if o.shape != q.shape or do.shape != q.shape or lse.shape != q.shape[:3]:
        raise ValueError("o and do must be shaped like q, lse like q without its last dim")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be True or False, got {type(causal).__name__}")
    b, h, n, d = q.shape
    bm, bn = _block("block_m", block_m), _block("block_n", block_n)
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    delta = (do.to(cdt) * o.to(cdt)).sum(-1).contiguous()
    dq = torch.zeros(q.shape, dtype=cdt, device=q.device)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    kern = as_kernel(load().flash_bwd_kernel if kernel is None else kernel)
    kern[(math.ceil(n / bn), b * h)](q, k, v, do, lse, delta, dq, dk, dv, n, d**-0.5, BLOCK_M=bm, BLOCK_N=bn,
                                     HEAD_DIM=d, CAUSAL=causal, CDT=_cdt(q.dtype))
    return dq.to(q.dtype), dk, dv


class FlashAttention(torch.autograd.Function):
    """FlashAttention as an autograd op: the forward kernel saves O and the logsumexp, the backward kernel
    recomputes P from them. ``FlashAttention.apply(q, k, v, causal, block_m, block_n)``. Introduced in notebook 16.
    """

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                block_m: int = 16, block_n: int = 16) -> torch.Tensor:
        o, lse = flash_attention_fwd(q, k, v, causal, block_m=block_m, block_n=block_n)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.blocks = causal, (block_m, block_n)
        return o

    @staticmethod
    def backward(ctx: Any, do: torch.Tensor) -> tuple[Any, ...]:
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = flash_attention_bwd(q, k, v, o, lse, do.contiguous(), ctx.causal, block_m=ctx.blocks[0],
                                         block_n=ctx.blocks[1])
        return dq, dk, dv, None, None, None


def layernorm_bwd(x: torch.Tensor, weight: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor,
                  dy: torch.Tensor, groups: int = 4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return ``(dx, dweight, dbias)`` of LayerNorm from the forward's ``mean`` and ``rstd``, in two stages.

    Stage 1: ``groups`` programs, each over every ``groups``-th row: dx, and partial sums of dW and db in its own
    row of a ``(groups, cols)`` buffer (no address written twice, so no race). Stage 2: a column sum over the
    groups, in a fixed order. Introduced in notebook 16.
    """
    x, dy = _tensor("x", x, 2, _TORCH_DTYPES), _tensor("dy", dy, 2, _TORCH_DTYPES)
    weight = _tensor("weight", weight, 1, _TORCH_DTYPES)
    mean, rstd = _tensor("mean", mean, 1, (torch.float32, torch.float64)), _tensor("rstd", rstd, 1,
                                                                                  (torch.float32, torch.float64))
    rows, cols = x.shape
    if dy.shape != x.shape or weight.shape[0] != cols or mean.shape[0] != rows or rstd.shape[0] != rows:
        raise ValueError("dy must be shaped like x, weight have x.shape[1] elements, mean and rstd x.shape[0]")
    groups = _posint("groups", groups, 1, 1024)
    _on_mode_device(x, weight, mean, rstd, dy)
    cdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    block, warps = _row_block(cols)
    dx = torch.empty_like(x)
    dw_part = torch.zeros((groups, cols), dtype=cdt, device=x.device)
    db_part = torch.zeros_like(dw_part)
    K = load()
    K.layernorm_bwd_kernel[(groups,)](x, weight, mean, rstd, dy, dx, dw_part, db_part, rows, cols, x.stride(0),
                                      GROUPS=groups, BLOCK=block, CDT=_cdt(x.dtype), num_warps=warps)
    dw, db = torch.empty(cols, dtype=cdt, device=x.device), torch.empty(cols, dtype=cdt, device=x.device)
    for part, total in ((dw_part, dw), (db_part, db)):
        K.column_sum_kernel[(math.ceil(cols / 64),)](part, total, groups, cols, BLOCK_R=16, BLOCK_C=64)
    return dx, dw.to(weight.dtype), db.to(weight.dtype)


class LayerNorm(torch.autograd.Function):
    """LayerNorm over the last dim of a 2-D x as an autograd op: the forward kernel saves mean and rstd, the
    backward kernels use them. ``LayerNorm.apply(x, weight, bias, eps)``. Introduced in notebook 16.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                eps: float = 1e-5) -> torch.Tensor:
        y, mean, rstd = layernorm(x, weight, bias, eps)
        ctx.save_for_backward(x, weight, mean, rstd)
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
        x, weight, mean, rstd = ctx.saved_tensors
        dx, dw, db = layernorm_bwd(x, weight, mean, rstd, dy.contiguous())
        return dx, dw, db, None
