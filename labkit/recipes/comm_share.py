"""Communication's share of a DDP step, before and after ``no_sync()``, and how DDP's buckets overlap it with backward.

Run it under torchrun; rank 0 prints one ``LABKIT_RESULT {json}`` line::

    torchrun --nproc_per_node 2 -m labkit.recipes.comm_share --accum 4 --steps 12 --bucket-caps 25,0.1

Two experiments in one launch (one process group, gloo on CPU ranks):

1. **share**: the same seeded MLP is trained twice with ``--accum`` micro-batches per optimizer step, with
   :func:`labkit.recipes.ddp.train_loop` (notebook 09's loop): first all-reducing after every micro-batch
   (``sync_every_micro``, ``accum`` all-reduces per step), then with ``no_sync()`` on all but the last micro-batch
   (one per step). A DDP communication hook (:func:`timing_hook`) times every all-reduce, from the moment DDP
   hands it the bucket until its future completes; :func:`summarize_share` turns that into all-reduces per step,
   communication time per step and per sample, and communication's share of the step (medians over the steps after
   ``--warmup``). Both runs average the same gradients, so they end with the same weights up to rounding.
2. **buckets**: for each ``bucket_cap_mb`` of ``--bucket-caps`` a fresh DDP wrap of the same model trains
   ``--bucket-steps`` steps (one micro-batch each). On the last step (after DDP has rebuilt its buckets in the
   order gradients became ready, which it does after the first), the hook records for every bucket when its
   all-reduce started, relative to the start of ``backward()``, and how many parameters still had no gradient
   at that moment: a positive count means the all-reduce started while backward was still running, which is
   how DDP overlaps communication with computation. No NCCL setting does that; the buckets do.

The times are host clock times of gloo's CPU all-reduces, so the recipe runs on CPU ranks only. On GPUs NCCL runs
on its own CUDA stream and a host clock sees when work was queued, not when it ran: measure there with
``torch.profiler`` or Nsight Systems.

Introduced in notebook 09.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from labkit._validate import check_int, safe_repr

__all__ = ["build_parser", "main", "summarize_share", "timing_hook"]

# --steps, --accum and friends: enough for any lesson, small enough that a typo cannot run for hours.
_MAX_STEPS = 10_000
_MAX_ACCUM = 1024
_MAX_CAPS = 8
_EVENT_KEYS = ("step", "index", "start", "end", "missing", "tensors", "bytes")


def timing_hook(log: list[dict[str, Any]], params: Sequence[Any], state: dict[str, Any]) -> Callable[..., Any]:
    """Return a DDP communication hook that all-reduces a bucket (mean over ranks) and logs it in ``log``.

    Each call appends ``{"step", "index", "start", "end", "missing", "tensors", "bytes"}``: ``step`` is
    ``state["step"]`` at that moment, ``index`` the bucket's index, ``start`` the ``time.perf_counter()`` when DDP
    handed the bucket over, ``end`` when the all-reduce's future completed (filled in later, by the future's
    callback), ``missing`` how many of ``params`` had no gradient yet (``p.grad is None``), ``tensors`` and
    ``bytes`` the bucket's size. Register it with ``ddp.register_comm_hook(None, hook)``.
    Introduced in notebook 09.
    """
    import torch

    if not isinstance(log, list):
        raise TypeError(f"log must be a list, got {type(log).__name__}")
    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict, got {type(state).__name__}")
    params = list(params)  # TypeError if not iterable
    if not all(isinstance(p, torch.Tensor) for p in params):
        raise TypeError("params must be a sequence of tensors (the model's parameters)")
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    def hook(_unused, bucket):  # type: ignore[no-untyped-def]  # DDP rejects string annotations on hooks
        buf = bucket.buffer()
        rec = {"step": state.get("step", 0), "index": bucket.index(), "start": time.perf_counter(), "end": None,
               "missing": sum(p.grad is None for p in params), "tensors": len(bucket.gradients()),
               "bytes": buf.numel() * buf.element_size()}
        log.append(rec)

        def done(fut):  # type: ignore[no-untyped-def]
            rec["end"] = time.perf_counter()
            return fut.value()

        return default_hooks.allreduce_hook(None, bucket).then(done)  # type: ignore[arg-type]

    return hook


def summarize_share(events: Sequence[dict[str, Any]], steps: Sequence[tuple[float, float]], samples_per_step: int,
                    warmup: int = 2) -> dict[str, Any]:
    """Summarise one run's all-reduces: counts per step, communication time and its share of the step.

    ``events`` are :func:`timing_hook`'s records, ``steps`` the ``(start, end)`` clock times of each optimizer step
    (step ``i`` owns the events with ``"step": i``), ``samples_per_step`` the samples one step processes on all
    ranks together. ``allreduces_per_step`` counts every step; the times are medians over the steps after the
    first ``warmup``: ``comm_s`` (the sum of that step's all-reduce durations), ``step_s``, ``share``
    (``comm_s / step_s`` per step) and ``comm_s_per_sample``. ``comm_s_min`` and ``comm_s_per_sample_min`` take the
    step with the least communication instead: a busy machine can only add time (a rank that waits for a core
    makes its partner wait inside the all-reduce), so the minimum is the robust figure to compare two runs by.
    Introduced in notebook 09.
    """
    steps = list(steps)
    check_int("samples_per_step", samples_per_step, 1)
    check_int("warmup", warmup, 0)
    if len(steps) <= warmup:
        raise ValueError(f"need more than warmup={warmup} steps to time, got {len(steps)}")
    for s in steps:
        if not (isinstance(s, (tuple, list)) and len(s) == 2 and all(isinstance(v, (int, float)) for v in s)
                and s[1] > s[0]):
            raise ValueError(f"each step must be a (start, end) pair of clock times with end > start, got {safe_repr(s)}")
    per_step: list[list[float]] = [[] for _ in steps]
    for e in events:
        if not isinstance(e, dict) or any(k not in e for k in _EVENT_KEYS):
            raise ValueError(f"each event must be a timing_hook record with keys {_EVENT_KEYS}, got {safe_repr(e)}")
        if isinstance(e["step"], bool) or not isinstance(e["step"], int) or not 0 <= e["step"] < len(steps):
            raise ValueError(f"an event names step {safe_repr(e['step'])}, outside the {len(steps)} steps given")
        if e["end"] is None or not e["end"] >= e["start"]:
            raise ValueError(f"an all-reduce that never completed, or ended before it started: {safe_repr(e)}")
        per_step[e["step"]].append(float(e["end"] - e["start"]))
    total = sum(len(d) for d in per_step)
    comm = [sum(d) for d in per_step[warmup:]]
    dur = [end - start for start, end in steps[warmup:]]
    return {"steps": len(steps), "timed_steps": len(dur), "allreduces": total,
            "allreduces_per_step": total // len(steps) if total % len(steps) == 0 else total / len(steps),
            "comm_s": statistics.median(comm), "step_s": statistics.median(dur),
            "share": statistics.median(c / d for c, d in zip(comm, dur)),
            "comm_s_per_sample": statistics.median(comm) / samples_per_step,
            "comm_s_min": min(comm), "comm_s_per_sample_min": min(comm) / samples_per_step}


def build_parser() -> argparse.ArgumentParser:
    """Return the command-line parser (documented with ``--help``).

    Bad values are rejected while parsing (exit status 2, one line on stderr). Introduced in notebook 09.
    """
    from labkit import _cli

    ap = _cli.ArgumentParser(
        prog="python -m labkit.recipes.comm_share", checks=[_cli.launcher_env],
        description="Communication's share of a DDP step with and without no_sync(), and DDP's gradient buckets "
                    "(CPU ranks, gloo). Run under torchrun; rank 0 prints one LABKIT_RESULT {json} line.")
    ap.add_argument("--hidden", type=_cli.int_in(1, 4096), default=256, help="MLP width (default: 256)")
    ap.add_argument("--depth", type=_cli.int_in(1, 64), default=3, help="MLP hidden layers (default: 3)")
    ap.add_argument("--batch", type=_cli.int_in(1, 4096), default=16, help="micro-batch per rank (default: 16)")
    ap.add_argument("--accum", type=_cli.int_in(2, _MAX_ACCUM), default=4,
                    help=f"micro-batches per optimizer step, 2 to {_MAX_ACCUM} (default: 4)")
    ap.add_argument("--steps", type=_cli.int_in(3, _MAX_STEPS), default=12,
                    help=f"optimizer steps per run, 3 to {_MAX_STEPS:,} (default: 12)")
    ap.add_argument("--warmup", type=_cli.int_in(0, _MAX_STEPS), default=2,
                    help="steps left out of the timing medians, fewer than --steps (default: 2)")
    ap.add_argument("--bucket-caps", default="25,0.1", type=_caps,
                    help=f"comma-separated bucket_cap_mb values (MiB, > 0), at most {_MAX_CAPS} (default: 25,0.1)")
    ap.add_argument("--bucket-steps", type=_cli.int_in(2, 100), default=3,
                    help="steps per bucket run; the last one is recorded (default: 3)")
    ap.add_argument("--seed", type=_cli.int_in(0, 2**32 - 1), default=0, help="model and data seed (default: 0)")
    ap.add_argument("--pg-timeout", type=_cli.pg_timeout, default=60.0,
                    help="process-group timeout in seconds, at most a week (default: 60)")
    return ap


def _caps(text: str) -> str:
    """``type=`` for ``--bucket-caps``: comma-separated positive finite numbers of MiB; returns the text."""
    from labkit import _cli

    items = [s for s in text.split(",") if s.strip()]
    if not 1 <= len(items) <= _MAX_CAPS:
        raise _cli.BadValue(f"expected 1 to {_MAX_CAPS} comma-separated sizes in MiB, got {safe_repr(text)}")
    for item in items:
        _cli.float_in(0.0, 1024.0, low_open=True)(item)
    return text


def _data(args: argparse.Namespace, rank: int, world: int) -> tuple[Any, Any]:
    """This rank's shard of the seeded regression data: enough micro-batches for every run, cycled."""
    from labkit import data

    n = args.batch * world * args.accum * 4
    x, y = data.make_regression(n=n, in_features=16, seed=args.seed)
    return x[rank::world], y[rank::world]


def _batches(x: Any, y: Any, batch: int) -> Any:
    """Yield (x, y) micro-batches of ``batch`` rows, in order, for ever (the same order in every run)."""
    i = 0
    while True:
        if i + batch > len(x):
            i = 0
        yield x[i:i + batch], y[i:i + batch]
        i += batch


def _share_run(args: argparse.Namespace, xy: tuple[Any, Any], world: int, no_sync: bool) -> tuple[dict, Any]:
    """Train ``--steps`` steps of ``--accum`` micro-batches; return the summary and the final parameters."""
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from labkit import models, precision, train
    from labkit.recipes.ddp import train_loop

    model = models.MLP(16, args.hidden, 1, depth=args.depth, activation="gelu", seed=args.seed)
    opt = train.make_optimizer(model.parameters(), "adamw", lr=3e-3)
    ddp = DDP(model)
    log: list[dict[str, Any]] = []
    state = {"step": 0}
    ddp.register_comm_hook(None, timing_hook(log, list(model.parameters()), state))
    steps: list[tuple[float, float]] = []
    t0 = time.perf_counter()
    for step, _loss, _info in train_loop(ddp, opt, None, precision.get_policy("fp32"), _batches(*xy, args.batch),
                                         F.mse_loss, args.steps, args.accum, sync_every_micro=not no_sync):
        t1 = time.perf_counter()
        steps.append((t0, t1))
        state["step"], t0 = step + 1, t1
    summary = summarize_share(log, steps, args.batch * world * args.accum, warmup=args.warmup)
    return summary, [p.detach().clone() for p in model.parameters()]


def _bucket_run(args: argparse.Namespace, xy: tuple[Any, Any], cap_mb: float) -> dict[str, Any]:
    """Train ``--bucket-steps`` steps with ``bucket_cap_mb=cap_mb``; return the last step's buckets."""
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from labkit import models, train

    model = models.MLP(16, args.hidden, 1, depth=args.depth, activation="gelu", seed=args.seed)
    opt = train.make_optimizer(model.parameters(), "adamw", lr=3e-3)
    ddp = DDP(model, bucket_cap_mb=cap_mb)
    log: list[dict[str, Any]] = []
    state = {"step": 0}
    params = list(model.parameters())
    ddp.register_comm_hook(None, timing_hook(log, params, state))
    batches = _batches(*xy, args.batch)
    for step in range(args.bucket_steps):
        state["step"] = step
        opt.zero_grad(set_to_none=True)
        x, y = next(batches)
        loss = F.mse_loss(ddp(x), y)
        t_bwd = time.perf_counter()
        loss.backward()  # DDP's hooks launch each bucket's all-reduce as soon as its gradients exist
        t_done = time.perf_counter()  # backward() returns once every bucket's all-reduce has finished
        opt.step()
    last = [e for e in log if e["step"] == args.bucket_steps - 1]
    return {"bucket_cap_mb": cap_mb, "params": len(params),
            "buckets": [{"index": e["index"], "tensors": e["tensors"], "bytes": e["bytes"], "missing": e["missing"],
                         "start_ms": (e["start"] - t_bwd) * 1e3, "end_ms": (e["end"] - t_bwd) * 1e3}
                        for e in last],
            "backward_ms": (t_done - t_bwd) * 1e3}


def main(argv: Sequence[str] | None = None) -> int:
    """Run both experiments on this rank and print the result on rank 0; return the exit status.

    Introduced in notebook 09.
    """
    import torch
    import torch.distributed as dist

    from labkit import dist as ldist

    args = build_parser().parse_args(argv)
    if args.warmup >= args.steps:
        raise ValueError(f"--warmup {args.warmup} leaves no step of --steps {args.steps} to time")
    torch.set_num_threads(1)
    renv = ldist.init_process_group("gloo", timeout_s=args.pg_timeout)
    rank, world = renv.rank, renv.world_size
    try:
        xy = _data(args, rank, world)
        sync, p_sync = _share_run(args, xy, world, no_sync=False)
        nosync, p_nosync = _share_run(args, xy, world, no_sync=True)
        diff = max(float((a - b).abs().max()) for a, b in zip(p_sync, p_nosync))
        caps = [float(c) for c in args.bucket_caps.split(",") if c.strip()]
        buckets = [_bucket_run(args, xy, c) for c in caps]
        mine = {"sync": sync, "no_sync": nosync, "param_diff": diff, "buckets": buckets}
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, mine)
        if rank == 0:
            ldist.emit_result({
                "recipe": "comm_share", "backend": dist.get_backend(), "world_size": world,
                "launcher": renv.launcher, "params": sum(p.numel() for p in p_sync),
                "batch_per_rank": args.batch, "accum": args.accum, "steps": args.steps, "warmup": args.warmup,
                "samples_per_step": args.batch * world * args.accum,
                "sync": [g["sync"] for g in gathered], "no_sync": [g["no_sync"] for g in gathered],
                "param_diff": max(g["param_diff"] for g in gathered),
                "buckets": gathered[0]["buckets"], "buckets_per_rank": [g["buckets"] for g in gathered]})
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    build_parser().parse_args()  # --help and a bad flag answer at once, before torch is imported
    from labkit.dist import run_rank_main

    run_rank_main(main)  # flushes, then exits without C++ teardown (see its docstring)
