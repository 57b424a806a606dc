"""Communication patterns by hand: a parameter server and a ring all-reduce, and BatchNorm across ranks.

Run it under torchrun (any number of ranks; notebook 14 uses 4); rank 0 prints one ``LABKIT_RESULT {json}`` line::

    torchrun --nproc_per_node 4 -m labkit.recipes.comm_patterns --device cpu

Two parts, each checked against the real thing in the same processes:

- ``allreduce``: :func:`ps_allreduce` (every rank sends its tensor to rank 0, which sums and sends the sum back)
  and :func:`ring_allreduce` (reduce-scatter, then all-gather, around a ring), both written with point-to-point
  send/recv, against ``dist.all_reduce``. The bytes each rank sent and received are read from ``torch.profiler``'s
  ``send``/``recv`` events (:func:`labkit.handpar.recorded_collectives`), not counted by this code, so they can be
  compared with the formulas: the server sends and receives (p-1)·N bytes and a worker N; every ring rank
  2(p-1)/p·N.
- ``batchnorm``: one BatchNorm1d step on p ranks with ``--batch`` rows each, three ways: local statistics
  (``torch.nn.BatchNorm1d`` on each rank's rows, what DDP does by default), statistics all-reduced by hand
  (:func:`sync_batch_norm`), and, for reference, one process with all p·batch rows. Outputs, input gradients and
  running statistics are compared with the reference. ``torch.nn.SyncBatchNorm`` is tried too: torch runs it only
  on accelerators (it raises ValueError for CPU tensors), and the result says which happened.

The backend comes from :func:`labkit.device.dist_backend`: gloo on CPU, NCCL on CUDA.

Introduced in notebook 14.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from labkit._validate import safe_repr

__all__ = ["build_parser", "main", "ps_allreduce", "ring_allreduce", "sync_batch_norm"]

#: The largest --elements (64 Mi fp32 values, 256 MiB per rank) and --batch / --channels the recipe takes.
_MAX_ELEMENTS = 1 << 26
_MAX_ROWS = 1 << 16


def _check_tensor(what: str, x: Any) -> None:
    """``x`` must be a dense floating-point tensor with values."""
    import torch

    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what} takes a torch.Tensor, got {type(x).__name__}")
    if x.layout != torch.strided or x.is_meta or not x.is_floating_point():
        raise ValueError(f"{what} takes a dense floating-point tensor with values, got {safe_repr(x)}")


def _require_group(what: str) -> None:
    """A process group must exist: the environment, checked after the arguments."""
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError(f"{what} needs an initialised process group (run it under torchrun)")


def _group_ready(what: str, x: Any) -> None:
    """Check the tensor ``x``, then that a process group exists."""
    _check_tensor(what, x)
    _require_group(what)


def _check_bn(x: Any, bn: Any) -> None:
    """The arguments of :func:`sync_batch_norm`: a (rows, channels) tensor and a BatchNorm1d that fits it."""
    from torch import nn

    _check_tensor("sync_batch_norm", x)
    if not isinstance(bn, nn.BatchNorm1d) or not (bn.affine and bn.track_running_stats) or bn.momentum is None:
        raise TypeError("bn must be a torch.nn.BatchNorm1d with affine=True, track_running_stats=True and a "
                        f"momentum, got {safe_repr(bn)}")
    if not bn.training:
        raise ValueError("bn is in eval mode: there BatchNorm uses its running statistics, nothing to synchronise")
    if x.dim() != 2 or x.shape[1] != bn.num_features or x.shape[0] < 1:
        raise ValueError(f"x must have shape (rows >= 1, {bn.num_features}), got {tuple(x.shape)}")
    _require_group("sync_batch_norm")


def ps_allreduce(x: Any) -> Any:
    """Sum ``x`` over all ranks through a parameter server on rank 0; every rank gets the sum.

    The workers send their tensor to rank 0, which adds them to its own and sends the total back to each: the
    server receives and sends (p-1)·N bytes, a worker sends N and receives N. Introduced in notebook 14.
    """
    import torch.distributed as dist

    _group_ready("ps_allreduce", x)
    rank, p = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        total, buf = x.contiguous().clone(), x.new_empty(x.shape)   # send and recv need contiguous tensors
        for src in range(1, p):          # the server receives every worker's tensor ...
            dist.recv(buf, src=src)
            total += buf
        for dst in range(1, p):          # ... and sends the sum back to each of them
            dist.send(total, dst=dst)
        return total
    dist.send(x.contiguous(), dst=0)     # a worker sends N bytes up
    total = x.new_empty(x.shape)
    dist.recv(total, src=0)              # and receives N bytes back
    return total


def ring_allreduce(x: Any) -> Any:
    """Sum ``x`` over all ranks with a ring all-reduce: reduce-scatter, then all-gather, in p-1 steps each.

    ``x`` is cut into p pieces. In each step every rank sends one piece to its right neighbour and receives one
    from its left, so every rank sends 2(p-1) pieces: 2(p-1)/p·N bytes whatever p is. Introduced in notebook 14.
    """
    import torch
    import torch.distributed as dist

    _group_ready("ring_allreduce", x)
    rank, p = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % p, (rank - 1) % p
    pieces = [c.clone() for c in x.flatten().tensor_split(p)]
    for step in range(p - 1):   # reduce-scatter: afterwards rank r holds the full sum of piece r + 1
        out, into = (rank - step) % p, (rank - step - 1) % p
        buf = torch.empty_like(pieces[into])
        sending = dist.isend(pieces[out], right)   # start the send and receive meanwhile: if every rank
        dist.recv(buf, left)                       # waited for its send first, the ring could wait forever
        sending.wait()
        pieces[into] += buf
    for step in range(p - 1):   # all-gather: pass the finished pieces on around the ring
        out, into = (rank - step + 1) % p, (rank - step) % p
        sending = dist.isend(pieces[out], right)
        dist.recv(pieces[into], left)
        sending.wait()
    return torch.cat(pieces).view(x.shape)


def _all_reduce_sum() -> Any:
    """An autograd Function that sums over ranks in forward and sums the gradient over ranks in backward."""
    import torch
    import torch.distributed as dist

    class AllReduceSum(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, t: Any) -> Any:
            t = t.clone()
            dist.all_reduce(t)
            return t

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            grad = grad.clone()
            dist.all_reduce(grad)
            return grad

    return AllReduceSum


def sync_batch_norm(x: Any, bn: Any) -> Any:
    """BatchNorm1d over the rows of *all* ranks: the per-channel mean and variance are all-reduced.

    ``x`` is this rank's ``(rows, channels)`` input; ``bn`` a ``torch.nn.BatchNorm1d`` in training mode. Its weight,
    bias, eps and momentum are used, and its running statistics are updated as one process holding every rank's
    rows would update them. The all-reduces are differentiable (the gradient is summed over ranks in backward too),
    so the input gradients match that process as well. Introduced in notebook 14.
    """
    import torch
    import torch.distributed as dist

    _check_bn(x, bn)
    allsum = _all_reduce_sum().apply
    rows = torch.tensor(float(x.shape[0]), dtype=x.dtype, device=x.device)
    dist.all_reduce(rows)                                        # every rank's row count
    mean = allsum(x.sum(0)) / rows                               # the mean over all ranks' rows
    var = allsum(((x - mean) ** 2).sum(0)) / rows                # their (biased) variance
    with torch.no_grad():                                        # the running variance is the unbiased one
        bn.running_mean.lerp_(mean, bn.momentum)
        bn.running_var.lerp_(var * rows / (rows - 1).clamp(min=1), bn.momentum)
        bn.num_batches_tracked += 1
    return (x - mean) / torch.sqrt(var + bn.eps) * bn.weight + bn.bias


def _gather(value: float, device: Any) -> list[float]:
    """Every rank's ``value``, in rank order (one all_gather)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(value)], dtype=torch.float64, device=device)
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return [float(v.item()) for v in out]


