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

__all__ = [
    "KernelRef",
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
    "flash_attention_unfused",
    "install_hint",
    "kernel_sum",
    "layernorm",
    "layernorm_unfused",
    "load",
    "mode",
    "randn",
    "setup",
    "softmax",
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
            return (f"Triton mode: interpreter (TRITON_INTERPRET=1), because {self.reason}. Every program of a "
                    "kernel runs one after another as NumPy code on the CPU: right answers, meaningless timings.")
        return f"Triton mode: compiled, because {self.reason}. Kernels are compiled to GPU code on first launch."


def triton_available() -> bool:
    """Say whether the ``triton`` package can be imported here (it is the ``kernels`` extra). Introduced in notebook 08."""
    return importlib.util.find_spec("triton") is not None


def install_hint() -> str:
    """Return how to install Triton for notebook 08 (the ``kernels`` extra), without a CUDA torch.

    Introduced in notebook 08.
    """
    return ("Triton is not installed. `make lab` installs it; in this workbook's environment run  "
            "pip install -e '.[kernels]'  (or  pip install triton==3.7.1 , the version torch 2.13.0's CUDA build "
            "requires; triton has no dependencies, so the torch build you have stays). "
            "Triton ships wheels for Linux only; on macOS or Windows use a Linux machine, WSL or a container.")


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
        want = Mode("compiled", dev, f"the device gate picked {dev} ({_cuda_name(dev)})")
    elif dev.type == "cuda":
        want = Mode("interpreter", torch.device("cpu"), "TRITON_INTERPRET=1 was set by hand (a GPU is present)")
    else:
        want = Mode("interpreter", torch.device("cpu"), f"the device gate picked {dev}: no CUDA GPU for Triton")
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


def _row_block(n_cols: int) -> tuple[int, int]:
    if n_cols > 65536:
        raise ValueError(f"rows of up to 65536 columns fit in one block, got {n_cols}")
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
    x, weight, bias = _tensor("x", x, 2), _tensor("weight", weight, 1), _tensor("bias", bias, 1)
    if weight.shape[0] != x.shape[1] or bias.shape[0] != x.shape[1]:
        raise ValueError(f"weight and bias must have x.shape[1] = {x.shape[1]} elements")
    eps = _number("eps", eps, 0.0, 1.0)
    _on_mode_device(x, weight, bias)
    y = _out("out", out, x)
    mean = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    rstd = torch.empty_like(mean)
    block, warps = _row_block(x.shape[1])
    k = as_kernel(load().layernorm_kernel if kernel is None else kernel)
    k[(x.shape[0],)](x, weight, bias, y, mean, rstd, x.shape[1], x.stride(0), eps, BLOCK=block, num_warps=warps)
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
