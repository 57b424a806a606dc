"""Benchmarks done right: warm up, take the median of repeats, and measure ratios in the same run.

- :func:`time_fn` times one callable: ``warmup`` untimed calls, then ``repeats`` timed ones; the
  median is reported (robust to the odd slow repeat on a shared machine).
- :func:`compare` times several candidates *interleaved* (repeat 1 of every candidate, then repeat 2 …,
  with the order rotated each round), so a machine that speeds up or slows down during the run affects
  every candidate alike, and reports each one's time relative to a baseline.
- On CUDA each call is timed with CUDA events (``labkit.device.event_timer``); elsewhere with
  ``time.perf_counter`` around the call followed by ``labkit.device.synchronize``.
- :func:`peak_matmul_flops`, :func:`memory_bandwidth` and :func:`theoretical_peak` give the measured
  ceilings and the formula's peak for notebook 07's roofline; ``python -m labkit.bench peak`` prints them.
- :func:`amp_benchmark` measures bf16 (and optionally fp16) against fp32 for a matmul and for a tiny-GPT
  training step; ``python -m labkit.bench amp`` prints it.

Introduced in notebook 04.
"""

from __future__ import annotations

import functools
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from labkit import device as dev_gate
from labkit import precision
from labkit._validate import safe_repr
from labkit.i18n import N_
from labkit.i18n import gettext as _

__all__ = [
    "CUDA_FLOPS_PER_CLOCK_PER_SM",
    "PEAK_DTYPES",
    "Bandwidth",
    "Comparison",
    "PeakFlops",
    "TheoreticalPeak",
    "Timing",
    "amp_benchmark",
    "compare",
    "excess_note",
    "cpu_flops_per_cycle",
    "cuda_flops_per_clock_per_sm",
    "default_peak_shapes",
    "main",
    "matmul_candidates",
    "memory_bandwidth",
    "peak_matmul_flops",
    "peak_report",
    "theoretical_peak",
    "time_fn",
    "train_step_candidates",
]


@dataclass(frozen=True)
class Timing:
    """Timed repeats of one callable: ``times`` in seconds, their ``median``, and the ``method`` used.

    Introduced in notebook 04.
    """

    name: str
    times: tuple[float, ...]
    warmup: int
    method: str

    @property
    def median(self) -> float:
        """The median time in seconds. Introduced in notebook 04."""
        return float(statistics.median(self.times))

    @property
    def spread(self) -> float:
        """(max - min) / median of the repeats: how noisy the measurement was. Introduced in notebook 04."""
        return (max(self.times) - min(self.times)) / self.median if self.median > 0 else 0.0


@dataclass(frozen=True)
class Comparison:
    """Interleaved timings of several candidates against a ``baseline``, measured in one run.

    ``ratio(name)`` is ``median(name) / median(baseline)`` (below 1: faster than the baseline);
    ``speedup(name)`` is its inverse. Introduced in notebook 04.
    """

    timings: dict[str, Timing]
    baseline: str
    method: str
    extra: dict[str, Any] = field(default_factory=dict)

    def ratio(self, name: str) -> float:
        """Time of ``name`` divided by the baseline's (medians). Introduced in notebook 04."""
        if name not in self.timings:
            raise ValueError(f"unknown candidate {safe_repr(name)}; have {list(self.timings)}")
        return self.timings[name].median / self.timings[self.baseline].median

    def speedup(self, name: str) -> float:
        """Baseline time divided by the time of ``name`` (above 1: faster). Introduced in notebook 04."""
        return 1.0 / self.ratio(name)

    def round_speedups(self, name: str) -> tuple[float, ...]:
        """Baseline time / time of ``name`` in each round, sorted: the rounds ran interleaved, so each ratio compares
        two calls made moments apart, under the same load. Introduced in notebook 15."""
        if name not in self.timings:
            raise ValueError(f"unknown candidate {safe_repr(name)}; have {list(self.timings)}")
        base = self.timings[self.baseline].times
        return tuple(sorted(b / t for b, t in zip(base, self.timings[name].times)))

    def speedup_quartiles(self, name: str) -> tuple[float, float, float]:
        """(lower quartile, median, upper quartile) of :meth:`round_speedups`: the middle half of the rounds lies
        between the first and the last. Introduced in notebook 15."""
        r = self.round_speedups(name)
        q = statistics.quantiles(r, n=4, method="inclusive") if len(r) > 1 else [r[0]] * 3
        return q[0], q[1], q[2]

    def table(self, title: str = "") -> str:
        """Return a plain-text table: candidate, median, spread, ratio to the baseline. Introduced in notebook 04."""
        rows = [title] if title else []
        w = max(12, *(len(str(n)) for n in self.timings))
        rows.append(f"{'candidate':<{w}} {'median':>12} {'spread':>8} {'time / ' + self.baseline:>14}")
        for name, t in self.timings.items():
            rows.append(f"{name:<{w}} {_fmt_time(t.median):>12} {t.spread:>7.0%} {self.ratio(name):>14.2f}")
        return "\n".join(rows)


