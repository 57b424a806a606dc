"""Profiling and fusion helpers: torch.profiler tables, top-k ops with their share, Chrome traces,
kernel-launch overhead, and an elementwise chain run unfused, fused by hand, and by ``torch.compile``.

Measure first, then optimise: profile a real step, find the few ops that take most of the time (an op
above ~20 % is worth a look; a handful usually cover 80 %), and only then change one thing at a time.

Example::

    from labkit import profiling as P
    step = P.make_gpt_step(batch=32)
    prof = P.profile_steps(step, steps=3)
    print(P.op_table(prof, row_limit=8))
    for op in P.top_ops(prof, k=5):
        print(op.name, f"{op.share:.0%}")
    P.write_chrome_trace(prof, "_out/trace.json")   # open in https://ui.perfetto.dev

Introduced in notebook 07.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.autograd import DeviceType

from labkit import bench
from labkit import device as dev_gate
from labkit._validate import as_float, safe_repr
from labkit.roofline import OpCost, dtype_bytes

__all__ = [
    "CHAIN_STEPS",
    "OpShare",
    "busy_fraction",
    "compile_timed",
    "count_flops",
    "gelu_chain_cost",
    "gelu_chain_fused",
    "gelu_chain_reference",
    "gelu_chain_unfused",
    "gpt_train_flops",
    "interleaved_times",
    "launch_overhead",
    "make_gpt_step",
    "mfu",
    "op_table",
    "ops_to_cover",
    "profile_steps",
    "read_chrome_trace",
    "top_ops",
    "write_chrome_trace",
]

_GELU_C = math.sqrt(2.0 / math.pi)


@contextlib.contextmanager
def _quiet_native_stderr() -> Iterator[None]:
    """Send file descriptor 2 to a scratch file for a moment: Kineto logs start/stop lines from C++ there."""
    fd = 2  # C++ std::cerr writes to descriptor 2 whatever Python's sys.stderr is
    sys.stderr.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), fd)
        try:
            yield
        finally:
            os.dup2(saved, fd)
            os.close(saved)


def _device(device: torch.device | str | None) -> torch.device:
    """``device`` as a torch.device this machine has (None: the device gate's pick); TypeError/ValueError if not."""
    if device is None or isinstance(device, str):
        return dev_gate.pick_device(device)
    if not isinstance(device, torch.device):
        raise TypeError(f"device must be a torch.device, a str such as 'cpu', or None, got {type(device).__name__}")
    return device


def _check_prof(prof: object) -> None:
    if not isinstance(prof, torch.profiler.profile):
        raise TypeError(f"prof must be the torch.profiler.profile from profile_steps, got {type(prof).__name__}")


def _activities(device: torch.device) -> list[Any]:
    acts = [torch.profiler.ProfilerActivity.CPU]
    if dev_gate.is_cuda(device):
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return acts


def profile_steps(step: Callable[[], Any], steps: int = 3, warmup: int = 1, device: torch.device | str | None = None,
                  record_shapes: bool = False) -> torch.profiler.profile:
    """Run ``step()`` ``warmup`` times unprofiled, then ``steps`` times under torch.profiler; return the profiler.

    On a CUDA ``device`` the CUDA activity is recorded too (the tables get CUDA time columns) and the
    device is synchronised before the profiler stops. Kineto's start/stop log lines are kept off the
    notebook's stderr.
    Introduced in notebook 07.
    """
    if not callable(step):
        raise TypeError(f"step must be a callable taking no arguments, got {type(step).__name__}")
    for name, v, lo in (("steps", steps, 1), ("warmup", warmup, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {safe_repr(v)}")
    if not isinstance(record_shapes, bool):
        raise TypeError(f"record_shapes must be True or False, got {type(record_shapes).__name__}")
    dev = _device(device)
    for _ in range(warmup):
        step()
    dev_gate.synchronize(dev)
    prof = torch.profiler.profile(activities=_activities(dev), record_shapes=record_shapes)
    with _quiet_native_stderr():
        prof.__enter__()
    try:
        for _ in range(steps):
            with torch.profiler.record_function("train_step"):
                step()
        dev_gate.synchronize(dev)
    finally:
        with _quiet_native_stderr():
            prof.__exit__(None, None, None)
    return prof


def _sort_key(prof: torch.profiler.profile, by: str | None) -> str:
    if by is None:
        by = "device" if torch.profiler.ProfilerActivity.CUDA in (prof.activities or []) else "cpu"
    if by not in ("cpu", "device"):
        raise ValueError(f"by must be 'cpu' or 'device', got {safe_repr(by)}")
    return f"self_{by}_time_total"


def op_table(prof: torch.profiler.profile, by: str | None = None, row_limit: int = 10) -> str:
    """Return the profiler's key_averages table sorted by self time ("cpu", or "device" on a GPU).

    Self time is the time inside an op *excluding* the ops it called, so the self column adds up to the
    total and shows where time really goes; total time double-counts nested ops.
    Introduced in notebook 07.
    """
    _check_prof(prof)
    if isinstance(row_limit, bool) or not isinstance(row_limit, int) or row_limit < 1:
        raise ValueError(f"row_limit must be a positive int, got {safe_repr(row_limit)}")
    return prof.key_averages().table(sort_by=_sort_key(prof, by), row_limit=row_limit)


@dataclass(frozen=True)
class OpShare:
    """One op from a profile: its name, self time in microseconds, number of calls and share of the total.

    Introduced in notebook 07.
    """

    name: str
    self_us: float
    calls: int
    share: float


def top_ops(prof: torch.profiler.profile, k: int = 5, by: str | None = None,
            exclude: Sequence[str] = ("train_step",)) -> list[OpShare]:
    """Return the ``k`` ops with the most self time and each one's share of the profile's total self time.

    ``exclude`` drops user annotations (``record_function`` labels), whose self time is Python overhead
    between ops rather than an op; torch's own annotations (``Optimizer.step#AdamW.step``,
    ``ProfilerStep#3``, ``Optimizer.zero_grad#...``: a ``#`` in the name) are dropped too. By device time (a GPU
    profile), the kernels' own rows are left out: each kernel's time is already in the self device time of the op
    that launched it. Introduced in notebook 07.
    """
    _check_prof(prof)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int, got {safe_repr(k)}")
    if isinstance(exclude, str) or not isinstance(exclude, (list, tuple, set, frozenset)):
        raise TypeError(f"exclude must be a list or tuple of annotation names, got {safe_repr(exclude)}")
    attr = _sort_key(prof, by)
    events = [e for e in prof.key_averages() if e.key not in exclude and "#" not in e.key]
    if attr == "self_device_time_total":
        # A GPU profile lists each kernel twice: as its own row (device type CUDA) and inside the self device time
        # of the op that launched it. Rank the ops, whose self device times add up to the kernels' once.
        events = [e for e in events if getattr(e, "device_type", None) == DeviceType.CPU]
    total = sum(getattr(e, attr) for e in events)
    if total <= 0:
        raise ValueError("the profile recorded no self time; profile at least one step that runs ops")
    events.sort(key=lambda e: getattr(e, attr), reverse=True)
    return [OpShare(e.key, float(getattr(e, attr)), int(e.count), float(getattr(e, attr)) / total) for e in events[:k]]


def _iter(value: Any, name: str) -> list[Any]:
    try:
        return list(value)
    except TypeError:
        raise TypeError(f"{name} must be a sequence, got {type(value).__name__}") from None


def _is_real(v: Any) -> bool:
    import numbers

    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def ops_to_cover(shares: Sequence[float], fraction: float = 0.8) -> int:
    """Return how many of the largest ``shares`` (fractions of the total) it takes to reach ``fraction``.

    The Pareto check of a profile: if 3 ops cover 80 %, optimise those and ignore the long tail.
    Introduced in notebook 07.
    """
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
        raise TypeError(f"fraction must be a number in (0, 1], got {type(fraction).__name__}")
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {safe_repr(fraction)}")
    if isinstance(shares, (str, bytes, dict)) or not all(_is_real(v) for v in _iter(shares, "shares")):
        raise TypeError("shares must be a sequence of numbers (fractions of the total)")
    vals = sorted((float(s) for s in shares), reverse=True)
    if not vals or any(v < 0 for v in vals):
        raise ValueError("shares must be a non-empty sequence of non-negative fractions")
    acc = 0.0
    for i, v in enumerate(vals, 1):
        acc += v
        if acc >= fraction - 1e-12:
            return i
    raise ValueError(f"the shares add up to {acc:.3f}, less than {fraction}")


def write_chrome_trace(prof: torch.profiler.profile, path: str | os.PathLike[str]) -> Path:
    """Write the profile as a Chrome trace JSON (open it in https://ui.perfetto.dev); return the path.

    Parent folders are created. Introduced in notebook 07.
    """
    _check_prof(prof)
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or a path, got {type(path).__name__}")
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(p))
    return p


def read_chrome_trace(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a Chrome trace JSON and check it has a ``traceEvents`` list; return the parsed dict.

    Introduced in notebook 07.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or a path, got {type(path).__name__}")
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ValueError(f"{path} is not a Chrome trace (no traceEvents list)")
    return data


def _union_length(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, -math.inf
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def busy_fraction(events: Sequence[dict[str, Any]], category: str = "cpu_op", window: str = "train_step") -> float:
    """Return the fraction of the ``window`` spans of a Chrome trace during which at least one ``category``
    event ran.

    This is what nvidia-smi's "GPU-Util" reports for a GPU (``category="kernel"``): the share of time at
    least one kernel was running, however few of the SMs it kept busy. On a CPU trace (``"cpu_op"``) it is
    the share of the step spent inside aten ops; the rest is Python and framework overhead between them.
    Overlapping events count once; events are clipped to the windows. On a GPU trace each step has two spans of
    that name, the CPU's and the GPU's copy (``gpu_user_annotation``, from its first kernel to its last); their
    union is the window, from the moment the CPU starts the step to the end of its last kernel, as a wall clock
    (and nvidia-smi) sees it. Introduced in notebook 07.
    """
    if not isinstance(category, str) or not isinstance(window, str):
        raise TypeError("category and window must be event names (str)")
    if isinstance(events, (str, bytes, dict)) or not all(isinstance(e, dict) for e in _iter(events, "events")):
        raise TypeError("events must be a list of trace events (dicts), e.g. read_chrome_trace(path)['traceEvents']")
    events = [e for e in events if "ts" in e and "dur" in e]
    wins = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events
            if e.get("ph") == "X" and e.get("name") == window and "dur" in e]
    wins = [w for w in wins if w[1] > w[0]]
    if not wins:
        raise ValueError(f"the trace has no {safe_repr(window)} span to measure within")
    ops = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events
           if e.get("ph") == "X" and e.get("cat") == category and "dur" in e]
    clipped = [(max(a, wa), min(b, wb)) for a, b in ops for wa, wb in wins if min(b, wb) > max(a, wa)]
    return _union_length(clipped) / _union_length(wins)


def count_flops(fn: Callable[[], Any]) -> int:
    """Run ``fn()`` under ``torch.utils.flop_counter.FlopCounterMode`` and return the FLOPs it counted.

    The counter knows matmuls, convolutions and attention kernels (forward and backward), and counts
    nothing for elementwise ops, norms or the optimizer: it counts *model* FLOPs, as MFU does.
    Introduced in notebook 07.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


def gpt_train_flops(config: Any, batch: int, seq_len: int | None = None) -> int:
    """Return the matmul FLOPs of one TinyGPT training step (forward + backward) on ``batch`` sequences.

    The textbook count: 6 FLOPs per matmul weight per token (2 forward, 4 backward) plus attention's
    ``12 * n_layers * seq_len * d_model`` per token (QKᵀ and AV, three passes), as in the PaLM paper's
    MFU appendix. Embeddings are lookups, not matmuls, and count nothing. ``seq_len`` defaults to the
    config's. Introduced in notebook 07.
    """
    for name in ("d_model", "n_layers", "vocab_size", "mlp_ratio", "seq_len"):
        if not isinstance(getattr(config, name, None), int):
            raise TypeError(f"config must be a GPTConfig (no int {safe_repr(name)})")
    t = config.seq_len if seq_len is None else seq_len
    for name, v in (("batch", batch), ("seq_len", t)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {safe_repr(v)}")
    d, layers = config.d_model, config.n_layers
    matmul_weights = layers * (3 * d * d + d * d + 2 * config.mlp_ratio * d * d) + d * config.vocab_size
    tokens = batch * t
    return 6 * matmul_weights * tokens + 12 * layers * t * d * tokens


def mfu(model_flops: float, seconds: float, peak_flops_per_s: float) -> float:
    """Return the model FLOPs utilisation: ``model_flops / seconds`` as a fraction of ``peak_flops_per_s``.

    ``model_flops`` counts the model's arithmetic once (recomputation under activation checkpointing
    does not count; counting it gives the *hardware* FLOPs utilisation, HFU). Introduced in notebook 07.
    """
    for name, v in (("model_flops", model_flops), ("seconds", seconds), ("peak_flops_per_s", peak_flops_per_s)):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"{name} must be a number, got {type(v).__name__}")
        if not (v > 0 and math.isfinite(as_float(name, v))):
            raise ValueError(f"{name} must be positive and finite, got {safe_repr(v)}")
    return model_flops / seconds / peak_flops_per_s


def make_gpt_step(batch: int = 32, seed: int = 0, device: torch.device | str | None = None,
                  **config: Any) -> Callable[[], float]:
    """Build a TinyGPT on the "reverse" token task with AdamW; return a closure that runs one training step.

    Extra keyword arguments go to :class:`labkit.models.GPTConfig`. The closure returns the loss.
    Introduced in notebook 07.
    """
    from labkit import data, models

    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive int, got {safe_repr(batch)}")
    dev = _device(device)
    task = data.make_token_task("reverse", n_digits=6, vocab_size=12, n=max(batch, 256), seed=seed)
    torch.manual_seed(seed)
    model = models.TinyGPT(models.GPTConfig(vocab_size=task.vocab_size, seq_len=task.seq_len, **config)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = task.inputs[:batch].to(dev), task.targets[:batch].to(dev)

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        loss = models.lm_loss(model(x), y)
        loss.backward()
        opt.step()
        return float(loss.detach())

    return step


def interleaved_times(fns: dict[str, Callable[..., Any]], *args: Any, repeats: int = 5, warmup: int = 1,
                      device: torch.device | str | None = None) -> dict[str, float]:
    """Time several functions on the same arguments, round-robin, and return each one's median seconds.

    Round-robin (a, b, c, b, c, a, ...; :func:`labkit.bench.compare`) exposes every candidate to the same
    background load, so the *ratios* are fair even on a busy machine. Introduced in notebook 07.
    """
    if not isinstance(fns, dict) or not fns or not all(callable(f) for f in fns.values()):
        raise TypeError("fns must be a non-empty dict of name -> callable")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive int, got {safe_repr(repeats)}")
    dev = _device(device)
    cmp = bench.compare({k: functools.partial(f, *args) for k, f in fns.items()}, warmup=warmup, repeats=repeats,
                        device=dev)
    return {k: t.median for k, t in cmp.timings.items()}


def launch_overhead(n_ops: int = 2000, size: int = 64, repeats: int = 5,
                    device: torch.device | str | None = None) -> dict[str, float]:
    """Time ``n_ops`` tiny adds of ``size`` elements against one add over all ``n_ops * size`` elements.

    Both do the same arithmetic on the same number of elements; the difference is per-op overhead
    (Python, the dispatcher, and on a GPU the kernel launch). Returns ``many_s``, ``one_s``, ``ratio``
    (many / one) and ``overhead_us`` (the extra time per tiny op). On a CPU both run on one thread (the tiny adds
    do anyway: 64 elements are far below PyTorch's parallel grain): with a thread team, one busy core on a shared
    node stalled the big add for milliseconds at its barrier, and the race measured the node's load instead of the
    overhead. The thread count is restored after. Introduced in notebook 07.
    """
    for name, v in (("n_ops", n_ops), ("size", size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {safe_repr(v)}")
    dev = _device(device)
    big = torch.zeros(n_ops, size, device=dev)
    out = torch.empty_like(big)
    rows_in, rows_out = list(big.unbind(0)), list(out.unbind(0))

    def many() -> None:
        for a, o in zip(rows_in, rows_out):
            torch.add(a, 1.0, out=o)

    def one() -> None:
        torch.add(big, 1.0, out=out)

    threads = torch.get_num_threads()
    if dev.type == "cpu":
        torch.set_num_threads(1)
    try:
        t = interleaved_times({"many": many, "one": one}, repeats=repeats, device=dev)
    finally:
        if dev.type == "cpu":
            torch.set_num_threads(threads)
    return {"many_s": t["many"], "one_s": t["one"], "ratio": t["many"] / t["one"],
            "overhead_us": max(t["many"] - t["one"], 0.0) / n_ops * 1e6}


# --- an elementwise chain: bias + GELU (tanh form) + dropout with a given mask -------------------------

#: The unfused chain, op by op: (what it computes, float tensors read, float tensors written, mask read).
CHAIN_STEPS: tuple[tuple[str, int, int, int], ...] = (
    ("h = x + bias", 1, 1, 0),
    ("u = h * h", 1, 1, 0),
    ("u = u * h", 2, 1, 0),
    ("u = u * 0.044715", 1, 1, 0),
    ("u = h + u", 2, 1, 0),
    ("u = u * sqrt(2/pi)", 1, 1, 0),
    ("u = tanh(u)", 1, 1, 0),
    ("u = u + 1", 1, 1, 0),
    ("g = h * u", 2, 1, 0),
    ("g = g * 0.5", 1, 1, 0),
    ("y = g * mask", 1, 1, 1),
    ("y = y / (1 - p)", 1, 1, 0),
)


def gelu_chain_cost(numel: int, dtype: Any = "fp32", fused: bool = False) -> OpCost:
    """Return the FLOPs and minimum bytes of the bias + GELU + dropout chain over ``numel`` elements.

    Unfused, each of the 12 steps in :data:`CHAIN_STEPS` reads its inputs from memory and writes its
    result back; fused, x and the mask are read once and y written once. Both do 12 FLOPs per element
    (tanh counted as one); the bias vector is ignored (it stays in cache). Introduced in notebook 07.
    """
    if isinstance(numel, bool) or not isinstance(numel, int) or numel < 1:
        raise ValueError(f"numel must be a positive int, got {safe_repr(numel)}")
    if not isinstance(fused, bool):
        raise TypeError(f"fused must be True or False, got {type(fused).__name__}")
    b = dtype_bytes(dtype)
    flops = as_float("flops", len(CHAIN_STEPS) * numel)
    if fused:
        return OpCost("bias+GELU+dropout (fused)", flops, as_float("bytes", numel * (2 * b + 1)))
    per = sum((r + w) * b + m for _, r, w, m in CHAIN_STEPS)
    return OpCost("bias+GELU+dropout (unfused)", flops, as_float("bytes", numel * per))


def _check_chain_args(x: torch.Tensor, bias: torch.Tensor, mask: torch.Tensor, p: float) -> None:
    if not all(isinstance(t, torch.Tensor) for t in (x, bias, mask)):
        raise TypeError("x, bias and mask must be torch.Tensors")
    if x.dim() != 2 or bias.shape != (x.shape[1],) or mask.shape != x.shape:
        raise ValueError(f"expected x (rows, cols), bias (cols,), mask like x; got {tuple(x.shape)}, "
                         f"{tuple(bias.shape)}, {tuple(mask.shape)}")
    if not 0 <= p < 1:
        raise ValueError(f"dropout probability p must be in [0, 1), got {safe_repr(p)}")


def gelu_chain_unfused(x: torch.Tensor, bias: torch.Tensor, mask: torch.Tensor, p: float = 0.1) -> torch.Tensor:
    """Compute ``dropout(gelu_tanh(x + bias))`` as 12 separate elementwise ops, as GPT-2-style code writes it.

    ``mask`` is the dropout keep-mask (bool, like ``x``), passed in so that every version computes the
    same numbers. Each line is its own kernel: it reads its inputs from memory and writes a new tensor.
    Introduced in notebook 07.
    """
    _check_chain_args(x, bias, mask, p)
    h = x + bias
    u = h * h
    u = u * h
    u = u * 0.044715
    u = h + u
    u = u * _GELU_C
    u = torch.tanh(u)
    u = u + 1.0
    g = h * u
    g = g * 0.5
    y = g * mask
    return y * (1.0 / (1.0 - p))


def gelu_chain_fused(x: torch.Tensor, bias: torch.Tensor, mask: torch.Tensor, p: float = 0.1,
                     block_bytes: int = 256 * 1024) -> torch.Tensor:
    """Compute the same chain fused by hand: one pass over memory, block by block, in place.

    Each block of rows (about ``block_bytes``, small enough to stay in the L2 cache) is loaded once, the
    whole chain runs on it with in-place ops into two preallocated buffers, and the result is stored
    once: what a fused kernel does with registers, done here with the cache. Introduced in notebook 07.
    """
    _check_chain_args(x, bias, mask, p)
    if isinstance(block_bytes, bool) or not isinstance(block_bytes, int) or block_bytes < 1:
        raise ValueError(f"block_bytes must be a positive int, got {safe_repr(block_bytes)}")
    rows = max(1, block_bytes // (x.shape[1] * x.element_size()))
    out = torch.empty_like(x)
    tmp = torch.empty((min(rows, x.shape[0]), x.shape[1]), dtype=x.dtype, device=x.device)
    scale = 0.5 / (1.0 - p)
    for i in range(0, x.shape[0], rows):
        o = out[i:i + rows]
        t = tmp[:o.shape[0]]
        torch.add(x[i:i + rows], bias, out=o)      # h (kept in o)
        torch.mul(o, o, out=t)
        t.mul_(o).mul_(0.044715).add_(o).mul_(_GELU_C).tanh_().add_(1.0)
        o.mul_(t).mul_(mask[i:i + rows]).mul_(scale)
    return out


def gelu_chain_reference(x: torch.Tensor, bias: torch.Tensor, mask: torch.Tensor, p: float = 0.1) -> torch.Tensor:
    """Compute the chain with PyTorch's own ``F.gelu(approximate="tanh")``: the reference for the others.

    Introduced in notebook 07.
    """
    _check_chain_args(x, bias, mask, p)
    return F.gelu(x + bias, approximate="tanh") * mask * (1.0 / (1.0 - p))


def compile_timed(fn: Callable[..., Any], *args: Any, **compile_kwargs: Any) -> tuple[Callable[..., Any], float]:
    """``torch.compile`` ``fn`` and call it once on ``args``; return the compiled function and that first call's seconds.

    The first call traces, generates and compiles the kernel (C++ on CPU, Triton on a GPU), so it is
    timed apart from the steady state. Set ``TORCHINDUCTOR_COMPILE_THREADS=1`` on small machines.
    Introduced in notebook 07.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    compiled = torch.compile(fn, **compile_kwargs)
    t0 = time.perf_counter()
    compiled(*args)
    return compiled, time.perf_counter() - t0
