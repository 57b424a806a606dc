"""Parallelism by hand: DDP three ways, a ZeRO-1 sharded AdamW, Megatron tensor parallelism, a GPipe pipeline.

Each strategy is written in plain ``torch.distributed`` calls, small enough to read whole, and checked (in
:mod:`labkit.recipes.handpar` and the tests) against the real thing: torch's ``DistributedDataParallel``,
an unsharded ``torch.optim.AdamW`` and DeepSpeed ZeRO-1, the single-process model, and
``torch.distributed.pipelining``. All functions run inside a process group (one rank per process, under
``torchrun``): gloo on the CPU, NCCL on GPUs.

- **Data parallel** (DDP): :func:`allreduce_gradients` (naive, after backward), :func:`overlap_gradients`
  (one asynchronous all-reduce per parameter, started by a hook as soon as that gradient is ready) and
  :class:`BucketedGradients` (gradients packed into buckets, one all-reduce per bucket).
- **ZeRO-1**: :class:`ShardedAdamW` flattens the parameters, pads them the way DeepSpeed does and gives each
  rank AdamW states for its slice only; :func:`zero1_step` is its step (reduce-scatter, local AdamW,
  all-gather).
- **Tensor parallel**: :class:`CopyToTP` and :class:`ReduceFromTP` are Megatron's conjugate operators f and g;
  :class:`TensorParallelMLP` splits an MLP's first linear layer by output columns and the second by input rows.
- **Pipeline parallel**: :func:`gpipe_step` runs one GPipe step (all micro-batch forwards, then all
  backwards) with send/recv between neighbouring stages.
- **Measuring**: :func:`recorded_collectives` lists the collectives torch really issued (read from
  ``torch.profiler``, so torch DDP's internal all-reduces count too); :func:`ring_traffic`,
  :func:`tp_comm_bytes`, :func:`pipeline_p2p_bytes` and :func:`bubble_fraction` are the formulas.

Introduced in notebook 11.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from labkit._validate import as_float, safe_repr

__all__ = [
    "BucketedGradients",
    "CopyToTP",
    "GatherFromSequence",
    "ReduceFromTP",
    "ScatterToSequence",
    "SequenceParallelBlock",
    "ShardedAdamW",
    "TensorParallelMLP",
    "allreduce_gradients",
    "allreduce_sequence_parallel_grads",
    "bubble_fraction",
    "broadcast_parameters",
    "bucket_layout",
    "clip_sharded_grad_norm_",
    "collective_name",
    "gpipe_step",
    "overlap_gradients",
    "pipeline_p2p_bytes",
    "recorded_collectives",
    "ring_traffic",
    "tp_comm_bytes",
    "train_ddp",
    "train_gpipe",
    "train_sequence_parallel",
    "train_zero1",
    "zero1_step",
]


def _need_group() -> None:
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("this runs inside a process group: call torch.distributed.init_process_group first "
                         "(each rank is a process started by torchrun)")


def _module(model: Any) -> nn.Module:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    return model


def _count(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    return value


# ---------------------------------------------------------------------------------------------------------
# Data parallel, three ways
# ---------------------------------------------------------------------------------------------------------

def broadcast_parameters(model: nn.Module, src: int = 0) -> None:
    """DDP step 0: copy rank ``src``'s parameters and buffers to every rank, in place, before training starts.

    ``DistributedDataParallel(model)`` does this in its constructor, so that replicas start equal even where the
    ranks initialised differently (no common seed, a checkpoint loaded on one rank only). Every rank must call it,
    with the same model: unlike DDP, it does not first check that the ranks' parameter shapes agree.

    Introduced in notebook 11.
    """
    module = _module(model)
    _need_group()
    if isinstance(src, bool) or not isinstance(src, int) or not 0 <= src < dist.get_world_size():
        raise ValueError(f"src must be a rank in [0, {dist.get_world_size()}), got {safe_repr(src)}")
    with torch.no_grad():
        for t in [*module.parameters(), *module.buffers()]:
            dist.broadcast(t.data, src)


def allreduce_gradients(model: nn.Module) -> None:
    """DDP step 1 (naive): after backward, average every gradient over the ranks, one all-reduce per tensor.

    Introduced in notebook 11.
    """
    params = [p for p in _module(model).parameters() if p.grad is not None]
    _need_group()
    world = dist.get_world_size()
    for p in params:
        p.grad.mul_(1.0 / world)  # scale first, then sum: what DDP does (see the notebook for why it matters)
        dist.all_reduce(p.grad)


def overlap_gradients(model: nn.Module) -> Callable[[], None]:
    """DDP step 2: start each gradient's all-reduce from a hook as soon as backward has produced it.

    Registers a post-accumulate-grad hook on every parameter; each hook scales that gradient by 1/world and
    starts an asynchronous all-reduce, so communication overlaps with the rest of backward. Returns
    ``wait``: call it after ``loss.backward()`` and before ``optimizer.step()``.

    Introduced in notebook 11.
    """
    params = [p for p in _module(model).parameters() if p.requires_grad]
    _need_group()
    world = dist.get_world_size()
    pending = []

    def hook(p: torch.Tensor) -> None:
        p.grad.mul_(1.0 / world)
        pending.append(dist.all_reduce(p.grad, async_op=True))

    for p in params:
        p.register_post_accumulate_grad_hook(hook)

    def wait() -> None:
        for work in pending:
            work.wait()
        pending.clear()

    return wait


def bucket_layout(numels: Sequence[int], bucket_elems: int) -> list[list[int]]:
    """Group parameter indices into buckets the way DDP (re)builds them: in the order gradients arrive.

    Gradients arrive in reverse order of ``model.parameters()``. A bucket takes tensors in that order until it
    holds ``bucket_elems`` elements or more, then the next one starts. Returns lists of parameter indices.

    Introduced in notebook 11.
    """
    if isinstance(numels, (str, bytes)) or not isinstance(numels, Sequence):
        raise TypeError(f"numels must be a sequence of ints (one per parameter), got {type(numels).__name__}")
    sizes = [_count("a parameter's numel", n, 1) for n in numels]
    _count("bucket_elems", bucket_elems, 1)
    buckets: list[list[int]] = [[]]
    filled = 0
    for i in reversed(range(len(sizes))):
        buckets[-1].append(i)
        filled += sizes[i]
        if filled >= bucket_elems:
            buckets.append([])
            filled = 0
    return [b for b in buckets if b]


class BucketedGradients:
    """DDP step 3: pack gradients into buckets and all-reduce one flat bucket as soon as it is full.

    ``bucket_mb`` is the bucket size in MiB (DDP's ``bucket_cap_mb``, 25 by default). Buckets follow
    :func:`bucket_layout`. Call :meth:`wait` after ``loss.backward()``.

    Introduced in notebook 11.
    """

    def __init__(self, model: nn.Module, bucket_mb: float = 25.0) -> None:
        params = [p for p in _module(model).parameters() if p.requires_grad]
        if isinstance(bucket_mb, bool) or not isinstance(bucket_mb, (int, float)) or not 0 < bucket_mb < 2**20:
            raise ValueError(f"bucket_mb must be a number of MiB > 0, got {safe_repr(bucket_mb)}")
        _need_group()
        if not params:
            raise ValueError("the model has no trainable parameters")
        self.world = dist.get_world_size()
        elems = max(1, int(bucket_mb * 2**20) // params[0].element_size())
        self.buckets = [[params[i] for i in b] for b in bucket_layout([p.numel() for p in params], elems)]
        self.ready = [0] * len(self.buckets)
        self.inflight: list[tuple[int, torch.Tensor, Any]] = []
        self.names = {id(p): name for name, p in _module(model).named_parameters()}
        for i, bucket in enumerate(self.buckets):
            for p in bucket:
                p.register_post_accumulate_grad_hook(lambda p, i=i: self._grad_ready(i))

    def _grad_ready(self, i: int) -> None:
        self.ready[i] += 1
        if self.ready[i] == len(self.buckets[i]):  # the bucket is full: send it
            flat = torch.cat([p.grad.reshape(-1) for p in self.buckets[i]])
            flat.mul_(1.0 / self.world)
            self.inflight.append((i, flat, dist.all_reduce(flat, async_op=True)))

    def wait(self) -> None:
        """Wait for every bucket's all-reduce and copy the averaged gradients back into ``p.grad``.

        Raises ``RuntimeError`` naming the parameters that got no gradient this step: their bucket never filled, so
        it was never sent, while another rank may have sent its own and now waits for this one (DDP raises too,
        unless it is built with ``find_unused_parameters=True``).
        """
        unsent = [b for i, b in enumerate(self.buckets) if self.ready[i] < len(b)]
        if unsent:
            for _, _, work in self.inflight:  # leave nothing in flight behind the error
                work.wait()
            self.inflight.clear()
            self.ready = [0] * len(self.buckets)
            none = [p for b in unsent for p in b if p.grad is None]  # after zero_grad(set_to_none=True): the culprits
            named = ", ".join(self.names[id(p)] for p in (none or [p for b in unsent for p in b]))
            raise RuntimeError(f"parameter(s) {named} received no gradient this step, so their bucket was never "
                               "all-reduced; another rank may be waiting for it. Make every parameter take part in "
                               "the loss (or exclude it from the buckets).")
        for i, flat, work in self.inflight:
            work.wait()
            offset = 0
            for p in self.buckets[i]:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
                offset += p.numel()
        self.inflight.clear()
        self.ready = [0] * len(self.buckets)


# ---------------------------------------------------------------------------------------------------------
# ZeRO-1: a sharded optimizer
# ---------------------------------------------------------------------------------------------------------

def _check_max_norm(max_norm: Any) -> float:
    """``max_norm`` if it is a finite number > 0 (a clipping threshold); otherwise ``ValueError``."""
    if isinstance(max_norm, bool) or not isinstance(max_norm, (int, float)) or not 0 < max_norm < math.inf:
        raise ValueError(f"max_norm must be a finite number > 0, got {safe_repr(max_norm)}")
    return as_float("max_norm", max_norm)


def clip_sharded_grad_norm_(grad_shard: torch.Tensor, max_norm: float) -> float:
    """Clip gradients that are sharded over the ranks by their *global* 2-norm, in place; return that norm.

    No rank holds the whole gradient, so each sums the squares of its shard and one all-reduce adds the sums:
    the norm of the whole vector, the same on every rank. Every shard is then scaled by
    ``min(1, max_norm / (norm + 1e-6))``, the factor ``torch.nn.utils.clip_grad_norm_`` applies to unsharded
    gradients. Every rank must call it. Introduced in notebook 11.
    """
    if not isinstance(grad_shard, torch.Tensor):
        raise TypeError(f"grad_shard must be a tensor, got {type(grad_shard).__name__}")
    max_norm = _check_max_norm(max_norm)
    _need_group()
    squares = grad_shard.detach().double().pow(2).sum().reshape(1)
    dist.all_reduce(squares)  # the sum over every rank's shard: the squared norm of the whole gradient
    norm = float(squares.sqrt())
    grad_shard.mul_(min(1.0, max_norm / (norm + 1e-6)))
    return norm


def zero1_step(flat_param: torch.Tensor, flat_grad: torch.Tensor, shard: torch.Tensor,
               optimizer: torch.optim.Optimizer, max_norm: float | None = None) -> float | None:
    """One ZeRO-1 step: reduce-scatter the gradients, step this rank's shard, all-gather the parameters.

    ``flat_param`` holds every parameter, flattened and padded (the same on every rank); it is overwritten
    with the updated parameters. ``flat_grad`` is this rank's own gradient in the same layout. ``shard`` is
    this rank's slice of the parameters (a leaf tensor), the only tensor ``optimizer`` updates. ``max_norm``
    clips the averaged gradient by its global norm first (:func:`clip_sharded_grad_norm_`) and returns that norm.

    Introduced in notebook 11.
    """
    for name, t in (("flat_param", flat_param), ("flat_grad", flat_grad), ("shard", shard)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    _need_group()
    world = dist.get_world_size()
    if flat_param.shape != flat_grad.shape or flat_param.numel() != world * shard.numel():
        raise ValueError(f"flat_param and flat_grad must have the same shape, world size ({world}) x "
                         f"shard.numel() ({shard.numel()}) elements; got {tuple(flat_param.shape)} and "
                         f"{tuple(flat_grad.shape)}")
    lo = dist.get_rank() * shard.numel()
    flat_grad.mul_(1.0 / world)  # scale first, as DDP does, in place: no second copy of the gradients
    grad_shard = flat_grad[lo:lo + shard.numel()]  # my slice of the reduced gradients lands in place
    dist.reduce_scatter_single(grad_shard, flat_grad)  # sum everyone's, keep my slice
    shard.grad = grad_shard
    norm = clip_sharded_grad_norm_(grad_shard, max_norm) if max_norm is not None else None
    optimizer.step()
    dist.all_gather_single(flat_param, shard.detach())  # everyone gets everyone's updated slice
    return norm


class ShardedAdamW:
    """ZeRO-1 by hand: AdamW whose states exist for 1/world of the parameters per rank.

    The parameters are flattened in ``model.parameters()`` order and padded with zeros to a multiple of
    2 x world size, as DeepSpeed stages 1 and 2 do (:func:`labkit.zero.partition_layout`); rank r owns the
    r-th equal slice. Nothing is held twice: every parameter becomes a view into one flat buffer (``flat``),
    every gradient a view into another (``grad``, which backward accumulates into), the slice this rank
    updates (``shard``) is its part of ``flat``, and the all-gather writes straight into ``flat``, that is
    into the parameters. ``step_fn`` is the step (default :func:`zero1_step`): the notebook's exercise plugs a
    learner's own in. ``max_norm`` clips the gradients by their global norm each step (the norms are kept in
    ``grad_norms``). Keyword arguments go to ``torch.optim.AdamW``. After a step, ``p.grad`` outside this rank's
    slice holds scratch values (the scaled local gradients, or what the collective left there): read gradients
    before :meth:`step`, and zero them with :meth:`zero_grad`.

    Introduced in notebook 11.
    """

    def __init__(self, params: Iterable[torch.Tensor], step_fn: Callable[..., None] | None = None,
                 max_norm: float | None = None, **adamw_kwargs: Any) -> None:
        if isinstance(params, (str, bytes, torch.Tensor)) or not isinstance(params, Iterable):
            raise TypeError(f"params must be an iterable of tensors (model.parameters()), got {type(params).__name__}")
        self.params = list(params)
        if not self.params or not all(isinstance(p, torch.Tensor) for p in self.params):
            raise ValueError("params must be a non-empty iterable of tensors (model.parameters())")
        if step_fn is not None and not callable(step_fn):
            raise TypeError(f"step_fn must be a function like zero1_step, got {type(step_fn).__name__}")
        if max_norm is not None and step_fn not in (None, zero1_step):
            raise ValueError("max_norm (gradient clipping) works with the default step_fn, zero1_step, only")
        if max_norm is not None:
            max_norm = _check_max_norm(max_norm)
        _need_group()
        self.step_fn = step_fn or zero1_step
        self.max_norm = max_norm
        self.grad_norms: list[float] = []  # with max_norm: each step's global gradient norm, before clipping
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.numel = sum(p.numel() for p in self.params)
        align = 2 * self.world
        self.padded = -(-self.numel // align) * align
        self.part = self.padded // self.world
        first = self.params[0]  # every buffer follows the parameters: their device (CPU, or a rank's GPU) and dtype
        if any(p.dtype != first.dtype or p.device != first.device for p in self.params):
            raise ValueError("every parameter must have the same dtype and device (one flat buffer holds them all)")
        self.flat = torch.zeros(self.padded, dtype=first.dtype, device=first.device)
        self.grad = torch.zeros_like(self.flat)
        offset = 0
        with torch.no_grad():
            for p in self.params:  # move each parameter into the flat buffer; its gradient into the flat gradient
                n = p.numel()
                self.flat[offset:offset + n].copy_(p.reshape(-1))
                p.data = self.flat[offset:offset + n].view_as(p)
                p.grad = self.grad[offset:offset + n].view_as(p)
                offset += n
        lo = self.rank * self.part
        self.shard = torch.nn.Parameter(self.flat[lo:lo + self.part])  # my slice of the parameters, not a copy
        self.optimizer = torch.optim.AdamW([self.shard], **{"foreach": False, **adamw_kwargs})

    def _attach_grads(self) -> None:
        """Make every ``p.grad`` a view into the flat gradient again, keeping its values (a caller's
        ``model.zero_grad()`` sets them to None; backward then allocates new ones)."""
        offset = 0
        for p in self.params:
            n = p.numel()
            slot = self.grad[offset:offset + n]
            g = p.grad
            if g is None or g.data_ptr() != slot.data_ptr():
                with torch.no_grad():
                    if g is None:
                        slot.zero_()
                    else:
                        slot.copy_(g.reshape(-1))
                p.grad = slot.view_as(p)
            offset += n

    def step(self) -> None:
        """Average the gradients, update this rank's slice, and all-gather the parameters (into the model)."""
        self._attach_grads()
        if self.max_norm is None:
            self.step_fn(self.flat, self.grad, self.shard, self.optimizer)
        else:
            self.grad_norms.append(self.step_fn(self.flat, self.grad, self.shard, self.optimizer,
                                                max_norm=self.max_norm))

    def zero_grad(self) -> None:
        """Zero the gradients in place: they stay views into the flat gradient, where backward accumulates."""
        self._attach_grads()
        self.grad.zero_()

    def state_bytes(self) -> int:
        """Bytes of AdamW's moment tensors on this rank (``exp_avg`` + ``exp_avg_sq``; the step counter aside)."""
        st = self.optimizer.state.get(self.shard, {})
        return sum(v.untyped_storage().nbytes() for k, v in st.items() if k != "step")

    def memory_bytes(self) -> dict[str, int]:
        """What this rank holds for the model, in bytes: parameters (the flat buffer), gradients (the flat gradient),
        optimizer states, and the total. The shard and the gradient shard are views: they add nothing."""
        out = {"params": self.flat.untyped_storage().nbytes(), "grads": self.grad.untyped_storage().nbytes(),
               "states": self.state_bytes()}
        return {**out, "total": sum(out.values())}


