"""Counting the bytes a computation moves: torch's ops one by one, or a Triton kernel in the interpreter.

:func:`torch_traffic` records every ATen op a torch function runs (a ``TorchDispatchMode``), and
:func:`triton_traffic` records every element a kernel loads or stores in Triton's interpreter. Both count, per
launch, each distinct byte once: what a launch keeps in registers or cache is free, what crosses a launch boundary
goes through memory. That is the saving fusion is about. :func:`fused_traffic` is the model the interpreter's
count is checked against, and :func:`cost` turns a count into a :class:`labkit.roofline.OpCost`.
Introduced in notebook 08.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from labkit import kernelbench, kernels
from labkit import roofline as R
from labkit._validate import safe_repr

__all__ = ["FLOPS_PER_ELEMENT", "OpTraffic", "Strays", "Traffic", "cost", "flash_requested", "fused_traffic",
           "torch_traffic", "triton_strays", "triton_traffic"]

#: FLOPs per element, the convention of notebook 08's roofline (erf, exp, sqrt count as one each):
#: bias+GELU: add, then x/sqrt(2), erf, +1, *h, *0.5; softmax and LayerNorm as in labkit.roofline
#: (softmax_cost, layernorm_cost); AdamW: decay 1, m 3, v 4, denominator 3, update 3 (see adamw_kernel).
FLOPS_PER_ELEMENT: dict[str, int] = {"bias_gelu": 6, "softmax": 5, "layernorm": 8, "adamw": 14}




@dataclass(frozen=True)
class OpTraffic:
    """One launch (an ATen op or a Triton kernel): the bytes it reads and writes, each distinct byte once.

    Introduced in notebook 08.
    """

    op: str
    read: int
    written: int


@dataclass(frozen=True)
class Traffic:
    """The memory traffic of a computation: launches, bytes read and written (per launch, distinct bytes).

    ``requested`` (Triton kernels only) counts every element loaded or stored, repeats included: FlashAttention
    loads K and V once per query block, which caches serve on a GPU. ``how`` says whether it was measured or
    modelled. Introduced in notebook 08.
    """

    name: str
    read: int
    written: int
    ops: tuple[OpTraffic, ...] = ()
    requested: int | None = None
    how: str = "measured"

    @property
    def total(self) -> int:
        """Bytes read plus written."""
        return self.read + self.written

    @property
    def launches(self) -> int:
        """How many ops or kernels ran."""
        return len(self.ops)


def _call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``fn(*args, **kwargs)``; a RuntimeError inside (torch's answer to arguments that do not fit ``fn``) is
    reported as a ValueError naming it, as labkit reports bad input."""
    try:
        return fn(*args, **kwargs)
    except RuntimeError as exc:
        raise ValueError(f"{getattr(fn, '__name__', type(fn).__name__)}(...) failed on these arguments: "
                         f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from exc


def _key(t: torch.Tensor) -> tuple[int, int]:
    return (t.data_ptr(), t.nbytes) if t.device.type != "meta" else (id(t), t.nbytes)


_NO_TRAFFIC = {"empty", "empty_like", "empty_strided", "detach", "alias", "lift_fresh", "set_", "resize_"}
# Arguments a schema marks as mutated that the op writes only when an optional argument is given: torch's fused
# Adam(W) declares the gradients mutable because it unscales them in place, which it does only with grad_scale.
_WRITES_ONLY_WITH = {("_fused_adamw_", "grads"): "grad_scale", ("_fused_adam_", "grads"): "grad_scale"}


def torch_traffic(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Traffic:
    """Run ``fn(*args, **kwargs)`` and count the bytes each ATen op it dispatches reads and writes.

    Per op: reads are its distinct tensor inputs, writes its outputs and the inputs it mutates (``mul_``,
    ``addcdiv_``). Views (``view``, ``transpose``, ``expand``) move nothing and are skipped, as are allocations.
    Returns a :class:`Traffic` with one :class:`OpTraffic` per op. Introduced in notebook 08.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    ops: list[OpTraffic] = []

    class _Count(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            base = func.name().split("::")[-1].split(".")[0]
            if func.namespace != "aten" or func.is_view or base in _NO_TRAFFIC:
                return out
            reads: dict[tuple[int, int], int] = {}
            writes: dict[tuple[int, int], int] = {}
            schema_args = func._schema.arguments
            for i, a in enumerate(schema_args):
                val = args[i] if i < len(args) else kwargs.get(a.name)
                tensors = [t for t in tree_flatten(val)[0] if isinstance(t, torch.Tensor)]
                mutated = a.alias_info is not None and a.alias_info.is_write
                if mutated and (base, a.name) in _WRITES_ONLY_WITH:
                    mutated = kwargs.get(_WRITES_ONLY_WITH[(base, a.name)]) is not None
                for t in tensors:
                    if not (mutated and a.name == "out"):
                        reads[_key(t)] = t.nbytes
                    if mutated:
                        writes[_key(t)] = t.nbytes
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    writes[_key(t)] = t.nbytes
            ops.append(OpTraffic(func.name().replace("aten::", ""), sum(reads.values()), sum(writes.values())))
            return out

    with _Count():
        _call(fn, args, kwargs)
    name = getattr(fn, "__name__", type(fn).__name__)
    return Traffic(name, sum(o.read for o in ops), sum(o.written for o in ops), tuple(ops))


@contextlib.contextmanager
def _count_interpreter(launches: list[dict[str, Any]]) -> Iterator[None]:
    from triton.runtime import interpreter as interp

    builder, grid = interp.InterpreterBuilder, interp.GridExecutor
    orig_load, orig_store, orig_call = builder.create_masked_load, builder.create_masked_store, grid.__call__
    orig_rmw = builder.create_atomic_rmw

    def record(kind: str, ptrs: Any, mask: Any) -> None:
        if not launches:
            return
        hit = np.broadcast_to(np.asarray(mask.data, dtype=bool), ptrs.data.shape)
        size = interp._get_np_dtype(ptrs.get_element_ty()).itemsize
        launches[-1][kind].append((np.asarray(ptrs.data)[hit].ravel(), size))

    def load(self: Any, ptrs: Any, mask: Any, *a: Any, **k: Any) -> Any:
        record("r", ptrs, mask)
        return orig_load(self, ptrs, mask, *a, **k)

    def store(self: Any, ptrs: Any, value: Any, mask: Any, *a: Any, **k: Any) -> Any:
        record("w", ptrs, mask)
        return orig_store(self, ptrs, value, mask, *a, **k)

    def rmw(self: Any, op: Any, ptrs: Any, val: Any, mask: Any, *a: Any, **k: Any) -> Any:
        record("r", ptrs, mask)  # an atomic read-modify-write (tl.atomic_add, ...) loads and stores
        record("w", ptrs, mask)
        return orig_rmw(self, op, ptrs, val, mask, *a, **k)

    def call(self: Any, *a: Any, **k: Any) -> Any:
        launches.append({"name": self.fn.__name__, "r": [], "w": [],
                         "regions": [_region(t) for t in (*a, *k.values()) if isinstance(t, torch.Tensor)]})
        return orig_call(self, *a, **k)

    builder.create_masked_load, builder.create_masked_store, grid.__call__ = load, store, call
    builder.create_atomic_rmw = rmw
    try:
        yield
    finally:
        builder.create_masked_load, builder.create_masked_store, grid.__call__ = orig_load, orig_store, orig_call
        builder.create_atomic_rmw = orig_rmw


def _region(t: torch.Tensor) -> tuple[int, int]:
    """The byte range [start, end) a tensor argument spans (a view: its own elements, not its base's)."""
    if t.numel() == 0:
        return (t.data_ptr(), t.data_ptr())
    span = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True)) + 1
    return (t.data_ptr(), t.data_ptr() + span * t.element_size())


@dataclass(frozen=True)
class Strays:
    """Elements a kernel loaded or stored outside every tensor it was given (per launch, added up).

    Introduced in notebook 08.
    """

    reads: int
    writes: int

    @property
    def any(self) -> bool:
        """True when the kernel touched memory that belongs to none of its tensors."""
        return bool(self.reads or self.writes)


def _outside(accesses: list[tuple[np.ndarray, int]], regions: list[tuple[int, int]]) -> int:
    count = 0
    for addrs, size in accesses:
        inside = np.zeros(addrs.shape, dtype=bool)
        for lo, hi in regions:
            inside |= (addrs >= lo) & (addrs + size <= hi)
        count += int((~inside).sum())
    return count


def triton_strays(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Strays:
    """Run ``fn(*args, **kwargs)``, which launches Triton kernels, and count the loads and stores (mask on) whose
    address lies outside every tensor passed to that launch: a missing or wrong mask. An atomic read-modify-write
    (``tl.atomic_add``) counts as a load and a store.

    Interpreter mode only (raises ``ValueError`` when compiled: on a GPU, ``compute-sanitizer`` does this). A
    tensor that is a view into a larger buffer counts only its own elements, so a read of the buffer's tail is a
    stray. Introduced in notebook 08.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if not kernels.mode().interpreted:
        raise ValueError("triton_strays watches loads and stores in Triton's interpreter; here kernels are compiled "
                         "(run the kernel under compute-sanitizer instead)")
    launches: list[dict[str, Any]] = []
    with _count_interpreter(launches):
        _call(fn, args, kwargs)
    return Strays(sum(_outside(launch["r"], launch["regions"]) for launch in launches),
                  sum(_outside(launch["w"], launch["regions"]) for launch in launches))


def _distinct_bytes(accesses: list[tuple[np.ndarray, int]]) -> tuple[int, int]:
    by_size: dict[int, list[np.ndarray]] = {}
    for addrs, size in accesses:
        by_size.setdefault(size, []).append(addrs)
    distinct = sum(len(np.unique(np.concatenate(a))) * s for s, a in by_size.items())
    return int(distinct), int(sum(len(a) * s for a, s in accesses))


def triton_traffic(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Traffic:
    """Run ``fn(*args, **kwargs)``, which launches Triton kernels, and count what each launch loads and stores.

    Interpreter mode only (a compiled kernel cannot be watched from Python: raises ``ValueError``). Every element
    a ``tl.load``/``tl.store`` (or an atomic, as both) touches with its mask on is recorded; per launch each distinct byte counts once
    (``read``/``written``), and ``requested`` counts them all. Introduced in notebook 08.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if not kernels.mode().interpreted:
        raise ValueError("triton_traffic counts loads and stores in Triton's interpreter; here kernels are compiled "
                         "(use fused_traffic for the model, or Nsight Compute for the hardware's count)")
    launches: list[dict[str, Any]] = []
    with _count_interpreter(launches):
        _call(fn, args, kwargs)
    ops, requested = [], 0
    for launch in launches:
        r, r_all = _distinct_bytes(launch["r"])
        w, w_all = _distinct_bytes(launch["w"])
        ops.append(OpTraffic(launch["name"], r, w))
        requested += r_all + w_all
    name = getattr(fn, "__name__", type(fn).__name__)
    return Traffic(name, sum(o.read for o in ops), sum(o.written for o in ops), tuple(ops), requested)


def fused_traffic(name: str, rows: int, cols: int, dtype: Any = "fp32") -> Traffic:
    """The bytes kernel ``name`` moves for a ``(rows, cols)`` problem, from the model: each input read once,
    each output written once (LayerNorm also writes fp32 mean and rstd per row; AdamW reads p, g, m, v and writes
    p, m, v, with g in ``dtype`` and the rest fp32). :func:`triton_traffic` measures the same in the interpreter.
    Introduced in notebook 08.
    """
    name = _kernel_name(name)
    rows, cols = _positive("rows", rows), _positive("cols", cols)
    b = kernels.randn(1, dtype=dtype, device="cpu").element_size()
    n = rows * cols
    read, written = {"bias_gelu": (n * b + cols * b, n * b), "softmax": (n * b, n * b),
                     "layernorm": (n * b + 2 * cols * b, n * b + 8 * rows),
                     "adamw": (n * (12 + b), n * 12)}[name]
    return Traffic(f"{name} (fused)", read, written, (OpTraffic(f"{name}_kernel", read, written),), how="model")


def _kernel_name(name: Any) -> str:
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, one of {kernelbench.NAMES}, got {type(name).__name__}")
    if name not in kernelbench.NAMES:
        raise ValueError(f"name must be one of {kernelbench.NAMES}, got {safe_repr(name)}")
    return name


def _positive(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if v < 1:
        raise ValueError(f"{name} must be >= 1, got {v}")
    return v


def cost(name: str, rows: int, cols: int, traffic: Traffic) -> R.OpCost:
    """Return a :class:`labkit.roofline.OpCost` for kernel ``name`` on ``(rows, cols)`` with the bytes of ``traffic``.

    FLOPs are :data:`FLOPS_PER_ELEMENT` times ``rows * cols``, the same for the fused kernel and the unfused
    sequence: fusion changes the bytes, not the arithmetic. Introduced in notebook 08.
    """
    name = _kernel_name(name)
    rows, cols = _positive("rows", rows), _positive("cols", cols)
    if not isinstance(traffic, Traffic):
        raise TypeError(f"traffic must be a Traffic (from torch_traffic, triton_traffic or fused_traffic), got "
                        f"{type(traffic).__name__}")
    return R.OpCost(traffic.name, float(FLOPS_PER_ELEMENT[name] * rows * cols), float(traffic.total))


def flash_requested(seq_len: int, head_dim: int, block_m: int, heads: int = 1, itemsize: int = 4) -> int:
    """The bytes FlashAttention's forward requests: Q read once, K and V once per query block, O written once.

    ``heads * seq_len * head_dim * itemsize * (2 + 2 * cdiv(seq_len, block_m))``: the K/V term grows as
    N^2 d / BLOCK_M, and since a query tile of BLOCK_M x d must fit on chip (BLOCK_M ~ M / d for on-chip memory M)
    that is Theta(N^2 d^2 / M). :func:`triton_traffic`'s ``requested`` counts the same in the interpreter.
    Introduced in notebook 08.
    """
    n, d, bm, h, b = (_positive(k, v) for k, v in (("seq_len", seq_len), ("head_dim", head_dim),
                                                   ("block_m", block_m), ("heads", heads), ("itemsize", itemsize)))
    return h * n * d * b * (2 + 2 * -(-n // bm))
