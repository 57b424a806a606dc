"""Inference: latency percentiles, throughput against batch size, time to first token, and INT8 weights.

- :func:`percentile` (nearest rank) and :class:`LatencyStats` summarise request latencies: P50, P90, P99.
- :func:`batch_sweep` times a model's forward pass at several batch sizes (interleaved, in one run) and
  returns latency percentiles and throughput for each.
- :func:`greedy_generate` and :func:`timed_generate` decode token by token, the second timing each token:
  the first one's time is the **time to first token** (TTFT), the others' the time per output token.
- :class:`Int8Linear` is dynamic INT8 quantization written out: int8 weights with one scale per output
  channel, activations quantized per row on the fly, an int8 × int8 → int32 matmul (``torch._int_mm``, where
  :func:`int8_matmul_exact` says it is exact on this device), and a rescale to fp32. :func:`quantize_int8`
  swaps it in for a model's ``nn.Linear`` layers, except those you keep; :func:`weight_bytes` counts a model's bytes. ``tests/test_inference.py`` checks it against
  ``torch.ao.quantization.quantize_dynamic``.

Introduced in notebook 15.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import torch
from torch import nn

from labkit import device as dev_gate
from labkit._validate import check_dense

__all__ = [
    "BatchPoint",
    "Generation",
    "Int8Linear",
    "LatencyStats",
    "batch_sweep",
    "greedy_generate",
    "int8_matmul_exact",
    "percentile",
    "quantize_int8",
    "timed_generate",
    "weight_bytes",
]


def _numbers(name: str, values: object) -> list[float]:
    if isinstance(values, (str, bytes, dict)) or not isinstance(values, (list, tuple)):
        raise TypeError(f"{name} must be a list of numbers, got {type(values).__name__}")
    if not values:
        raise ValueError(f"{name} is empty")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"{name} must hold numbers, got {type(v).__name__}")
        if not math.isfinite(v):
            raise ValueError(f"{name} must hold finite numbers, got {v}")
        out.append(float(v))
    return out


def percentile(values: Sequence[float], q: float) -> float:
    """Return the ``q``-th percentile of ``values`` by the nearest-rank rule: the smallest value with at least
    ``q`` % of the values at or below it (so P99 of 100 latencies is the second largest; never interpolated).

    Introduced in notebook 15.
    """
    vals = sorted(_numbers("values", values))
    if isinstance(q, bool) or not isinstance(q, (int, float)):
        raise TypeError(f"q must be a number, got {type(q).__name__}")
    if not 0 < q <= 100:
        raise ValueError(f"q must be in (0, 100], got {q}")
    rank = math.ceil(Fraction(str(q)) * len(vals) / 100)  # exact: 0.99 * 100 must not round up to 100
    return vals[rank - 1]


@dataclass(frozen=True)
class LatencyStats:
    """Request latencies in seconds: count, mean, P50, P90, P99 (nearest rank) and the maximum. Introduced in notebook
    15."""

    n: int
    mean: float
    p50: float
    p90: float
    p99: float
    max: float

    @classmethod
    def of(cls, times: Sequence[float]) -> LatencyStats:
        """Summarise a list of latencies in seconds. Introduced in notebook 15."""
        vals = _numbers("times", times)
        return cls(len(vals), sum(vals) / len(vals), percentile(vals, 50), percentile(vals, 90), percentile(vals, 99),
                   max(vals))


@dataclass(frozen=True)
class BatchPoint:
    """One batch size of :func:`batch_sweep`: its latency statistics and its throughput (items per second).

    Every request in a batch waits for the whole batch, so a request's latency is the batch's time.
    Introduced in notebook 15.
    """

    batch: int
    latency: LatencyStats

    @property
    def throughput(self) -> float:
        """Items per second, sustained: the batch over the *mean* batch time (n batches take n x mean seconds; the
        median would ignore the slow ones, which a server pays for too). Introduced in notebook 15."""
        return self.batch / self.latency.mean


def _check_model(model: object) -> nn.Module:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    return model


def _count(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
    return value


def _run(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    try:
        return model(x)
    except (RuntimeError, IndexError) as exc:  # a shape or dtype the model cannot take: the caller's input
        raise ValueError(f"the model cannot run inputs of shape {tuple(x.shape)} and dtype {x.dtype}: {exc}") from None


def _devices(model: nn.Module, x: torch.Tensor) -> list[torch.device]:
    """The devices a timed call can queue work on: the model's parameters' and buffers', and the input's."""
    found = {t.device for t in (*model.parameters(), *model.buffers())} | {x.device}
    return sorted(found, key=str)


def _sync(devices: list[torch.device]) -> None:
    for d in devices:
        dev_gate.synchronize(d)


def batch_sweep(model: nn.Module, inputs: torch.Tensor, batch_sizes: Sequence[int], *, repeats: int = 30,
                warmup: int = 3) -> list[BatchPoint]:
    """Time ``model`` on the first ``b`` rows of ``inputs`` for each ``b`` in ``batch_sizes``; return the points.

    The batch sizes are timed round-robin (``repeats`` rounds, after ``warmup`` untimed ones) under
    ``torch.inference_mode``, so that a drift of the machine hits every size alike. Wall-clock timing
    (``time.perf_counter``) of the whole call: on a GPU the device is synchronised before the clock starts and
    before it stops, so the kernels are timed, not their launch. Introduced in notebook 15.
    """
    _check_model(model)
    if not isinstance(inputs, torch.Tensor) or inputs.dim() < 1:
        raise TypeError("inputs must be a tensor whose first dimension is the batch")
    check_dense("inputs", inputs)
    if isinstance(batch_sizes, (str, bytes)) or not isinstance(batch_sizes, (list, tuple)) or not batch_sizes:
        raise TypeError("batch_sizes must be a non-empty list of ints")
    sizes = [_count("batch size", b, 1, inputs.shape[0]) for b in batch_sizes]
    _count("repeats", repeats, 1, 10_000)
    _count("warmup", warmup, 0, 1000)
    times: dict[int, list[float]] = {b: [] for b in sizes}
    devices = _devices(model, inputs)
    with torch.inference_mode():
        for b in sizes:
            _run(model, inputs[:b])
        for r in range(warmup + repeats):
            order = sizes[r % len(sizes):] + sizes[: r % len(sizes)]
            for b in order:
                _sync(devices)
                t0 = time.perf_counter()
                model(inputs[:b])
                _sync(devices)
                dt = time.perf_counter() - t0
                if r >= warmup:
                    times[b].append(dt)
    return [BatchPoint(b, LatencyStats.of(times[b])) for b in sizes]


def _check_prompt(model: nn.Module, prompt: object, n_new: object) -> int:
    if not isinstance(prompt, torch.Tensor) or prompt.dtype != torch.long or prompt.dim() != 2:
        raise TypeError("prompt must be an int64 tensor of shape (batch, t)")
    seq_len = getattr(getattr(model, "config", None), "seq_len", None)
    limit = 10_000 if seq_len is None else seq_len - prompt.shape[1] + 1
    return _count("n_new", n_new, 1, max(limit, 1))


def greedy_generate(model: nn.Module, prompt: torch.Tensor, n_new: int) -> torch.Tensor:
    """Return the ``n_new`` tokens that greedy decoding appends to ``prompt`` (shape (batch, n_new)).

    Each step runs the model on the whole sequence so far and takes the argmax at the last position (no KV
    cache, so every step recomputes the prefix). Introduced in notebook 15.
    """
    _check_model(model)
    n = _check_prompt(model, prompt, n_new)
    return timed_generate(model, prompt, n).tokens


@dataclass(frozen=True)
class Generation:
    """Tokens from :func:`timed_generate` and the seconds each took; ``ttft`` is the first one's.

    Introduced in notebook 15.
    """

    tokens: torch.Tensor
    token_seconds: tuple[float, ...]

    @property
    def ttft(self) -> float:
        """Time to first token, in seconds (the prompt's prefill plus one step). Introduced in notebook 15."""
        return self.token_seconds[0]

    @property
    def time_per_output_token(self) -> float:
        """Median seconds per token after the first (the decode rate); the TTFT if only one.

        Introduced in notebook 15.
        """
        rest = sorted(self.token_seconds[1:]) or [self.ttft]
        return percentile(rest, 50)


def timed_generate(model: nn.Module, prompt: torch.Tensor, n_new: int) -> Generation:
    """Greedy-decode ``n_new`` tokens after ``prompt`` and time each one (``perf_counter``, inference mode; on a
    GPU the device is synchronised around each token).

    Introduced in notebook 15.
    """
    _check_model(model)
    n = _check_prompt(model, prompt, n_new)
    seq, out, secs = prompt, [], []
    with torch.inference_mode():
        devices = _devices(model, prompt)
        for _ in range(n):
            _sync(devices)
            t0 = time.perf_counter()
            logits = _run(model, seq)
            if not isinstance(logits, torch.Tensor) or logits.dim() != 3:
                raise ValueError("the model must return logits of shape (batch, t, vocab)")
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            _sync(devices)  # on a GPU: the token's kernels, not their launch
            secs.append(time.perf_counter() - t0)
            out.append(nxt)
            seq = torch.cat([seq, nxt], dim=1)
    return Generation(torch.cat(out, dim=1), tuple(secs))


class Int8Linear(nn.Module):
    """A ``nn.Linear`` with int8 weights, for inference: dynamic INT8 quantization written out.

    - **weights**, once: one scale per output row, ``scale = max|w_row| / 127``, ``w_q = round(w / scale)``;
    - **activations**, at every call: one scale per input row (per token), the same rule;
    - ``acc = x_q @ w_q.T`` in int32 (exact: int8 products summed without rounding), then
      ``y = acc × x_scale × w_scale + bias`` in fp32.

    The weights take a quarter of fp32's bytes. Introduced in notebook 15.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"Int8Linear wraps an nn.Linear, got {type(linear).__name__}")
        w = linear.weight.detach().float()
        w_scale = w.abs().amax(dim=1).clamp_min(1e-12) / 127
        self.register_buffer("w_q", torch.round(w / w_scale[:, None]).clamp(-127, 127).to(torch.int8))
        self.register_buffer("w_scale", w_scale)
        bias = None if linear.bias is None else linear.bias.detach().float().clone()
        self.register_buffer("bias", bias)
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).float()
        x_scale = x2.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127
        x_q = torch.round(x2 / x_scale).clamp(-127, 127).to(torch.int8)
        if int8_matmul_exact(x.device):
            acc = torch._int_mm(x_q, self.w_q.t()).float()     # int8 x int8 -> int32, on the integer units
        else:  # this build's int8 kernel is not exact here: the same integers in float64, which is exact
            acc = (x_q.double() @ self.w_q.double().t()).float()
        y = acc * x_scale * self.w_scale
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weights"


_EXACT: dict[str, bool] = {}


def int8_matmul_exact(device: torch.device | str = "cpu") -> bool:
    """Whether ``torch._int_mm`` (int8 × int8 → int32) gives the exact product on ``device`` in this process.

    Probed once per device with extreme values (±127, where 16-bit intermediate sums would saturate) against the
    same product in float64. It is not a given: under an AVX2 cap (``ATEN_CPU_CAPABILITY=avx2
    ONEDNN_MAX_CPU_ISA=AVX2``) torch 2.13's CPU kernel was off by tens of thousands, while the same call was exact
    on the AVX-512 CPU uncapped. :class:`Int8Linear` uses ``_int_mm`` only where it is exact. Introduced in notebook 15.
    """
    from labkit import device as dev_gate

    dev = dev_gate.resolve(device)
    key = str(dev)
    if key not in _EXACT:
        g = torch.Generator().manual_seed(0)
        a = torch.randint(-127, 128, (32, 64), dtype=torch.int8, generator=g)
        b = torch.randint(-127, 128, (64, 48), dtype=torch.int8, generator=g)
        a[:8], b[:, :8] = 127, 127  # the worst case for saturating pairwise sums
        want = a.double() @ b.double()
        try:
            got = torch._int_mm(a.to(dev), b.to(dev)).cpu().double()
            _EXACT[key] = bool(torch.equal(got, want))
        except (RuntimeError, NotImplementedError):  # no int8 kernel for this device or shape
            _EXACT[key] = False
    return _EXACT[key]


def quantize_int8(model: nn.Module, keep: Sequence[str] = ()) -> nn.Module:
    """Return a copy of ``model`` with every ``nn.Linear`` replaced by :class:`Int8Linear`, except those named
    in ``keep`` (module names as in ``named_modules()``, e.g. ``"head"``), which stay in fp32.

    ``model`` itself is not changed. Introduced in notebook 15.
    """
    _check_model(model)
    if isinstance(keep, (str, bytes)) or not isinstance(keep, (list, tuple, set, frozenset)):
        raise TypeError("keep must be a list of module names, e.g. ['head']")
    if not all(isinstance(k, str) for k in keep):
        raise TypeError("keep must hold module names (str)")
    names = {n for n, _ in model.named_modules()}
    unknown = set(keep) - names
    if unknown:
        raise ValueError(f"no module named {sorted(unknown)} in the model")
    if isinstance(model, nn.Linear):
        return copy.deepcopy(model) if "" in keep else Int8Linear(model)
    out = copy.deepcopy(model)
    for name, mod in list(out.named_modules()):
        for child_name, child in list(mod.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if isinstance(child, nn.Linear) and full not in keep:
                setattr(mod, child_name, Int8Linear(child))
    return out


def weight_bytes(model: nn.Module) -> int:
    """Return the bytes of a model's parameters and buffers (int8 weights count one byte each).

    Introduced in notebook 15.
    """
    _check_model(model)
    tensors = [*model.parameters(), *(b for b in model.buffers() if b is not None)]
    return sum(t.numel() * t.element_size() for t in tensors)
