"""An all-reduce benchmark over message sizes, reporting algbw and busbw as nccl-tests defines them.

Run it under torchrun (or ``srun``); rank 0 prints one ``LABKIT_RESULT {json}`` line::

    torchrun --nproc_per_node 2 -m labkit.recipes.allreduce --sizes 4K,64K,1M,16M --iters 20

For a message of ``S`` bytes that takes ``t`` seconds (median over repeats, slowest rank):

- ``algbw = S / t`` — the "algorithm bandwidth", what the caller sees;
- ``busbw = algbw * 2 (n - 1) / n`` for ``n`` ranks — the "bus bandwidth". A ring all-reduce moves
  ``2 (n - 1) / n * S`` bytes through every rank's link, so busbw is comparable with the link's
  hardware bandwidth and does not depend on ``n`` (see nccl-tests' doc/PERFORMANCE.md).

The backend comes from :func:`labkit.device.dist_backend`: gloo on CPU, NCCL on CUDA.

Introduced in notebook 09.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from collections.abc import Sequence
from typing import Any

from labkit._validate import MAX_WORLD_SIZE, as_float, check_int, safe_repr

__all__ = ["DEFAULT_SIZES", "algbw", "busbw", "busbw_factor", "format_size", "main", "parse_size",
           "run_benchmark"]

#: Message sizes the benchmark uses when none are given (bytes).
DEFAULT_SIZES = (1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22)

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
          "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}


def parse_size(text: str | int) -> int:
    """Parse a message size such as ``"64K"``, ``"4MiB"`` or ``1024`` into bytes (binary units).

    Introduced in notebook 09.
    """
    if isinstance(text, bool):
        raise TypeError("size must be an int or a str such as '64K', not a bool")
    if isinstance(text, int):
        n = text
    elif isinstance(text, str):
        m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
        if not m or m.group(2).upper() not in _UNITS:
            raise ValueError(f"cannot parse size {safe_repr(text)}; use e.g. 1024, '64K', '4M', '1G'")
        n = int(m.group(1)) * _UNITS[m.group(2).upper()]
    else:
        raise TypeError(f"size must be an int or a str such as '64K', got {type(text).__name__}")
    if n < 1:
        raise ValueError(f"size must be at least 1 byte, got {n}")
    return n


def format_size(nbytes: int) -> str:
    """Format a byte count with a binary unit: ``format_size(65536) == "64K"``. Introduced in notebook 09."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise ValueError(f"nbytes must be an int >= 0, got {safe_repr(nbytes)}")
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}B"


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {safe_repr(value)}")
    return as_float(name, value)


def algbw(nbytes: int, seconds: float) -> float:
    """Return the algorithm bandwidth in GB/s (1e9 bytes/s): message bytes over the time one op takes.

    Introduced in notebook 09.
    """
    return _positive("nbytes", nbytes) / _positive("seconds", seconds) / 1e9


def busbw_factor(world_size: int) -> float:
    """Return nccl-tests' all-reduce bus-bandwidth factor ``2 (n - 1) / n`` for ``n`` ranks.

    Introduced in notebook 09.
    """
    check_int("world_size", world_size, 1, MAX_WORLD_SIZE)
    return 2.0 * (world_size - 1) / world_size


def busbw(algbw_gbps: float, world_size: int) -> float:
    """Return the all-reduce bus bandwidth ``algbw * 2 (n - 1) / n`` (same unit as ``algbw_gbps``).

    Introduced in notebook 09.
    """
    if isinstance(algbw_gbps, bool) or not isinstance(algbw_gbps, (int, float)):
        raise TypeError(f"algbw must be a number, got {type(algbw_gbps).__name__}")
    if not algbw_gbps >= 0:
        raise ValueError(f"algbw must be >= 0, got {safe_repr(algbw_gbps)}")
    return as_float("algbw", algbw_gbps) * busbw_factor(world_size)