def _allreduce_part(elements: int, device: Any) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from labkit.handpar import recorded_collectives

    rank = dist.get_rank()
    x = torch.randn(elements, generator=torch.Generator().manual_seed(1000 + rank)).to(device)
    want = x.clone()
    dist.all_reduce(want)                                        # the library's answer
    out: dict[str, Any] = {"elements": elements, "bytes": elements * x.element_size()}
    for name, fn in (("ps", ps_allreduce), ("ring", ring_allreduce)):
        with recorded_collectives() as calls:
            got = fn(x)
        size = x.element_size()
        sent = size * sum(n for op, n in calls if op == "send")
        received = size * sum(n for op, n in calls if op == "recv")
        err = (got - want).abs().max().item() / want.abs().max().item()
        out[name] = {"sent": [int(v) for v in _gather(sent, device)],
                     "received": [int(v) for v in _gather(received, device)],
                     "messages_sent": [int(v) for v in _gather(sum(op == "send" for op, _ in calls), device)],
                     "max_rel_diff": max(_gather(err, device))}
    return out


def _batchnorm_part(batch: int, channels: int, device: Any) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch import nn

    rank, p = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(7)                         # the same on every rank: the whole batch
    full = (torch.randn(p * batch, channels, generator=g) * 2 + 3).to(device)
    weights = torch.randn(p * batch, channels, generator=g).to(device)  # the loss is sum(weights * output)
    mine = slice(rank * batch, (rank + 1) * batch)

    def step(norm: Any, rows: Any, w: Any) -> tuple[Any, Any]:
        """One forward and backward of ``norm`` on ``rows``: the output and the input gradient."""
        x = rows.clone().requires_grad_(True)
        y = norm(x)
        (y * w).sum().backward()
        return y.detach(), x.grad

    ref_bn = nn.BatchNorm1d(channels).to(device)
    y_ref, g_ref = step(ref_bn, full, weights)                   # one process with all p·batch rows
    y_ref, g_ref = y_ref[mine], g_ref[mine]
    res: dict[str, Any] = {"batch_per_rank": batch, "channels": channels, "world_size": p}
    local_bn, sync_bn = nn.BatchNorm1d(channels).to(device), nn.BatchNorm1d(channels).to(device)
    for name, bn, norm in (("local", local_bn, local_bn),
                           ("sync", sync_bn, lambda x: sync_batch_norm(x, sync_bn))):
        y, grad = step(norm, full[mine], weights[mine])          # this rank's rows only
        diffs = {"output": (y - y_ref).abs().max().item(), "input_grad": (grad - g_ref).abs().max().item(),
                 "running_mean": (bn.running_mean - ref_bn.running_mean).abs().max().item(),
                 "running_var": (bn.running_var - ref_bn.running_var).abs().max().item()}
        res[name] = {k: max(_gather(v, device)) for k, v in diffs.items()}
    res["running_mean_differs_between_ranks"] = len({round(v, 6) for v in
                                                     _gather(local_bn.running_mean[0].item(), device)}) > 1
    res["torch_syncbn"] = _torch_syncbn(full[mine], y_ref, channels, device)
    return res