# ---------------------------------------------------------------------------------------------------------
# Tensor parallel (Megatron)
# ---------------------------------------------------------------------------------------------------------

class CopyToTP(torch.autograd.Function):
    """Megatron's f: the identity going forward; an all-reduce of the gradient going backward.

    Each rank's column-parallel layer contributes only its part of the gradient with respect to the shared
    input; the all-reduce sums the parts. Introduced in notebook 11.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class ReduceFromTP(torch.autograd.Function):
    """Megatron's g: an all-reduce going forward (sum the row-parallel partial outputs); the identity backward.

    Introduced in notebook 11.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


class TensorParallelMLP(nn.Module):
    """A 2-layer MLP split over the ranks: ``fc1`` by output columns, ``fc2`` by input rows (Megatron).

    Built from a whole ``fc1``/``fc2`` pair (the same on every rank); rank r keeps its 1/world of the hidden
    units. ``f``/``g`` are the conjugate operators (default :class:`CopyToTP`/:class:`ReduceFromTP`): one
    all-reduce forward, one backward.

    Introduced in notebook 11.
    """

    def __init__(self, fc1: nn.Linear, fc2: nn.Linear, f: Any = None, g: Any = None) -> None:
        super().__init__()
        for name, lin in (("fc1", fc1), ("fc2", fc2)):
            if not isinstance(lin, nn.Linear) or lin.bias is None:
                raise TypeError(f"{name} must be a torch.nn.Linear with a bias, got {type(lin).__name__}")
        if fc1.out_features != fc2.in_features:
            raise ValueError(f"fc1.out_features ({fc1.out_features}) must equal fc2.in_features ({fc2.in_features})")
        _need_group()
        world, rank = dist.get_world_size(), dist.get_rank()
        if fc1.out_features % world:
            raise ValueError(f"the hidden width {fc1.out_features} must split evenly over {world} ranks")
        self.f, self.g = f or CopyToTP, g or ReduceFromTP
        with torch.no_grad():
            self.w1 = nn.Parameter(fc1.weight.chunk(world, dim=0)[rank].clone())  # my hidden units' rows
            self.b1 = nn.Parameter(fc1.bias.chunk(world, dim=0)[rank].clone())
            self.w2 = nn.Parameter(fc2.weight.chunk(world, dim=1)[rank].clone())  # my hidden units' columns
            self.b2 = nn.Parameter(fc2.bias.clone())                              # whole: added once

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.f.apply(x)                          # f: identity forward, all-reduce backward
        h = F.gelu(F.linear(x, self.w1, self.b1))    # column-parallel: my part of the hidden layer
        y = self.g.apply(F.linear(h, self.w2))       # row-parallel partial sums, then g: all-reduce forward
        return y + self.b2


