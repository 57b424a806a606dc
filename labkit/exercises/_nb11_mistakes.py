"""The typical wrong answers to notebook 11's exercises, written as a learner might write them.

The graders' tests hand these to :mod:`labkit.exercises.nb11`, which runs them on 2 ranks like any learner's code
and must say what is wrong. Not an exercise module (its name does not start with ``nb``), so the registry does not
load it, and nothing here is public API.

Introduced in notebook 11.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__: list[str] = []


def overlap_gradients(model):
    """Starts each all-reduce from a hook, as it should, but sums the gradients instead of averaging them."""
    pending = []

    def hook(p):
        pending.append(dist.all_reduce(p.grad, async_op=True))

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def wait():
        for work in pending:
            work.wait()
        pending.clear()

    return wait


def zero1_step(flat_param, flat_grad, shard, optimizer):
    """Reduce-scatters and steps the shard, but forgets the all-gather: only this rank's slice is updated."""
    world, rank = dist.get_world_size(), dist.get_rank()
    grad_shard = torch.empty_like(shard)
    dist.reduce_scatter_single(grad_shard, flat_grad / world)
    shard.grad = grad_shard
    optimizer.step()
    n = shard.numel()
    flat_param[rank * n:(rank + 1) * n] = shard.detach()


class CopyToTP(torch.autograd.Function):
    """f without its backward all-reduce: each rank keeps only its own part of the input's gradient."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


class ReduceFromTP(torch.autograd.Function):
    """g, correct: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


def gpipe_step(stage, inputs, targets, loss_fn, act_shape):
    """A correct GPipe schedule, except that the micro-batch losses are summed, not averaged (no 1/m)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    m = len(inputs if first else targets)
    p = next(stage.parameters())
    ins, outs = [], []
    for i in range(m):
        if first:
            x = inputs[i]
        else:
            x = torch.empty(act_shape, dtype=p.dtype, device=p.device)
            dist.recv(x, rank - 1)
            x.requires_grad_(True)
        y = stage(x)
        if last:
            y = loss_fn(y, targets[i])
        else:
            dist.send(y.detach(), rank + 1)
        ins.append(x)
        outs.append(y)
    for i in reversed(range(m)):
        if last:
            outs[i].backward()
        else:
            grad = torch.empty_like(outs[i])
            dist.recv(grad, rank + 1)
            outs[i].backward(grad)
        if not first:
            dist.send(ins[i].grad, rank - 1)
    return float(sum(float(y) for y in outs)) if last else None