def _fmt_time(s: float) -> str:
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.1f} us"


def _check_counts(warmup: int, repeats: int) -> None:
    if isinstance(warmup, bool) or not isinstance(warmup, int) or not 0 <= warmup <= _MAX_REPEATS:
        raise ValueError(f"warmup must be an int from 0 to {_MAX_REPEATS:,}, got {safe_repr(warmup)}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or not 1 <= repeats <= _MAX_REPEATS:
        raise ValueError(f"repeats must be an int from 1 to {_MAX_REPEATS:,}, got {safe_repr(repeats)}")


def _timer(dev: torch.device) -> tuple[Callable[[Callable[[], Any]], float], str]:
    events = dev_gate.event_timer(dev)
    if events is not None:
        return events, "cuda events"

    def timer(fn: Callable[[], Any]) -> float:
        dev_gate.synchronize(dev)
        t0 = time.perf_counter()
        fn()
        dev_gate.synchronize(dev)
        return time.perf_counter() - t0

    return timer, "perf_counter"


def time_fn(
    fn: Callable[[], Any],
    *,
    warmup: int = 3,
    repeats: int = 10,
    device: torch.device | str | None = None,
    name: str = "fn",
) -> Timing:
    """Time ``fn()``: ``warmup`` untimed calls, then ``repeats`` timed calls; the median is ``.median``.

    Introduced in notebook 04.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    return compare({name: fn}, warmup=warmup, repeats=repeats, device=device).timings[name]


def compare(
    candidates: dict[str, Callable[[], Any]],
    *,
    baseline: str | None = None,
    warmup: int = 3,
    repeats: int = 10,
    device: torch.device | str | None = None,
) -> Comparison:
    """Time every candidate interleaved in one run and return a :class:`Comparison` against ``baseline``.

    ``baseline`` defaults to the first candidate. Each round calls every candidate once, in an order
    rotated by one each round, after ``warmup`` untimed rounds. Introduced in notebook 04.
    """
    if not isinstance(candidates, dict) or not candidates:
        raise ValueError("candidates must be a non-empty dict of name -> callable")
    for k, fn in candidates.items():
        if not callable(fn):
            raise TypeError(f"candidate {safe_repr(k)} is not callable")
    baseline = next(iter(candidates)) if baseline is None else baseline
    if baseline not in candidates:
        raise ValueError(f"baseline {safe_repr(baseline)} is not one of {list(candidates)}")
    _check_counts(warmup, repeats)
    dev = dev_gate.resolve(device)
    timer, method = _timer(dev)
    names = list(candidates)
    for _warm in range(warmup):
        for n in names:
            candidates[n]()
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        order = names[r % len(names):] + names[: r % len(names)]
        for n in order:
            times[n].append(timer(candidates[n]))
    timings = {n: Timing(n, tuple(times[n]), warmup, method) for n in names}
    return Comparison(timings, baseline, method)


def _dtypes_for(dev: torch.device, names: Sequence[str]) -> list[str]:
    out = []
    for n in names:
        if n not in PEAK_DTYPES:
            raise ValueError(f"unknown dtype {safe_repr(n)}; choose from {list(PEAK_DTYPES)}")
        if n == "fp32" or dev_gate.computes(PEAK_DTYPES[n], dev):
            out.append(n)
    return out


def matmul_candidates(
    n: int, dtypes: Sequence[str] = ("fp32", "bf16"), device: torch.device | str | None = None, seed: int = 0
) -> dict[str, Callable[[], Any]]:
    """Return ``{dtype: fn}`` where ``fn()`` multiplies two n x n matrices stored in that dtype.

    Dtypes the device cannot compute in are left out. Introduced in notebook 04.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {safe_repr(n)}")
    dev = dev_gate.resolve(device)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {safe_repr(seed)}")
    g = torch.Generator().manual_seed(seed)
    a32, b32 = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    cands: dict[str, Callable[[], Any]] = {}
    for name in _dtypes_for(dev, dtypes):
        a, b = a32.to(dev, PEAK_DTYPES[name]), b32.to(dev, PEAK_DTYPES[name])
        cands[name] = (lambda a=a, b=b: a @ b)
    return cands


def train_step_candidates(
    dtypes: Sequence[str] = ("fp32", "bf16"),
    device: torch.device | str | None = None,
    batch_size: int = 64,
    d_model: int = 128,
    n_layers: int = 2,
    seed: int = 0,
) -> dict[str, Callable[[], Any]]:
    """Return ``{dtype: fn}`` where ``fn()`` is one AdamW step of a tiny GPT under that autocast dtype.

    Each candidate owns an identical copy of the model and optimizer and trains on a fixed batch; fp16
    uses a GradScaler, as :mod:`labkit.train` does. Introduced in notebook 04.
    """
    from labkit import data, models

    dev = dev_gate.resolve(device)
    task = data.make_token_task("reverse", n=batch_size, n_digits=8, vocab_size=16, seed=seed)
    x, y = task.inputs.to(dev), task.targets.to(dev)
    cands: dict[str, Callable[[], Any]] = {}
    for name in _dtypes_for(dev, dtypes):
        model = models.TinyGPT(vocab_size=task.vocab_size, seq_len=task.seq_len, d_model=d_model,
                               n_layers=n_layers, seed=seed).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        policy = precision.get_policy(name)  # fp32, or bf16/fp16 autocast (fp16 with a GradScaler)
        scaler = torch.amp.GradScaler(dev.type) if policy.scaler else None

        def step(model=model, opt=opt, scaler=scaler, policy=policy) -> None:
            opt.zero_grad(set_to_none=True)
            with precision.autocast(policy, dev.type):
                loss = models.lm_loss(model(x), y)
            precision.backward(loss, scaler)
            precision.update(opt, scaler)

        cands[name] = step
    return cands


def amp_benchmark(
    device: torch.device | str | None = None,
    dtypes: Sequence[str] = ("fp32", "bf16"),
    matmul_size: int | None = None,
    warmup: int = 3,
    repeats: int = 10,
    train_kwargs: dict[str, Any] | None = None,
) -> dict[str, Comparison]:
    """Measure lower-precision vs fp32 for a square matmul and a tiny-GPT train step, interleaved.

    Returns ``{"matmul": Comparison, "train_step": Comparison}`` with fp32 as the baseline.
    ``matmul_size`` defaults to 4096 on CUDA and 1024 on CPU, or 512 where the CPU only emulates one of the dtypes
    (``labkit.device.fast``; emulated fp16 runs ~100x slower than fp32). Introduced in notebook 04.
    """
    dev = dev_gate.resolve(device)
    dtypes = list(dict.fromkeys(["fp32", *dtypes]))
    emulated = any(not dev_gate.fast(PEAK_DTYPES[d], dev) for d in _dtypes_for(dev, dtypes))
    n = matmul_size if matmul_size is not None else (4096 if dev.type == "cuda" else 512 if emulated else 1024)
    mm = compare(matmul_candidates(n, dtypes, dev), baseline="fp32", warmup=warmup, repeats=repeats, device=dev)
    mm.extra["n"] = n
    mm.extra["flops"] = 2 * n**3
    ts = compare(train_step_candidates(dtypes, dev, **(train_kwargs or {})), baseline="fp32", warmup=warmup,
                 repeats=repeats, device=dev)
    return {"matmul": mm, "train_step": ts}


# --- peaks: measured matmul FLOP/s and memory bandwidth, theoretical peak from the formula (notebook 07) ---

#: dtype names the peak functions accept, and the torch dtype each one benchmarks.
PEAK_DTYPES: dict[str, torch.dtype] = {n: precision.dtype(n) for n in ("fp32", "bf16", "fp16")}

#: Dense FLOPs per clock per SM by CUDA compute capability: fp32 on CUDA cores (2 per FMA), fp16/bf16/tf32
#: on tensor cores. From NVIDIA's architecture whitepapers/datasheets (V100, T4, A100, A10/RTX 30, L4/L40,
#: H100, B200); pro cards' fp32-accumulate rate (GeForce cards run fp16 with fp32 accumulate at half that).
CUDA_FLOPS_PER_CLOCK_PER_SM: dict[tuple[int, int], dict[str, int | None]] = {
    (7, 0): {"fp32": 128, "tf32": None, "fp16": 1024, "bf16": None},
    (7, 5): {"fp32": 128, "tf32": None, "fp16": 1024, "bf16": None},
    (8, 0): {"fp32": 128, "tf32": 1024, "fp16": 2048, "bf16": 2048},
    (8, 6): {"fp32": 256, "tf32": 512, "fp16": 1024, "bf16": 1024},
    (8, 9): {"fp32": 256, "tf32": 512, "fp16": 1024, "bf16": 1024},
    (9, 0): {"fp32": 256, "tf32": 2048, "fp16": 4096, "bf16": 4096},
    (10, 0): {"fp32": 256, "tf32": 4096, "fp16": 8192, "bf16": 8192},
}


def _peak_dtype(dtype: str | torch.dtype) -> tuple[str, torch.dtype]:
    if isinstance(dtype, torch.dtype):
        names = [k for k, v in PEAK_DTYPES.items() if v == dtype]
        if not names:
            raise ValueError(f"peak dtypes are {sorted(PEAK_DTYPES)}, got {dtype}")
        return names[0], dtype
    if not isinstance(dtype, str):
        raise TypeError(f"dtype must be a name such as 'bf16' or a torch.dtype, got {type(dtype).__name__}")
    if dtype not in PEAK_DTYPES:
        raise ValueError(f"peak dtypes are {sorted(PEAK_DTYPES)}, got {safe_repr(dtype)}")
    return dtype, PEAK_DTYPES[dtype]


@dataclass(frozen=True)
class PeakFlops:
    """The best matmul FLOP/s measured for one dtype, the shape that reached it, and every shape's figure.

    Introduced in notebook 07.
    """

    dtype: str
    flops_per_s: float
    shape: tuple[int, int, int]
    per_shape: dict[tuple[int, int, int], float]
    #: True where ``labkit.device.fast`` says the hardware only emulates ``dtype``: a floor, not a ceiling.
    emulated: bool = False


#: The one shape an emulated dtype is measured on: emulated fp16 on a CPU without AVX512-FP16 runs ~100x slower
#: than fp32, so a 2048^3 matmul would take minutes; 256^3 takes well under a second and still says "emulated".
EMULATED_PEAK_SHAPE: tuple[int, int, int] = (256, 256, 256)


def default_peak_shapes(device: torch.device | str | None = None,
                        dtype: str | torch.dtype = "fp32") -> tuple[tuple[int, int, int], ...]:
    """Return the (m, n, k) matmul shapes :func:`peak_matmul_flops` searches by default on ``device`` for ``dtype``.

    Square powers of two and a tall-skinny shape: small enough for 2 CPU cores, large enough to fill a GPU. A dtype
    a CPU only emulates (``labkit.device.fast`` says no) gets one small shape, :data:`EMULATED_PEAK_SHAPE`: its
    peak is a floor, not a ceiling, and a search over large shapes would take minutes. Introduced in notebook 07.
    """
    _, dt = _peak_dtype(dtype)
    if not dev_gate.is_cuda(device) and not dev_gate.fast(dt, device):  # a GPU is launch-bound at 256^3: not there
        return (EMULATED_PEAK_SHAPE,)
    if dev_gate.is_cuda(device):
        return ((4096, 4096, 4096), (8192, 8192, 8192), (6144, 6144, 6144), (16384, 4096, 4096))
    return ((512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048), (4096, 1024, 1024))


def peak_matmul_flops(dtype: str | torch.dtype = "fp32", device: torch.device | str | None = None,
                      shapes: Sequence[tuple[int, int, int]] | None = None, repeats: int = 3) -> PeakFlops:
    """Measure the maximum achievable matmul FLOP/s for ``dtype``: time ``A @ B`` over several shapes, keep the best.

    The best over a few shapes, not the datasheet, is the compute ceiling a real job can hope for (the
    idea of stas00's "maximum achievable matmul FLOPs"). Each shape counts ``2*m*n*k`` FLOPs per
    matmul and takes the median of ``repeats`` timed runs after a warm-up. Raises ``ValueError`` if the
    device cannot compute in ``dtype``. Introduced in notebook 07.
    """
    name, dt = _peak_dtype(dtype)
    dev = dev_gate.resolve(device)
    if dt != torch.float32 and not dev_gate.computes(dt, dev):
        raise ValueError(f"{dev} does not compute in {name}; measure fp32 instead")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive int, got {safe_repr(repeats)}")
    shapes = tuple(default_peak_shapes(dev, name) if shapes is None else shapes)
    if not shapes:
        raise ValueError("shapes must list at least one (m, n, k)")
    per: dict[tuple[int, int, int], float] = {}
    for shape in shapes:
        if len(shape) != 3 or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in shape):
            raise ValueError(f"each shape must be three positive ints (m, n, k), got {safe_repr(shape)}")
        m, n, k = shape
        a = torch.randn(m, k, device=dev).to(dt)
        b = torch.randn(k, n, device=dev).to(dt)
        out = torch.empty(m, n, device=dev, dtype=dt)
        mm = functools.partial(torch.mm, a, b, out=out)
        per[(m, n, k)] = 2.0 * m * n * k / time_fn(mm, warmup=1, repeats=repeats, device=dev).median
    best = max(per, key=per.__getitem__)
    return PeakFlops(name, per[best], best, per, emulated=not dev_gate.fast(dt, dev))


