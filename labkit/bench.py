"""Benchmarks done right: warm up, take the median of repeats, and measure ratios in the same run.

- :func:`time_fn` times one callable: ``warmup`` untimed calls, then ``repeats`` timed ones; the
  median is reported (robust to the odd slow repeat on a shared machine).
- :func:`compare` times several candidates *interleaved* (repeat 1 of every candidate, then repeat 2 …,
  with the order rotated each round), so a machine that speeds up or slows down during the run affects
  every candidate alike, and reports each one's time relative to a baseline.
- On CUDA each call is timed with CUDA events (``labkit.device.event_timer``); elsewhere with
  ``time.perf_counter`` around the call followed by ``labkit.device.synchronize``.
- :func:`amp_benchmark` measures bf16 (and optionally fp16) against fp32 for a matmul and for a tiny-GPT
  training step; ``python -m labkit.bench amp`` prints it.

Introduced in notebook 04.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from labkit import device as _device

__all__ = [
    "Comparison",
    "Timing",
    "amp_benchmark",
    "compare",
    "main",
    "matmul_candidates",
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
            raise ValueError(f"unknown candidate {name!r}; have {list(self.timings)}")
        return self.timings[name].median / self.timings[self.baseline].median

    def speedup(self, name: str) -> float:
        """Baseline time divided by the time of ``name`` (above 1: faster). Introduced in notebook 04."""
        return 1.0 / self.ratio(name)

    def table(self, title: str = "") -> str:
        """Return a plain-text table: candidate, median, spread, ratio to the baseline. Introduced in notebook 04."""
        rows = [title] if title else []
        rows.append(f"{'candidate':<12} {'median':>12} {'spread':>8} {'time / ' + self.baseline:>14}")
        for name, t in self.timings.items():
            rows.append(f"{name:<12} {_fmt_time(t.median):>12} {t.spread:>7.0%} {self.ratio(name):>14.2f}")
        return "\n".join(rows)


def _fmt_time(s: float) -> str:
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.1f} us"


def _check_counts(warmup: int, repeats: int) -> None:
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")


def _timer(dev: torch.device) -> tuple[Callable[[Callable[[], Any]], float], str]:
    events = _device.event_timer(dev)
    if events is not None:
        return events, "cuda events"

    def timer(fn: Callable[[], Any]) -> float:
        _device.synchronize(dev)
        t0 = time.perf_counter()
        fn()
        _device.synchronize(dev)
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
            raise TypeError(f"candidate {k!r} is not callable")
    baseline = next(iter(candidates)) if baseline is None else baseline
    if baseline not in candidates:
        raise ValueError(f"baseline {baseline!r} is not one of {list(candidates)}")
    _check_counts(warmup, repeats)
    dev = _device.pick_device() if device is None else torch.device(device)
    timer, method = _timer(dev)
    names = list(candidates)
    for _ in range(warmup):
        for n in names:
            candidates[n]()
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        order = names[r % len(names):] + names[: r % len(names)]
        for n in order:
            times[n].append(timer(candidates[n]))
    timings = {n: Timing(n, tuple(times[n]), warmup, method) for n in names}
    return Comparison(timings, baseline, method)


_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _dtypes_for(dev: torch.device, names: Sequence[str]) -> list[str]:
    out = []
    for n in names:
        if n not in _DTYPES:
            raise ValueError(f"unknown dtype {n!r}; choose from {list(_DTYPES)}")
        if n == "fp32" or _device.supports(_DTYPES[n], dev):
            out.append(n)
    return out


def matmul_candidates(
    n: int, dtypes: Sequence[str] = ("fp32", "bf16"), device: torch.device | str | None = None, seed: int = 0
) -> dict[str, Callable[[], Any]]:
    """Return ``{dtype: fn}`` where ``fn()`` multiplies two n x n matrices stored in that dtype.

    Dtypes the device cannot compute in are left out. Introduced in notebook 04.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    dev = _device.pick_device() if device is None else torch.device(device)
    g = torch.Generator().manual_seed(seed)
    a32, b32 = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    cands: dict[str, Callable[[], Any]] = {}
    for name in _dtypes_for(dev, dtypes):
        a, b = a32.to(dev, _DTYPES[name]), b32.to(dev, _DTYPES[name])
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

    dev = _device.pick_device() if device is None else torch.device(device)
    task = data.make_token_task("reverse", n=batch_size, n_digits=8, vocab_size=16, seed=seed)
    x, y = task.inputs.to(dev), task.targets.to(dev)
    cands: dict[str, Callable[[], Any]] = {}
    for name in _dtypes_for(dev, dtypes):
        model = models.TinyGPT(vocab_size=task.vocab_size, seq_len=task.seq_len, d_model=d_model,
                               n_layers=n_layers, seed=seed).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        scaler = torch.amp.GradScaler(dev.type) if name == "fp16" else None
        dtype = _DTYPES[name]

        def step(model=model, opt=opt, scaler=scaler, dtype=dtype) -> None:
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device_type=dev.type, dtype=dtype, enabled=dtype != torch.float32):
                loss = models.lm_loss(model(x), y)
            if scaler is None:
                loss.backward()
                opt.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()

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
    ``matmul_size`` defaults to 1024 on CPU and 4096 on CUDA. Introduced in notebook 04.
    """
    dev = _device.pick_device() if device is None else torch.device(device)
    dtypes = list(dict.fromkeys(["fp32", *dtypes]))
    n = matmul_size if matmul_size is not None else (4096 if dev.type == "cuda" else 1024)
    mm = compare(matmul_candidates(n, dtypes, dev), baseline="fp32", warmup=warmup, repeats=repeats, device=dev)
    mm.extra["n"] = n
    mm.extra["flops"] = 2 * n**3
    ts = compare(train_step_candidates(dtypes, dev, **(train_kwargs or {})), baseline="fp32", warmup=warmup,
                 repeats=repeats, device=dev)
    return {"matmul": mm, "train_step": ts}


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m labkit.bench amp [--device D] [--dtypes bf16,fp16] [--size N] [--repeats R]``.

    Introduced in notebook 04.
    """
    ap = argparse.ArgumentParser(prog="python -m labkit.bench", description="labkit benchmarks")
    sub = ap.add_subparsers(dest="suite", required=True)
    amp = sub.add_parser("amp", help="bf16 (and fp16) vs fp32: matmul and tiny-GPT train step, one run")
    amp.add_argument("--device", default=None, help="cpu, cuda, ... (default: labkit.device.pick_device())")
    amp.add_argument("--dtypes", default="bf16", help="comma-separated, compared with fp32 (bf16,fp16)")
    amp.add_argument("--size", type=int, default=None, help="matmul size n (default 1024 CPU, 4096 CUDA)")
    amp.add_argument("--warmup", type=int, default=3)
    amp.add_argument("--repeats", type=int, default=10)
    amp.add_argument("--batch-size", type=int, default=64, help="tiny-GPT batch size for the train step")
    amp.add_argument("--threads", type=int, default=None, help="torch.set_num_threads for a CPU run")
    args = ap.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    dev = _device.pick_device(args.device)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    caps = _device.capabilities(dev)
    res = amp_benchmark(dev, dtypes, args.size, args.warmup, args.repeats,
                        train_kwargs={"batch_size": args.batch_size})
    mm, ts = res["matmul"], res["train_step"]
    print(f"device: {caps.device} ({caps.device_name}); threads {torch.get_num_threads()}; "
          f"timer: {mm.method}; warm-up {args.warmup}, median of {args.repeats}, interleaved")
    if caps.cpu_isa and dev.type == "cpu":
        print(f"cpu isa: {' '.join(caps.cpu_isa)}")
    print(mm.table(f"matmul {mm.extra['n']}x{mm.extra['n']}"))
    for name, t in mm.timings.items():
        print(f"  {name}: {mm.extra['flops'] / t.median / 1e9:.1f} GFLOP/s")
    print(ts.table(f"tiny-GPT train step (AdamW, batch {args.batch_size})"))
    for name in mm.timings:
        if name != "fp32":
            print(f"{name}/fp32 time ratio: matmul {mm.ratio(name):.2f} (speed-up {mm.speedup(name):.2f}x), "
                  f"train step {ts.ratio(name):.2f} (speed-up {ts.speedup(name):.2f}x)")
    missing = [d for d in dtypes if d not in mm.timings]
    if missing:
        print(f"skipped (not supported on {dev}): {', '.join(missing)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