def run_benchmark(sizes: Sequence[int], iters: int = 20, warmup: int = 5, repeats: int = 3,
                  dtype_name: str = "float32", device: Any = None) -> dict[str, Any]:
    """Time all-reduce (sum) for each message size in the initialised process group; return the table.

    Every rank takes the median over ``repeats`` of the mean time of ``iters`` back-to-back calls
    (after ``warmup`` calls); the slowest rank's time is reported. ``device`` is where the buffers
    live (default CPU; pass this rank's CUDA device for NCCL). Each size is also checked for
    correctness (every rank contributes ``rank + 1``; the sum must be ``n (n + 1) / 2``).

    Introduced in notebook 09.
    """
    import torch
    import torch.distributed as dist

    from labkit import device as dev_gate
    from labkit import precision

    for name, v, low, top in (("iters", iters, 1, _MAX_ITERS), ("warmup", warmup, 0, _MAX_ITERS),
                              ("repeats", repeats, 1, _MAX_REPEATS)):
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= top:
            raise ValueError(f"{name} must be an int between {low} and {top:,}, got {safe_repr(v)}")
    if not isinstance(dtype_name, str) or dtype_name not in ("float32", "float16", "bfloat16"):
        raise ValueError(f"dtype must be float32, float16 or bfloat16, got {safe_repr(dtype_name)}")
    given, sizes = sizes, [] if isinstance(sizes, (str, bytes)) else list(sizes)
    if not sizes or not all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= _MAX_SIZE for v in sizes):
        raise ValueError(f"sizes must be a non-empty sequence of byte counts from 1 to {format_size(_MAX_SIZE)} "
                         f"(see parse_size), got {safe_repr(given)}")
    if device is not None and not isinstance(device, (str, torch.device)):
        raise TypeError(f"device must be a torch.device, a str or None, got {type(device).__name__}")
    # the arguments are checked first; the process group is the caller's environment, not an argument
    if not dist.is_initialized():
        raise RuntimeError("run_benchmark needs an initialised process group (run under torchrun)")
    dtype = precision.dtype(dtype_name)
    rank, n = dist.get_rank(), dist.get_world_size()
    backend = dist.get_backend()
    device = torch.device("cpu") if device is None else torch.device(device)
    elem = dtype.itemsize
    rows = []
    for size in sizes:
        count = max(1, int(size) // elem)
        nbytes = count * elem
        buf = torch.full((count,), float(rank + 1), dtype=dtype, device=device)
        dist.all_reduce(buf)
        dev_gate.synchronize(device)
        correct = bool((buf == n * (n + 1) / 2).all().item())
        for _ in range(warmup):
            dist.all_reduce(buf)
        dev_gate.synchronize(device)
        per_op = []
        for _ in range(repeats):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(buf)
            dev_gate.synchronize(device)
            per_op.append((time.perf_counter() - t0) / iters)
        t_local = torch.tensor([statistics.median(per_op)], dtype=torch.float64, device=device)
        dist.all_reduce(t_local, op=dist.ReduceOp.MAX)
        t = float(t_local.item())
        a = algbw(nbytes, t)
        rows.append({"bytes": nbytes, "size": format_size(nbytes), "count": count, "time_us": t * 1e6,
                     "algbw_GBps": a, "busbw_GBps": busbw(a, n), "correct": correct})
    return {"recipe": "allreduce", "backend": backend, "world_size": n, "device": str(device),
            "dtype": dtype_name, "iters": iters, "warmup": warmup, "repeats": repeats,
            "busbw_factor": busbw_factor(n), "rows": rows}


# The largest message --sizes takes (64 GiB): a typo such as 999G fails while parsing, not in an allocation.
_MAX_SIZE = 1 << 36
# The most all-reduces per repeat (and warm-up) and repeats: 500 and 30 times nccl-tests' defaults (20 iterations,
# 5 warm-up). Every size runs them all: at the largest sizes a typo of 10**9 would run for days.
_MAX_ITERS = 10_000
_MAX_REPEATS = 100


def _sizes(text: str) -> str:
    """``type=`` for ``--sizes``: comma-separated sizes that :func:`parse_size` reads; returns the text."""
    from labkit import _cli

    items = [s for s in text.split(",") if s.strip()]
    if not items:
        raise _cli.BadValue(f"expected comma-separated sizes such as 4K,64K,1M, got {safe_repr(text)}")
    for item in items:
        try:
            n = parse_size(item)
        except ValueError as exc:
            raise _cli.BadValue(str(exc)) from None
        if n > _MAX_SIZE:
            raise _cli.BadValue(f"sizes up to {format_size(_MAX_SIZE)} are taken, got {item.strip()}")
    return text


def build_parser() -> argparse.ArgumentParser:
    """Return the command-line parser (documented with ``--help``).

    Bad values are rejected while parsing (exit status 2, one line on stderr). Introduced in notebook 09.
    """
    from labkit import _cli

    ap = _cli.ArgumentParser(
        prog="python -m labkit.recipes.allreduce", checks=[_cli.launcher_env],
        description="All-reduce benchmark: algbw and busbw per message size (nccl-tests definitions). "
                    "Run under torchrun or srun; rank 0 prints one LABKIT_RESULT {json} line.")
    ap.add_argument("--sizes", type=_sizes, default=",".join(format_size(s) for s in DEFAULT_SIZES),
                    help="comma-separated message sizes in bytes, binary units allowed (default: %(default)s)")
    ap.add_argument("--iters", type=_cli.int_in(1, _MAX_ITERS), default=20,
                    help=f"timed all-reduces per repeat, at most {_MAX_ITERS:,} (default: 20)")
    ap.add_argument("--warmup", type=_cli.int_in(0, _MAX_ITERS), default=5,
                    help=f"untimed all-reduces first, at most {_MAX_ITERS:,} (default: 5)")
    ap.add_argument("--repeats", type=_cli.int_in(1, _MAX_REPEATS), default=3,
                    help=f"repeats, at most {_MAX_REPEATS}; the median is reported (default: 3)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--device", type=_cli.device, default=None,
                    help="cpu or cuda (default: labkit.device.pick_device())")
    ap.add_argument("--pg-timeout", type=_cli.pg_timeout, default=60.0,
                    help="process-group timeout in seconds, at most a week (default: 60)")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark in this rank and print the result on rank 0; return the exit status.

    Introduced in notebook 09.
    """
    from labkit import dist as ldist

    args = build_parser().parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    if not sizes:
        raise ValueError("--sizes is empty")
    with ldist.joined(args.device, timeout_s=args.pg_timeout) as (dev, renv):
        result = run_benchmark(sizes, iters=args.iters, warmup=args.warmup, repeats=args.repeats,
                               dtype_name=args.dtype, device=dev)
        result["launcher"] = renv.launcher
        if renv.rank == 0:
            ldist.emit_result(result)
    return 0


if __name__ == "__main__":
    build_parser().parse_args()  # --help and a bad flag answer at once, before torch is imported
    from labkit.dist import run_rank_main

    run_rank_main(main)  # flushes, then exits without C++ teardown (see its docstring)