@dataclass(frozen=True)
class Bandwidth:
    """Measured memory bandwidth: bytes read plus written per second by a large copy.

    Introduced in notebook 07.
    """

    bytes_per_s: float
    nbytes: int
    seconds: float


def memory_bandwidth(nbytes: int = 256 * 2**20, device: torch.device | str | None = None,
                     repeats: int = 5) -> Bandwidth:
    """Measure memory bandwidth from ``dst.copy_(src)`` of ``nbytes``: it reads ``nbytes`` and writes ``nbytes``.

    The copy is counted as ``2 * nbytes`` moved (some tools quote only one side, which halves the
    figure). Make ``nbytes`` several times the last-level cache, or the copy measures the cache.
    Introduced in notebook 07.
    """
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 4096:
        raise ValueError(f"nbytes must be an int >= 4096, got {safe_repr(nbytes)}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive int, got {safe_repr(repeats)}")
    dev = dev_gate.resolve(device)
    src = torch.ones(nbytes // 4, device=dev)
    dst = torch.empty_like(src)
    sec = time_fn(functools.partial(dst.copy_, src), warmup=1, repeats=repeats, device=dev).median
    moved = 2 * src.nbytes
    return Bandwidth(moved / sec, int(src.nbytes), sec)


@dataclass(frozen=True)
class TheoreticalPeak:
    """A peak from the formula units x frequency x FLOPs per cycle, with the formula and its assumptions.

    Introduced in notebook 07.
    """

    dtype: str
    flops_per_s: float
    formula: str
    assumptions: tuple[str, ...]

    def describe(self) -> str:
        """Return the peak, the formula and the assumptions as printable lines."""
        lines = [f"{self.dtype}: {self.flops_per_s / 1e9:,.1f} GFLOP/s = {self.formula}"]
        return "\n".join(lines + ["  " + _("assumes: {assumption}").format(assumption=a) for a in self.assumptions])


def cpu_flops_per_cycle(dtype: str, isa: Sequence[str], fma_units: int = 2) -> tuple[int, str]:
    """Return FLOPs per cycle per core for ``dtype`` given the CPU's ISA flags, and the unit that gives them.

    fp32: AVX-512 ``16 lanes x 2 (FMA) x fma_units``; AVX2+FMA ``8 x 2 x fma_units``; else SSE ``4 x 2``.
    bf16: AMX-BF16 tiles do 1024 FLOPs/cycle/core (Intel's figure for 4th-gen Xeon); without AMX,
    AVX512-BF16 dot products ``16 lanes x 4 x fma_units``; else as fp32 (converted). fp16: AMX-FP16 1024;
    AVX512-FP16 ``32 lanes x 2 x fma_units``; else as fp32. Introduced in notebook 07.
    """
    if isinstance(fma_units, bool) or not isinstance(fma_units, int) or not 1 <= fma_units <= 16:
        raise ValueError(f"fma_units must be a positive int, at most 16 (FMA units per core: 1 or 2 on today's "
                         f"CPUs), got {safe_repr(fma_units)}")
    per, unit = _cpu_unit(_peak_dtype(dtype)[0], set(isa), fma_units)
    return per, unit.format(units=fma_units)


def _cpu_unit(name: str, have: set[str], fma_units: int) -> tuple[int, str]:
    """FLOPs per cycle per core and the unit that gives them, as an English template (``{units}``: FMA units)."""
    if name == "bf16" and "amx_bf16" in have:
        return 1024, N_("AMX-BF16 tile unit (1024 FLOP/cycle/core)")
    if name == "fp16" and "amx_fp16" in have:
        return 1024, N_("AMX-FP16 tile unit (1024 FLOP/cycle/core)")
    if name == "bf16" and "avx512_bf16" in have:
        return 16 * 4 * fma_units, N_("AVX512-BF16 dot product (16 lanes x 4 FLOP x {units} units)")
    if name == "fp16" and "avx512_fp16" in have:
        return 32 * 2 * fma_units, N_("AVX512-FP16 FMA (32 lanes x 2 FLOP x {units} units)")
    if "avx512f" in have:
        return 16 * 2 * fma_units, N_("AVX-512 FMA (16 fp32 lanes x 2 FLOP x {units} units)")
    if "avx2" in have and "fma" in have:
        return 8 * 2 * fma_units, N_("AVX2 FMA (8 fp32 lanes x 2 FLOP x {units} units)")
    return 8, N_("SSE (4 fp32 lanes x (1 add + 1 mul))")


def cuda_flops_per_clock_per_sm(capability: tuple[int, int], dtype: str) -> int | None:
    """Return dense FLOPs per clock per SM for a CUDA capability and dtype, or None where unknown/unsupported.

    Introduced in notebook 07.
    """
    name = dtype if dtype == "tf32" else _peak_dtype(dtype)[0]
    row = CUDA_FLOPS_PER_CLOCK_PER_SM.get(tuple(capability))  # type: ignore[arg-type]
    return None if row is None else row.get(name)


def _cpu_cores_in_use() -> tuple[int, str]:
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    cores = set()
    for c in cpus:
        try:
            with open(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list") as fh:
                cores.add(fh.read().strip())
        except OSError:
            cores.add(str(c))
    threads = torch.get_num_threads()
    n = min(len(cores), threads)
    if n != 1:
        text = _("{n} physical cores: {logical} logical CPUs usable, {physical} physical, torch uses {threads} threads")
    elif threads != 1:
        text = _("{n} physical core: {logical} logical CPUs usable, {physical} physical, torch uses {threads} threads")
    else:
        text = _("{n} physical core: {logical} logical CPUs usable, {physical} physical, torch uses {threads} thread")
    return n, text.format(n=n, logical=len(cpus), physical=len(cores), threads=threads)


def _cpu_ghz() -> tuple[float, str]:
    try:
        with open("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq") as fh:
            return int(fh.read()) / 1e6, _("the maximum (turbo) frequency from cpufreq")
    except (OSError, ValueError):
        pass
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("cpu MHz"):
                    return float(line.split(":")[1]) / 1e3, _("the clock /proc/cpuinfo reports (a VM shows its "
                                                              "nominal clock)")
    except (OSError, ValueError):
        pass
    raise ValueError("cannot read the CPU frequency (no cpufreq and no /proc/cpuinfo); pass it in")


def _cpu_vendor_family() -> tuple[str, int | None]:
    """(vendor_id, cpu family) from /proc/cpuinfo; ("", None) where it cannot be read."""
    vendor, family = "", None
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() == "vendor_id" and not vendor:
                    vendor = value.strip()
                elif key.strip() == "cpu family" and family is None:
                    family = int(value.strip())
                if vendor and family is not None:
                    break
    except (OSError, ValueError):
        pass
    return vendor, family


def _default_fma_units(wide: bool) -> tuple[int, str]:
    """How many FMA units of the instruction's width (512-bit when ``wide``, else 256-bit) a core has, and why."""
    vendor, family = _cpu_vendor_family()
    if vendor == "AuthenticAMD" and family is not None and family <= 25:
        if wide:
            return 1, _("1 512-bit FMA unit per core: AMD Zen 4 runs each 512-bit instruction on its two 256-bit "
                        "FMA units, so AVX-512 doubles no FLOPs over AVX2 there")
        return 2, _("2 256-bit FMA units per core (AMD Zen 2 to Zen 4)")
    if vendor == "AuthenticAMD":
        return 2, _("2 FMA units per core (AMD Zen 5 servers have full 512-bit units; some client parts split them)")
    if vendor == "GenuineIntel":
        return 2, _("2 FMA units per core (Xeon Gold/Platinum; some SKUs have 1)")
    return 2, _("2 FMA units per core: an assumption, not read from this CPU (check its documentation)")


def theoretical_peak(dtype: str | torch.dtype = "fp32", device: torch.device | str | None = None,
                     fma_units: int | None = None) -> TheoreticalPeak:
    """Return the theoretical peak FLOP/s from units x frequency x FLOPs per cycle, with the assumptions.

    CPU: physical cores in use x clock x FLOPs/cycle/core from the ISA (:func:`cpu_flops_per_cycle`), with
    ``fma_units`` vector FMA units per core of the instruction's width: by default read from the CPU's vendor and
    family (2 on Intel Xeon Gold/Platinum and AMD Zen 5; on AMD Zen 4, 1 for 512-bit instructions, which it runs
    on its two 256-bit units, and 2 for AVX2).
    CUDA: SM count x max SM clock x dense FLOPs/clock/SM for the architecture
    (:data:`CUDA_FLOPS_PER_CLOCK_PER_SM`). Raises ``ValueError`` for an architecture or dtype the table
    lacks. Introduced in notebook 07.
    """
    name = _peak_dtype(dtype)[0]
    dev = dev_gate.resolve(device, must_exist=False)  # a formula: the GPU may only be described
    if dev_gate.is_cuda(dev):
        props = dev_gate.cuda_properties(dev)
        assert props is not None
        per_sm = cuda_flops_per_clock_per_sm(props["capability"], name)  # type: ignore[arg-type]
        if per_sm is None:
            raise ValueError(f"no FLOPs/clock/SM figure for {name} on compute capability {props['capability']}")
        if not props["clock_khz"]:
            raise ValueError("this torch build does not report the GPU's SM clock")
        ghz = float(props["clock_khz"]) / 1e6  # type: ignore[arg-type]
        sms = int(props["sm_count"])  # type: ignore[arg-type]
        unit = (_("CUDA cores; fp32 here is without TF32") if name == "fp32"
                else _("tensor cores, dense; fp32 here is without TF32"))
        return TheoreticalPeak(name, sms * ghz * 1e9 * per_sm,
                               f"{sms} SMs x {ghz:.2f} GHz x {per_sm} FLOP/clock/SM",
                               (_("{name}, compute capability {capability}").format(name=props["name"],
                                                                                   capability=props["capability"]),
                                unit,
                                _("the maximum SM clock the driver reports; sustained clocks under load are lower"),
                                _("dense math (no 2:4 sparsity)")))
    if dev.type != "cpu":
        raise ValueError(f"theoretical peaks are known for CPU and CUDA devices, not {dev.type}")
    cores, core_note = _cpu_cores_in_use()
    ghz, ghz_note = _cpu_ghz()
    isa = dev_gate.cpu_isa_in_use()
    units_note = ""
    if fma_units is None:
        probe = cpu_flops_per_cycle(name, isa, 1)[1]
        fma_units, units_note = _default_fma_units(wide=not probe.startswith(("AVX2", "SSE")))
    per, unit = cpu_flops_per_cycle(name, isa, fma_units)  # validates a given fma_units
    units_note = units_note or _("{units} FMA units per core (as given)").format(units=fma_units)
    notes = [core_note,
             _("{ghz:.2f} GHz: {source}; AVX-512/AMX code may run at a lower clock").format(ghz=ghz, source=ghz_note),
             _(_cpu_unit(name, set(isa), fma_units)[1]).format(units=fma_units)]
    if "units" in unit:
        notes.append(units_note)
    return TheoreticalPeak(name, cores * ghz * 1e9 * per, f"{cores} cores x {ghz:.2f} GHz x {per} FLOP/cycle",
                           tuple(notes))


def excess_note(theo: TheoreticalPeak, measured_flops: float) -> str:
    """Why ``measured_flops`` exceeds the theoretical peak ``theo``, or ``""`` when it does not.

    A measurement above the formula means an assumption of the formula is wrong, not that the hardware beat physics:
    the clock (turbo above the frequency read, or a VM that shows its nominal clock), or the unit count.
    Introduced in notebook 07.
    """
    if not isinstance(theo, TheoreticalPeak):
        raise TypeError(f"theo must be a TheoreticalPeak, got {type(theo).__name__}")
    if not measured_flops > theo.flops_per_s:
        return ""
    if theo.formula.count(" x ") < 2:
        return _("above the theoretical peak, so an assumption is wrong: the cores ran faster than the clock assumed "
                 "(turbo, or a VM that reports its nominal clock), or they have more units than assumed")
    return _("above the theoretical peak, so an assumption is wrong: the cores ran faster than the {clock} assumed "
             "(turbo, or a VM that reports its nominal clock), or they have more units than assumed").format(
                 clock=theo.formula.split(" x ")[1])


def peak_report(dtypes: Sequence[str] = ("fp32", "bf16", "fp16"), device: torch.device | str | None = None,
                bandwidth_bytes: int = 512 * 2**20, shapes: Sequence[tuple[int, int, int]] | None = None) -> str:
    """Return a printable report: measured vs theoretical peak per dtype, and the measured copy bandwidth.

    dtypes the device cannot compute in are listed as skipped; a dtype it only emulates is measured on one small
    shape (unless ``shapes`` is given) and labelled emulated. Introduced in notebook 07.
    """
    dev = dev_gate.resolve(device)
    lines = [_("labkit peak report on {device} ({name})").format(device=dev,
                                                                 name=dev_gate.capabilities(dev).device_name), ""]
    for name in dtypes:
        dt = _peak_dtype(name)[1]
        if dt != torch.float32 and not dev_gate.computes(dt, dev):
            lines.append(_("{dtype}: skipped ({device} does not compute in {dtype})").format(dtype=name, device=dev))
            continue
        meas = peak_matmul_flops(name, dev, shapes)
        if meas.emulated:
            lines.append(_("{dtype}: not native here (no {dtype} units, or capped by ONEDNN_MAX_CPU_ISA/"
                           "ATEN_CPU_CAPABILITY), so measured on {shapes} shape(s) only: a floor, not a ceiling").format(
                               dtype=name, shapes=len(meas.per_shape)))
        try:
            theo: TheoreticalPeak | None = theoretical_peak(name, dev)
        except ValueError as exc:
            theo, why = None, str(exc)
        shape = "x".join(map(str, meas.shape))
        lines.append(_("{dtype}: measured {gflops:,.1f} GFLOP/s (best shape {shape})").format(
            dtype=name, gflops=meas.flops_per_s / 1e9, shape=shape))
        if theo is None:
            lines.append("  " + _("theoretical: unknown ({why})").format(why=why))
        else:
            lines.append("  " + _("theoretical {gflops:,.1f} GFLOP/s = {formula}  -> measured is {share:.0%} of it").format(
                gflops=theo.flops_per_s / 1e9, formula=theo.formula, share=meas.flops_per_s / theo.flops_per_s))
            lines += ["    " + _("assumes: {assumption}").format(assumption=a) for a in theo.assumptions]
            if excess_note(theo, meas.flops_per_s):
                lines.append("    " + excess_note(theo, meas.flops_per_s))
    bw = memory_bandwidth(bandwidth_bytes, dev)
    lines += ["", _("memory: {gbps:,.1f} GB/s (copy of {mib:.0f} MiB, read + write counted)").format(
        gbps=bw.bytes_per_s / 1e9, mib=bw.nbytes / 2**20)]
    return "\n".join(lines)


# The largest values the command line takes: a typo fails while parsing, not in a giant allocation.
_MAX_MATMUL_N = 32768
_MAX_BATCH = 65536
_MAX_BANDWIDTH_MIB = 16384
# --warmup/--repeats: a thousand times the defaults (a typo of 10**9 would time for days); --threads: more than
# any node's cores (torch would try to start them all).
_MAX_REPEATS = 10_000
_MAX_THREADS = 1024


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m labkit.bench amp [--device D] [--dtypes bf16,fp16] [--size N] [--repeats R]``.

    ``python -m labkit.bench peak [--device D] [--dtypes fp32,bf16,fp16]`` prints measured vs theoretical
    peak FLOP/s and the copy bandwidth (notebook 07). A bad flag value exits with status 2 and one line on
    stderr before anything is measured.

    Introduced in notebook 04.
    """
    from labkit import _cli

    threads, dtypes = _cli.int_in(1, _MAX_THREADS), _cli.choices_list(list(PEAK_DTYPES))
    size = _cli.int_in(1, _MAX_MATMUL_N)
    ap = _cli.ArgumentParser(prog="python -m labkit.bench", description="labkit benchmarks",
                             checks=[_cli.device_env])
    sub = ap.add_subparsers(dest="suite", required=True)
    amp = sub.add_parser("amp", help="bf16 (and fp16) vs fp32: matmul and tiny-GPT train step, one run")
    amp.add_argument("--device", type=_cli.device, default=None,
                     help="cpu, cuda, ... (default: labkit.device.pick_device())")
    amp.add_argument("--dtypes", type=dtypes, default="bf16", help="comma-separated, compared with fp32 (bf16,fp16)")
    amp.add_argument("--size", type=size, default=None,
                     help=f"matmul size n, at most {_MAX_MATMUL_N} (default 1024 CPU, 4096 CUDA)")
    amp.add_argument("--warmup", type=_cli.int_in(0, _MAX_REPEATS), default=3,
                     help=f"untimed runs first, at most {_MAX_REPEATS:,} (default: 3)")
    amp.add_argument("--repeats", type=_cli.int_in(1, _MAX_REPEATS), default=10,
                     help=f"timed runs, the median is reported; at most {_MAX_REPEATS:,} (default: 10)")
    amp.add_argument("--batch-size", type=_cli.int_in(1, _MAX_BATCH), default=64,
                     help=f"tiny-GPT batch size for the train step, at most {_MAX_BATCH}")
    amp.add_argument("--threads", type=threads, default=None,
                     help=f"torch.set_num_threads for a CPU run, at most {_MAX_THREADS:,}")
    peak = sub.add_parser("peak", help="measured vs theoretical peak FLOP/s (fp32, bf16, fp16) and copy bandwidth")
    peak.add_argument("--device", type=_cli.device, default=None,
                      help="cpu, cuda, ... (default: labkit.device.pick_device())")
    peak.add_argument("--dtypes", type=dtypes, default="fp32,bf16,fp16", help="comma-separated peak dtypes")
    peak.add_argument("--bandwidth-mib", type=_cli.int_in(1, _MAX_BANDWIDTH_MIB), default=512,
                      help=f"size of the copied tensor in MiB, at most {_MAX_BANDWIDTH_MIB}")
    peak.add_argument("--sizes", type=_cli.int_list(1, _MAX_MATMUL_N), default=None,
                      help=f"comma-separated square matmul sizes, each at most {_MAX_MATMUL_N} "
                           "(default: a few per device)")
    peak.add_argument("--threads", type=threads, default=None,
                      help=f"torch.set_num_threads for a CPU run, at most {_MAX_THREADS:,}")
    args = ap.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.suite == "peak":
        names = [d.strip() for d in args.dtypes.split(",") if d.strip()]
        shapes = None if args.sizes is None else [(int(v),) * 3 for v in args.sizes.split(",") if v.strip()]
        print(peak_report(names, dev_gate.pick_device(args.device), args.bandwidth_mib * 2**20, shapes))
        return 0
    dev = dev_gate.pick_device(args.device)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    caps = dev_gate.capabilities(dev)
    res = amp_benchmark(dev, dtypes, args.size, args.warmup, args.repeats,
                        train_kwargs={"batch_size": args.batch_size})
    mm, ts = res["matmul"], res["train_step"]
    print(_("device: {device} ({name}); threads {threads}; timer: {timer}; warm-up {warmup}, median of {repeats}, "
            "interleaved").format(device=caps.device, name=caps.device_name, threads=torch.get_num_threads(),
                                  timer=mm.method, warmup=args.warmup, repeats=args.repeats))
    if caps.cpu_isa and dev.type == "cpu":
        print(f"cpu isa: {' '.join(caps.cpu_isa)}")
    print(mm.table(f"matmul {mm.extra['n']}x{mm.extra['n']}"))
    for name, t in mm.timings.items():
        print(f"  {name}: {mm.extra['flops'] / t.median / 1e9:.1f} GFLOP/s")
    print(ts.table(f"tiny-GPT train step (AdamW, batch {args.batch_size})"))
    for name in mm.timings:
        if name != "fp32":
            print(_("{dtype}/fp32 time ratio: matmul {mm_ratio:.2f} (speed-up {mm_speedup:.2f}x), train step "
                    "{step_ratio:.2f} (speed-up {step_speedup:.2f}x)").format(
                        dtype=name, mm_ratio=mm.ratio(name), mm_speedup=mm.speedup(name), step_ratio=ts.ratio(name),
                        step_speedup=ts.speedup(name)))
    missing = [d for d in dtypes if d not in mm.timings]
    if missing:
        print(_("skipped (not supported on {device}): {dtypes}").format(device=dev, dtypes=", ".join(missing)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