def _torch_syncbn(rows: Any, y_ref: Any, channels: int, device: Any) -> dict[str, Any]:
    """Try ``torch.nn.SyncBatchNorm`` on this device: its error, or its largest difference from the reference."""
    import torch.distributed as dist
    from torch import nn

    bn = nn.SyncBatchNorm(channels).to(device)
    try:
        y = bn(rows)
    except ValueError as exc:  # torch runs it only on accelerators; every rank raises the same, before any collective
        return {"ran": False, "error": f"{type(exc).__name__}: {exc}"}
    diff = (y.detach() - y_ref).abs().max().item()
    dist.barrier()
    return {"ran": True, "output": max(_gather(diff, device))}


def build_parser() -> argparse.ArgumentParser:
    """Return the command-line parser (documented with ``--help``).

    Bad values are rejected while parsing (exit status 2, one line on stderr). Introduced in notebook 14.
    """
    from labkit import _cli

    ap = _cli.ArgumentParser(
        prog="python -m labkit.recipes.comm_patterns", checks=[_cli.launcher_env],
        description="A parameter server and a ring all-reduce written with send/recv, compared with "
                    "dist.all_reduce (bytes read from torch.profiler), and BatchNorm across ranks: local, "
                    "synchronised by hand, and one process with every rank's rows. Run under torchrun or srun; "
                    "rank 0 prints one LABKIT_RESULT {json} line.")
    ap.add_argument("--elements", type=_cli.int_in(1, _MAX_ELEMENTS), default=1 << 16,
                    help="fp32 values each rank all-reduces (default: 65536, 256 KiB)")
    ap.add_argument("--batch", type=_cli.int_in(2, _MAX_ROWS), default=4,
                    help="BatchNorm rows per rank (default: 4, a small per-GPU batch)")
    ap.add_argument("--channels", type=_cli.int_in(1, _MAX_ROWS), default=8,
                    help="BatchNorm channels (default: 8)")
    ap.add_argument("--device", type=_cli.device, default=None,
                    help="cpu or cuda (default: labkit.device.pick_device())")
    ap.add_argument("--pg-timeout", type=_cli.pg_timeout, default=60.0,
                    help="process-group timeout in seconds, at most a week (default: 60)")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Run both parts in this rank and print the result on rank 0; return the exit status.

    Introduced in notebook 14.
    """
    import torch.distributed as dist

    from labkit import dist as ldist

    args = build_parser().parse_args(argv)
    with ldist.joined(args.device, timeout_s=args.pg_timeout) as (dev, renv):
        result = {"recipe": "comm_patterns", "backend": dist.get_backend(), "world_size": renv.world_size,
                  "device": str(dev), "launcher": renv.launcher,
                  "allreduce": _allreduce_part(args.elements, dev),
                  "batchnorm": _batchnorm_part(args.batch, args.channels, dev)}
        if renv.rank == 0:
            ldist.emit_result(result)
    return 0


if __name__ == "__main__":
    build_parser().parse_args()  # --help and a bad flag answer at once, before torch is imported
    from labkit.dist import run_rank_main

    run_rank_main(main)  # flushes, then exits without C++ teardown (see its docstring)