class GatherFromSequence(torch.autograd.Function):
    """Sequence parallelism's entry into the tensor-parallel region: all-gather the ranks' token slices forward
    (each rank then holds every token); reduce-scatter the gradient backward (sum the ranks' partial input
    gradients, keep my tokens' rows). It takes the place of :class:`CopyToTP` (f). Introduced in notebook 11.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        out = x.new_empty((dist.get_world_size() * x.shape[0], *x.shape[1:]))
        dist.all_gather_single(out, x.contiguous())
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        out = grad.new_empty((grad.shape[0] // dist.get_world_size(), *grad.shape[1:]))
        dist.reduce_scatter_single(out, grad.contiguous())
        return out


class ScatterToSequence(torch.autograd.Function):
    """Sequence parallelism's exit from the tensor-parallel region: reduce-scatter the row-parallel partial sums
    forward (each rank gets the finished sum for its tokens only); all-gather the gradient backward. It takes the
    place of :class:`ReduceFromTP` (g). Introduced in notebook 11.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        out = x.new_empty((x.shape[0] // dist.get_world_size(), *x.shape[1:]))
        dist.reduce_scatter_single(out, x.contiguous())
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        out = grad.new_empty((dist.get_world_size() * grad.shape[0], *grad.shape[1:]))
        dist.all_gather_single(out, grad.contiguous())
        return out


class SequenceParallelBlock(nn.Module):
    """A pre-norm MLP block ``x + MLP(LayerNorm(x))`` with Megatron's tensor and sequence parallelism.

    The MLP is split as in :class:`TensorParallelMLP`. Outside it (the LayerNorm, the residual add, the bias of
    ``fc2``; dropout in a real block) every rank works on its own 1/world of the tokens, so those activations are
    not replicated. The all-reduce of g becomes a reduce-scatter, the identity of f an all-gather: the same bytes
    on a ring, each rank now holding 1/world of the activations outside the MLP. The LayerNorm's parameters and
    ``b2`` are whole on every rank but see only that rank's tokens, so their gradients are partial: sum them with
    :func:`allreduce_sequence_parallel_grads` before the optimizer step. ``forward`` takes and returns this rank's
    token slice (rows ``rank * T/world`` to ``(rank + 1) * T/world`` of the sequence). Introduced in notebook 11.
    """

    def __init__(self, norm: nn.LayerNorm, fc1: nn.Linear, fc2: nn.Linear) -> None:
        super().__init__()
        if not isinstance(norm, nn.LayerNorm) or norm.weight is None or norm.bias is None:
            raise TypeError(f"norm must be a torch.nn.LayerNorm with weight and bias, got {type(norm).__name__}")
        self.mlp = TensorParallelMLP(fc1, fc2, f=GatherFromSequence, g=ScatterToSequence)
        if tuple(norm.normalized_shape) != (fc1.in_features,):
            raise ValueError(f"norm must normalise the last dimension, fc1.in_features ({fc1.in_features}), got "
                             f"normalized_shape {tuple(norm.normalized_shape)}")
        self.eps = norm.eps
        with torch.no_grad():
            self.ln_w, self.ln_b = nn.Parameter(norm.weight.clone()), nn.Parameter(norm.bias.clone())

    def replicated(self) -> list[nn.Parameter]:
        """The parameters held whole on every rank whose gradients each rank computes from its tokens only."""
        return [self.ln_w, self.ln_b, self.mlp.b2]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.layer_norm(x, self.ln_w.shape, self.ln_w, self.ln_b, self.eps)  # on my tokens only
        return x + self.mlp(h)  # all-gather, column- and row-parallel, reduce-scatter; + b2 and residual, my tokens


def allreduce_sequence_parallel_grads(block: SequenceParallelBlock) -> None:
    """Sum the partial gradients of a :class:`SequenceParallelBlock`'s replicated parameters over the ranks.

    Each rank's LayerNorm (and ``b2``) saw only its tokens; the gradient of the whole sequence is the sum. Every rank
    must call it, after backward. Introduced in notebook 11.
    """
    if not isinstance(block, SequenceParallelBlock):
        raise TypeError(f"block must be a SequenceParallelBlock, got {type(block).__name__}")
    _need_group()
    for p in block.replicated():
        if p.grad is not None:
            dist.all_reduce(p.grad)


# ---------------------------------------------------------------------------------------------------------
# Pipeline parallel (GPipe)
# ---------------------------------------------------------------------------------------------------------

def gpipe_step(stage: nn.Module, inputs: Sequence[torch.Tensor] | None, targets: Sequence[torch.Tensor] | None,
               loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
               act_shape: Sequence[int]) -> float | None:
    """One GPipe step on this rank's pipeline ``stage``: all micro-batch forwards, then all backwards.

    Rank r runs stage r. The first stage reads its micro-batches from ``inputs``; the others receive their
    activations (shape ``act_shape``) from the previous rank. The last stage computes ``loss_fn`` against
    ``targets`` and scales each micro-batch loss by 1/m, so the gradients are those of the mean loss over the
    whole batch. Gradients are accumulated in ``.grad``. Sends do not wait (``isend``): a stage goes on with its
    next micro-batch while the previous one travels. Returns the mean loss on the last stage, else None.

    Introduced in notebook 11.
    """
    _module(stage)
    if not callable(loss_fn):
        raise TypeError("loss_fn must be a function (output, target) -> loss")
    _need_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    source = inputs if first else targets
    if isinstance(source, (str, bytes)) or not isinstance(source, Sequence) or not source:
        raise ValueError("the first stage needs its micro-batch inputs, the last stage its targets "
                         "(non-empty lists of tensors)")
    m = len(source)
    param = next(stage.parameters(), None)  # received activations follow the stage's device and dtype
    if param is None:
        raise ValueError("the stage must have parameters (its device and dtype are the activations')")
    ins, outs, sends = [], [], []
    for i in range(m):  # forward every micro-batch, sending activations on
        if first:
            x = inputs[i]
        else:
            x = torch.empty(tuple(act_shape), dtype=param.dtype, device=param.device)
            dist.recv(x, rank - 1)
            x.requires_grad_(True)
        y = stage(x)
        if last:
            y = loss_fn(y, targets[i]) / m
        else:
            sends.append(dist.isend(y.detach(), rank + 1))  # do not wait: go on with the next micro-batch
        ins.append(x)
        outs.append(y)
    for i in reversed(range(m)):  # then backward, last micro-batch first, sending gradients back
        if last:
            outs[i].backward()
        else:
            grad = torch.empty_like(outs[i])
            dist.recv(grad, rank + 1)
            outs[i].backward(grad)
        if not first:
            sends.append(dist.isend(ins[i].grad, rank - 1))
    for work in sends:
        work.wait()
    return float(sum(float(y.detach()) for y in outs)) if last else None


# ---------------------------------------------------------------------------------------------------------
# Each strategy's training loop, whole (the notebook's recipe runs them and checks them against the real thing)
# ---------------------------------------------------------------------------------------------------------

Batches = Iterable[tuple[torch.Tensor | None, torch.Tensor | None]]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _check_loop(model: Any, optimizer: Any, batches: Any, loss_fn: Any) -> None:
    """The arguments every whole loop takes: a module, an optimizer (or None where the loop makes its own), an
    iterable of ``(x, y)`` pairs and a loss function; ``TypeError`` otherwise, before anything runs."""
    _module(model)
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if isinstance(batches, (str, bytes, torch.Tensor)) or not isinstance(batches, Iterable):
        raise TypeError(f"batches must be an iterable of (x, y) pairs, got {type(batches).__name__}")
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be a function (output, target) -> loss, got {type(loss_fn).__name__}")


def train_ddp(model: nn.Module, optimizer: torch.optim.Optimizer, batches: Batches, loss_fn: LossFn,
              bucket_mb: float = 25.0) -> list[float]:
    """Data parallelism by hand, the whole loop: each rank trains on its own ``(x, y)`` batches and returns its
    losses. Introduced in notebook 11."""
    _check_loop(model, optimizer, batches, loss_fn)
    broadcast_parameters(model)                              # step 0: every replica starts as rank 0's
    buckets = BucketedGradients(model, bucket_mb=bucket_mb)  # hooks: all-reduce each bucket as it fills
    losses = []
    for x, y in batches:                                     # this rank's share of every global batch
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()                                      # the buckets' all-reduces start in here
        buckets.wait()                                       # ... and have all finished here
        optimizer.step()                                     # the same averaged gradients on every rank
        losses.append(loss.item())
    return losses


def train_zero1(model: nn.Module, batches: Batches, loss_fn: LossFn, max_norm: float | None = None,
                **adamw_kwargs: Any) -> list[float]:
    """ZeRO-1 by hand, the whole loop: AdamW sharded over the ranks (:class:`ShardedAdamW`), each rank on its own
    batches; returns this rank's losses. Introduced in notebook 11."""
    _check_loop(model, None, batches, loss_fn)
    broadcast_parameters(model)                              # step 0, as DDP
    optimizer = ShardedAdamW(model.parameters(), max_norm=max_norm, **adamw_kwargs)  # 1/world of the states
    losses = []
    for x, y in batches:
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()                                      # this rank's gradient of its own batch, whole
        optimizer.step()                                     # reduce-scatter, (clip,) AdamW on my slice, all-gather
        losses.append(loss.item())
    return losses


def train_sequence_parallel(block: SequenceParallelBlock, optimizer: torch.optim.Optimizer, batches: Batches,
                            loss_fn: LossFn) -> list[float]:
    """Tensor + sequence parallelism, the whole loop: every rank gets *its tokens* of the same batch (``x``,
    ``y``: rows ``rank * T/world`` on) and ``loss_fn`` gives its share of the loss (a sum over its tokens divided by
    all tokens, so that the shares add up to the mean). Returns this rank's shares. Introduced in notebook 11."""
    if not isinstance(block, SequenceParallelBlock):
        raise TypeError(f"block must be a SequenceParallelBlock, got {type(block).__name__}")
    _check_loop(block, optimizer, batches, loss_fn)
    losses = []
    for x, y in batches:
        optimizer.zero_grad()
        loss = loss_fn(block(x), y)                          # all-gather in, reduce-scatter out, inside the block
        loss.backward()                                      # reduce-scatter and all-gather, the other way round
        allreduce_sequence_parallel_grads(block)             # the norm's and b2's partial gradients, summed
        optimizer.step()                                     # each rank updates its own slices of w1, b1, w2
        losses.append(loss.item())
    return losses


def train_gpipe(stage: nn.Module, optimizer: torch.optim.Optimizer, batches: Batches, loss_fn: LossFn,
                micro_batches: int, act_shape: Sequence[int]) -> list[float]:
    """GPipe, the whole loop: rank r trains stage r; the first stage reads ``x`` of each batch, the last ``y``
    (the other element may be None); ``act_shape`` is one micro-batch's activations between stages. Returns the
    mean losses on the last stage, ``[]`` elsewhere. Introduced in notebook 11."""
    _check_loop(stage, optimizer, batches, loss_fn)
    m = _count("micro_batches", micro_batches, 1)
    losses = []
    for x, y in batches:
        optimizer.zero_grad()
        xs = None if x is None else list(x.chunk(m))         # the first stage cuts the batch into m micro-batches
        ys = None if y is None else list(y.chunk(m))         # ... the last stage its targets
        loss = gpipe_step(stage, xs, ys, loss_fn, act_shape)  # m forwards, then m backwards, gradients accumulated
        optimizer.step()                                     # each stage updates its own layers
        if loss is not None:
            losses.append(loss)
    return losses


# ---------------------------------------------------------------------------------------------------------
# Measuring communication, and the formulas
# ---------------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def recorded_collectives() -> Iterator[list[tuple[str, int]]]:
    """Record the collectives issued inside the block as ``(name, elements)`` pairs, in the order they started.

    Read from ``torch.profiler``'s ``gloo:*``/``nccl:*`` events, so collectives issued inside torch (DDP's
    bucket all-reduces, FSDP's all-gathers, DeepSpeed's) count as well as our own. ``elements`` is the first
    input's element count (for an all-gather: this rank's piece). The list fills when the block ends.

    Introduced in notebook 11.
    """
    from torch.profiler import ProfilerActivity, profile

    found: list[tuple[str, int]] = []
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        yield found
    events = sorted((e for e in prof.events() if e.name.startswith(("gloo:", "nccl:"))),
                    key=lambda e: e.time_range.start)
    for e in events:
        shape = e.input_shapes[0] if e.input_shapes else None  # [] is a 0-d tensor: one element
        found.append((collective_name(e.name), int(math.prod(shape)) if shape is not None else 0))


def collective_name(event: str) -> str:
    """The collective a profiler event names, the same for both backends: ``"gloo:all_reduce"`` and
    ``"nccl:all_reduce"`` are ``"all_reduce"``; NCCL's ``"nccl:_reduce_scatter_base"`` is ``"reduce_scatter"`` and
    its ``"nccl:send 0->1"`` is ``"send"``. Introduced in notebook 11.
    """
    if not isinstance(event, str):
        raise TypeError(f"event must be a profiler event name such as 'nccl:all_reduce', got {type(event).__name__}")
    name = event.split(":", 1)[-1].split(" ", 1)[0]
    if name.startswith("_") and name.endswith("_base"):
        name = name[1:-len("_base")]
    return name


_RING = {"all_reduce": lambda n: 2 * (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
         "all_gather": lambda n: (n - 1) / n, "send": lambda n: 1.0, "broadcast": lambda n: 1.0}


def ring_traffic(op: str, nbytes: float, world_size: int) -> float:
    """Bytes one rank sends for a collective over ``nbytes`` of data with ring algorithms.

    ``all_reduce``: 2(n-1)/n x nbytes; ``reduce_scatter`` and ``all_gather`` (nbytes = the whole gathered
    tensor): (n-1)/n x nbytes; ``send``/``broadcast``: nbytes. Introduced in notebook 11.
    """
    if op not in _RING:
        raise ValueError(f"op must be one of {sorted(_RING)}, got {safe_repr(op)}")
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, float)) or not math.isfinite(nbytes) or nbytes < 0:
        raise ValueError(f"nbytes must be a finite number >= 0, got {safe_repr(nbytes)}")
    return _RING[op](_count("world_size", world_size, 1)) * nbytes


def tp_comm_bytes(tokens: int, d_model: int, bytes_per_elem: int = 4) -> dict[str, int]:
    """Bytes all-reduced per step by one Megatron MLP block: ``tokens x d_model`` forward (g) and backward (f).

    Introduced in notebook 11.
    """
    n = _count("tokens", tokens, 1) * _count("d_model", d_model, 1) * _count("bytes_per_elem", bytes_per_elem, 1)
    return {"forward": n, "backward": n, "total": 2 * n}


def pipeline_p2p_bytes(batch: int, width: int, boundaries: int = 1, bytes_per_elem: int = 4) -> dict[str, int]:
    """Bytes sent between pipeline stages per step: activations forward and their gradients back, per boundary.

    The micro-batch count does not change it: m micro-batches of batch/m rows. Introduced in notebook 11.
    """
    n = (_count("batch", batch, 1) * _count("width", width, 1) * _count("boundaries", boundaries, 1)
         * _count("bytes_per_elem", bytes_per_elem, 1))
    return {"forward": n, "backward": n, "total": 2 * n}


def bubble_fraction(stages: int, micro_batches: int) -> float:
    """GPipe's idle fraction (p - 1) / (m + p - 1) for p stages and m micro-batches of equal cost.

    Introduced in notebook 11.
    """
    p, m = _count("stages", stages, 1), _count("micro_batches", micro_batches, 1)
    return (p - 1) / (m + p - 1)
