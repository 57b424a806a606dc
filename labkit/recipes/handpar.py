"""Parallelism by hand, run for real: every strategy of :mod:`labkit.handpar` next to the library that does it.

Run it under torchrun with 2 ranks; rank 0 prints one ``LABKIT_RESULT {json}`` line::

    torchrun --nproc_per_node 2 -m labkit.recipes.handpar --parts ddp,zero1,tp,pp,fsdp

Parts (``--parts``, comma-separated), each checked against the real thing in the same processes:

- ``ddp``: naive, overlapped and bucketed DDP against ``torch.nn.parallel.DistributedDataParallel`` (gradients
  compared bit for bit at every step), the all-reduces each issues (read from ``torch.profiler``), and their step
  times, interleaved in one run;
- ``zero1``: :class:`labkit.handpar.ShardedAdamW` against an unsharded AdamW (weights compared bit for bit after
  ``--steps`` steps) and DeepSpeed ZeRO stage 1 (losses, weights, per-rank optimizer bytes);
- ``tp``: the 2-way Megatron MLP against the single-process MLP, and its all-reduces;
- ``pp``: GPipe with 1, 2, 4 and 8 micro-batches against the single-process model, its sends, and the bubble
  measured from each stage's forward/backward times; the same step with ``torch.distributed.pipelining``;
- ``fsdp``: ``torch.distributed.fsdp.fully_shard`` (FSDP2) and DeepSpeed ZeRO stage 3 on the same model and data:
  losses, per-rank bytes, collectives.

Learners' exercises run on the ranks through :mod:`labkit.recipes.handpar_grade`, which reuses this module's
setups.

Every tensor lives on ``--device`` (default: :func:`labkit.device.pick_device`; on CUDA each rank's own GPU) and
the backend comes from the device gate: gloo on the CPU, NCCL on CUDA. DeepSpeed runs on the matching accelerator
(its CPU accelerator on the CPU) with torch's AdamW (no C++ compile). Introduced in notebook 11.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import math
import os
import statistics
import time
import warnings
from collections.abc import Sequence
from typing import Any

from labkit._validate import safe_repr

__all__ = ["PARTS", "build_parser", "main", "rank_device"]

#: What ``--parts`` runs.
PARTS = ("ddp", "zero1", "tp", "pp", "fsdp")

# The shapes every part uses (the notebook describes them).
IN, HIDDEN, DEPTH, ROWS = 64, 256, 3, 64          # the data-parallel MLP: 148,481 parameters; rows per rank
TP_TOKENS, TP_D = 256, 128                        # the tensor-parallel MLP: d -> 4d -> d on 256 tokens
PP_BATCH, PP_WIDTH, PP_LAYERS = 256, 1024, 3      # the 2-stage pipeline: batch, width, linear layers per stage
LR, WD = 1e-3, 0.01
CLIP_NORM = 0.05  # ZeRO-1 with clipping: below the gradient norms of the first steps, so it clips
#: This rank's device, set by :func:`main` from ``--device`` before any part runs.
_DEV: Any = None


def build_parser() -> argparse.ArgumentParser:
    """Return the command-line parser (``--help`` documents it). Introduced in notebook 11."""
    from labkit import _cli

    ap = _cli.ArgumentParser(prog="python -m labkit.recipes.handpar", checks=[_check_micro],
                             description="Parallelism by hand next to torch and DeepSpeed (2 ranks under torchrun).")
    ap.add_argument("--parts", type=_cli.choices_list(PARTS), default=",".join(PARTS),
                    help=f"comma-separated, from {','.join(PARTS)} (default: all)")
    ap.add_argument("--steps", type=_cli.int_in(2, 50), default=5, help="optimizer steps of zero1/fsdp (default: 5)")
    ap.add_argument("--reps", type=_cli.int_in(1, 200), default=10, help="timed DDP steps per variant (default: 10)")
    ap.add_argument("--micro", type=_cli.int_list(1, PP_BATCH), default="1,2,4,8",
                    help="pipeline micro-batch counts, each dividing 256 (default: 1,2,4,8)")
    ap.add_argument("--no-deepspeed", dest="deepspeed", action="store_false",
                    help="skip the DeepSpeed runs of zero1 and fsdp")
    ap.add_argument("--pg-timeout", type=_cli.pg_timeout, default=60.0, help="collective timeout, s (default: 60)")
    ap.add_argument("--device", type=_cli.device, default=None,
                    help="cpu or cuda (default: labkit.device.pick_device()); on cuda each rank uses its local GPU")
    return ap


def _check_micro(args: argparse.Namespace) -> None:
    bad = [m for m in (int(v) for v in args.micro.split(",") if v.strip()) if PP_BATCH % m]
    if bad:
        raise ValueError(f"--micro: {bad} do not divide the pipeline's batch of {PP_BATCH}")


# ---------------------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------------------

def _device() -> Any:
    """This rank's device as a torch.device (the CPU before :func:`main` has set one)."""
    import torch

    return torch.device("cpu") if _DEV is None else torch.device(_DEV)


def _mlp(seed: int = 0) -> Any:
    from labkit import models

    return models.MLP(IN, HIDDEN, 1, depth=DEPTH, activation="gelu", seed=seed).to(_DEV)


def _batch(step: int, rank: int, rows: int = ROWS) -> tuple[Any, Any]:
    """This rank's batch for ``step``: the same on every run, different on every rank."""
    import torch

    g = torch.Generator().manual_seed(1000 * step + rank + 17)  # drawn on the host: the same bits everywhere
    x = torch.randn(rows, IN, generator=g, device="cpu").to(_DEV)
    return x, torch.tanh(x[:, :8].sum(1, keepdim=True))


def _global_batch(step: int, world: int) -> tuple[Any, Any]:
    import torch

    xs, ys = zip(*(_batch(step, r) for r in range(world)))
    return torch.cat(xs), torch.cat(ys)


def _flat(tensors: Any) -> Any:
    import torch

    return torch.cat([t.detach().reshape(-1) for t in tensors])


def _digest(t: Any) -> str:
    return hashlib.sha256(t.detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:16]


def _gather(obj: Any) -> list[Any]:
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _rel(a: Any, b: Any) -> float:
    """max |a - b| / max |b| (0 when both are 0)."""
    scale = float(b.abs().max())
    return float((a - b).abs().max()) / scale if scale else float((a - b).abs().max())


def _calls(events: list[tuple[str, int]]) -> dict[str, Any]:
    ops: dict[str, list[int]] = {}
    for name, n in events:
        ops.setdefault(name, []).append(n)
    return {k: {"calls": len(v), "elements": sum(v), "sizes": v} for k, v in ops.items()}


def _mse(a: Any, b: Any) -> Any:
    import torch.nn.functional as F

    return F.mse_loss(a, b)


# ---------------------------------------------------------------------------------------------------------
# part ddp
# ---------------------------------------------------------------------------------------------------------

def _ddp_variants(bucket_mb: float) -> tuple[dict[str, Any], bool]:
    """Fresh models, one per variant: {name: (model, what the forward calls, the gradient sync after backward)},
    and whether this rank's models differed from rank 0's before step 0. Every rank initialises with its own seed
    (as ranks without a common seed would); step 0 (broadcast from rank 0, by hand or in DDP's constructor) makes
    every replica rank 0's."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from labkit import handpar

    rank = dist.get_rank()
    seed = 0 if rank == 0 else 1000 + rank
    out: dict[str, Any] = {}
    m = _mlp(seed)
    differed = not torch.equal(_flat(m.parameters()), _flat(_mlp(0).parameters()))
    handpar.broadcast_parameters(m)
    out["naive"] = (m, m, lambda m=m: handpar.allreduce_gradients(m))
    m = _mlp(seed)
    handpar.broadcast_parameters(m)
    out["overlap"] = (m, m, handpar.overlap_gradients(m))
    m = _mlp(seed)
    handpar.broadcast_parameters(m)
    out["bucketed"] = (m, m, handpar.BucketedGradients(m, bucket_mb=bucket_mb).wait)
    m = _mlp(seed)
    out["ddp"] = (m, DDP(m), lambda: None)
    digests = {k: _digest(_flat(v[0].parameters())) for k, v in out.items()}  # after step 0, before training
    return out, {"differed": differed, "digests": digests}


def _ddp_step(front: Any, sync: Any, x: Any, y: Any) -> dict[str, Any]:
    """One backward + gradient sync under the profiler: the collectives executed, and how many were issued
    while backward was still running (torch's ``c10d::`` ops are recorded where they are called)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from labkit import handpar

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        with record_function("labkit::backward"):
            _mse(front(x), y).backward()
        sync()
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    bwd = next(e.time_range for e in events if e.name == "labkit::backward")
    issued = [e for e in events if e.name.startswith("c10d::") and "broadcast" not in e.name]
    executed = [(handpar.collective_name(e.name), int(math.prod(e.input_shapes[0])) if e.input_shapes else 0)
                for e in events if e.name.startswith(("gloo:", "nccl:"))]
    return {"issued_in_backward": sum(bwd.start <= e.time_range.start <= bwd.end for e in issued),
            "issued": len(issued), **_calls(executed)}


def part_ddp(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from labkit import device as dev_gate
    from labkit import handpar

    rank = dist.get_rank()
    bucket_mb = 0.25
    variants, start = _ddp_variants(bucket_mb)
    opts = {k: torch.optim.AdamW(v[0].parameters(), lr=LR, weight_decay=WD, foreach=False) for k, v in variants.items()}
    steps = 3
    same = {k: True for k in variants if k != "ddp"}
    counts: dict[str, Any] = {}
    for step in range(steps):
        x, y = _batch(step, rank)
        grads = {}
        for name, (model, front, sync) in variants.items():
            opts[name].zero_grad(set_to_none=True)
            if step == steps - 1:  # counted on the last step: DDP has rebuilt its buckets by then
                counts[name] = _ddp_step(front, sync, x, y)
            else:
                _mse(front(x), y).backward()
                sync()
            grads[name] = _flat(p.grad for p in model.parameters())
            opts[name].step()
        for k in same:
            same[k] = same[k] and torch.equal(grads[k], grads["ddp"])
    params_same = {k: torch.equal(_flat(variants[k][0].parameters()), _flat(variants["ddp"][0].parameters()))
                   for k in same}
    # the whole loop (handpar.train_ddp) from this rank's own initial weights: torch DDP's weights, bit for bit
    whole = _mlp(0 if rank == 0 else 1000 + rank)
    handpar.train_ddp(whole, torch.optim.AdamW(whole.parameters(), lr=LR, weight_decay=WD, foreach=False),
                      [_batch(step, rank) for step in range(steps)], _mse, bucket_mb=bucket_mb)
    loop_same = torch.equal(_flat(whole.parameters()), _flat(variants["ddp"][0].parameters()))
    # a parameter that gets no gradient: its bucket never fills; the by-hand buckets raise instead of hanging
    lame = _mlp()
    lame.unused = torch.nn.Linear(2, 2).to(_DEV)  # registered, never called in forward
    buckets = handpar.BucketedGradients(lame, bucket_mb=bucket_mb)
    _mse(lame(x), y).backward()
    try:
        buckets.wait()
        unused_error = ""
    except RuntimeError as exc:
        unused_error = str(exc)
    # timings: one step each, round robin, after a barrier; medians per rank, then the slowest rank
    times: dict[str, list[float]] = {k: [] for k in variants}
    x, y = _batch(99, rank)
    for _ in range(args.reps + 2):
        for name, (model, front, sync) in variants.items():
            for p in model.parameters():
                p.grad = None
            dev_gate.synchronize(_DEV)
            dist.barrier()
            t0 = time.perf_counter()
            _mse(front(x), y).backward()
            sync()
            dev_gate.synchronize(_DEV)  # on a GPU: the step's kernels, not their launch
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v[2:]) for k, v in times.items()}
    slowest = {k: max(d[k] for d in _gather(med)) for k in med}
    numels = [p.numel() for p in variants["naive"][0].parameters()]
    elems = max(1, int(bucket_mb * 2**20) // next(variants["naive"][0].parameters()).element_size())
    return {
        "n_params": sum(numels), "numels": numels, "bucket_mb": bucket_mb,
        "bucket_layout": handpar.bucket_layout(numels, elems),
        "steps": steps, "differed_before_step0": _gather(start["differed"]),
        "start_digests": _gather(start["digests"]), "unused_param_error": _gather(unused_error),
        "bitwise_grads_vs_ddp": _gather(same), "bitwise_params_vs_ddp": _gather(params_same),
        "loop_bitwise_vs_ddp": _gather(loop_same),
        "collectives": counts, "step_s": slowest, "reps": args.reps,
    }


# ---------------------------------------------------------------------------------------------------------
# part zero1
# ---------------------------------------------------------------------------------------------------------

def _replicated_adamw(steps: int, average: bool = True, memory: dict[str, int] | None = None,
                      max_norm: float | None = None, norms: list[float] | None = None) -> tuple[Any, list[float]]:
    """The unsharded reference: every rank averages gradients (all-reduce) and steps AdamW on everything.

    ``average=False`` sums them instead: the typical mistake, so that a grader can name it. ``memory``, if given,
    receives what a rank holds at the end, in bytes (parameters, gradients, AdamW's moments, total). ``max_norm``
    clips the averaged gradients with ``torch.nn.utils.clip_grad_norm_``; ``norms`` receives its norms."""
    import torch
    import torch.distributed as dist

    from labkit import handpar

    rank = dist.get_rank()
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD, foreach=False)
    losses = []
    for step in range(steps):
        x, y = _batch(step, rank)
        opt.zero_grad(set_to_none=True)
        loss = _mse(model(x), y)
        loss.backward()
        if average:
            handpar.allreduce_gradients(model)
        else:
            for p in model.parameters():
                dist.all_reduce(p.grad)
        if max_norm is not None:
            norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
            if norms is not None:
                norms.append(norm)
        opt.step()
        losses.append(_mean_over_ranks(loss))
    if memory is not None:
        memory["params"] = sum(p.untyped_storage().nbytes() for p in model.parameters())
        memory["grads"] = sum(p.grad.untyped_storage().nbytes() for p in model.parameters())
        memory["states"] = sum(v.untyped_storage().nbytes() for st in opt.state.values()
                               for k, v in st.items() if k != "step")
        memory["total"] = memory["params"] + memory["grads"] + memory["states"]
    return model, losses


def _mean_over_ranks(loss: Any) -> float:
    import torch.distributed as dist

    t = loss.detach().double().reshape(1).clone()
    dist.all_reduce(t)
    return float(t) / dist.get_world_size()


def _sharded(steps: int, step_fn: Any = None, max_norm: float | None = None,
             after: list[float] | None = None) -> tuple[Any, Any, list[float], Any]:
    """ZeRO-1 by hand (``handpar.ShardedAdamW``) for ``steps`` steps: the model, the optimizer, the mean losses and
    the last step's collectives. ``after``, if given, receives each step's global norm of the gradient the
    optimizer stepped with (``max_norm`` where it clipped)."""
    import torch
    import torch.distributed as dist

    from labkit import handpar

    rank = dist.get_rank()
    model = _mlp()
    opt = handpar.ShardedAdamW(model.parameters(), step_fn=step_fn, max_norm=max_norm, lr=LR, weight_decay=WD)
    losses, events = [], []
    for step in range(steps):
        x, y = _batch(step, rank)
        opt.zero_grad()
        loss = _mse(model(x), y)
        loss.backward()
        with handpar.recorded_collectives() as ev:
            opt.step()
        events = ev
        losses.append(_mean_over_ranks(loss))
        if after is not None:
            sq = opt.shard.grad.detach().double().pow(2).sum().reshape(1)
            dist.all_reduce(sq)
            after.append(float(torch.sqrt(sq)))
    return model, opt, losses, events


def _deepspeed() -> Any:
    """Import DeepSpeed on the accelerator of this run's device, on the process group already joined."""
    from labkit import device as dev_gate

    os.environ["DS_ACCELERATOR"] = "cuda" if dev_gate.is_cuda(_DEV) else "cpu"  # the accelerator of --device
    if "LOCAL_SIZE" not in os.environ and "LOCAL_WORLD_SIZE" in os.environ:
        os.environ["LOCAL_SIZE"] = os.environ["LOCAL_WORLD_SIZE"]
    import deepspeed
    import deepspeed.ops

    # no shared-memory all-reduce (a one-minute compile, and /dev/shm files): gloo or NCCL, like every other part
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend=dev_gate.dist_backend(_DEV))
    return deepspeed


def _ds_run(stage: int, steps: int, checkpoint: bool = False) -> dict[str, Any]:
    """DeepSpeed ZeRO ``stage`` in fp32 on the same model, data and AdamW; losses, bytes, collectives, weights."""
    import torch
    import torch.distributed as dist

    from labkit import handpar, zero

    deepspeed = _deepspeed()
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = zero.config(stage, "fp32", micro_batch=ROWS, grad_accum=1, world_size=world, lr=LR, weight_decay=WD,
                      gradient_clipping=0.0, torch_adam=True, reduce_bucket_size=1 << 16,
                      param_persistence_threshold=0 if stage == 3 else None)
    model = _mlp()
    t0 = time.perf_counter()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    init_s = time.perf_counter() - t0
    losses, snapshot, events = [], None, []
    for step in range(steps):
        x, y = _batch(step, rank)
        last = step == steps - 1
        with handpar.recorded_collectives() if last else contextlib.nullcontext([]) as ev:
            loss = _mse(engine(x), y)
            engine.backward(loss)
            if last:
                snapshot = zero.count_model_states(engine)["bytes"]
            engine.step()
        events = ev
        losses.append(_mean_over_ranks(loss))
    params = list(engine.module.parameters())
    ctx = deepspeed.zero.GatheredParameters(params) if stage == 3 else contextlib.nullcontext()
    with ctx, torch.no_grad():
        flat = _flat(p.float() for p in params).clone()
    out = {"losses": losses, "bytes": _gather(snapshot), "collectives": _calls(events), "init_s": init_s,
           "optimizer": type(engine.optimizer).__name__, "version": deepspeed.__version__, "config": cfg}
    if checkpoint:
        out["zero_to_fp32"] = _zero_to_fp32(engine, flat)
    del engine
    return out | {"_flat": flat}


def _zero_to_fp32(engine: Any, flat: Any) -> dict[str, Any]:
    """Save a DeepSpeed checkpoint (each rank writes its partitions), then merge it into one fp32 state dict with
    DeepSpeed's zero_to_fp32, on rank 0, with no engine; compare with the engine's gathered weights (``flat``)."""
    import torch
    import torch.distributed as dist

    with _checkpoint_dir() as ckpt:
        if ckpt is None:
            return {"works": False, "error": "the ranks span several nodes: a temporary directory is not shared"}
        try:
            engine.save_checkpoint(ckpt, tag="final")
            dist.barrier()
            out: dict[str, Any] = {"works": True}
            if dist.get_rank() == 0:
                from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

                sd = get_fp32_state_dict_from_zero_checkpoint(ckpt, tag="final")
                merged = _flat(sd[k].float() for k in engine.module.state_dict())
                out |= {"files": sorted(os.listdir(os.path.join(ckpt, "final"))), "keys": len(sd),
                        "equal": bool(torch.equal(merged, flat.cpu())),
                        "dtypes": sorted({str(t.dtype).replace("torch.", "") for t in sd.values()})}
        except Exception as exc:
            out = {"works": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    return out


def _clip_case(steps: int, max_norm: float = CLIP_NORM) -> dict[str, Any]:
    """ZeRO-1 by hand with gradient clipping against AdamW with ``clip_grad_norm_`` on the whole gradient."""
    norms: list[float] = []
    ref, _ = _replicated_adamw(steps, max_norm=max_norm, norms=norms)
    after: list[float] = []  # the global norm of what the optimizer stepped with: max_norm where it clipped
    model, opt, _, _ = _sharded(steps, max_norm=max_norm, after=after)
    return {"max_norm": max_norm, "norms": opt.grad_norms, "reference_norms": norms, "norms_after": after,
            "rel_vs_adamw": max(_gather(_rel(_flat(model.parameters()), _flat(ref.parameters()))))}


def _zero1_loop_equal(steps: int, reference: Any) -> bool:
    """handpar.train_zero1, the whole loop, against replicated AdamW's final weights: bit for bit?"""
    import torch
    import torch.distributed as dist

    from labkit import handpar

    rank = dist.get_rank()
    model = _mlp(0 if rank == 0 else 1000 + rank)  # each rank its own initial weights: the loop's step 0 must fix it
    handpar.train_zero1(model, [_batch(step, rank) for step in range(steps)], _mse, lr=LR, weight_decay=WD)
    return torch.equal(_flat(model.parameters()), reference)


def part_zero1(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    ref_memory: dict[str, int] = {}
    ref, ref_losses = _replicated_adamw(args.steps, memory=ref_memory)
    model, opt, losses, events = _sharded(args.steps)
    mine, theirs = _flat(model.parameters()), _flat(ref.parameters())
    out: dict[str, Any] = {
        "steps": args.steps, "n_params": opt.numel, "padded": opt.padded, "part": opt.part,
        "losses": losses, "reference_losses": ref_losses,
        "bitwise_vs_adamw": _gather(torch.equal(mine, theirs)),
        "ranks_identical": len(set(_gather(_digest(mine)))) == 1,
        "state_bytes": _gather(opt.state_bytes()),
        "memory_bytes": _gather(opt.memory_bytes()), "adamw_memory_bytes": ref_memory,
        "params_in_flat": all(p.untyped_storage().data_ptr() == opt.flat.untyped_storage().data_ptr()
                              for p in model.parameters()),
        "clip": _clip_case(args.steps),
        "loop_bitwise_vs_adamw": _gather(_zero1_loop_equal(args.steps, theirs)),
        "state_shapes": _gather({k: list(v.shape) for k, v in opt.optimizer.state[opt.shard].items()}),
        "collectives": _calls(events),
    }
    if args.deepspeed:
        ds = _ds_run(1, args.steps)
        flat = ds.pop("_flat")
        ds["max_rel_param_diff_vs_hand"] = max(_gather(_rel(flat, mine)))
        ds["bitwise_vs_hand"] = all(_gather(torch.equal(flat, mine)))
        out["deepspeed"] = ds
    dist.barrier()
    return out


# ---------------------------------------------------------------------------------------------------------
# part tp
# ---------------------------------------------------------------------------------------------------------

def _tp_case(f: Any = None, g: Any = None) -> dict[str, Any]:
    """The 2-way Megatron MLP (optionally with someone's f and g) against the single-process MLP."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from labkit import handpar

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(5)
    fc1, fc2 = nn.Linear(TP_D, 4 * TP_D).to(_DEV), nn.Linear(4 * TP_D, TP_D).to(_DEV)
    gen = torch.Generator().manual_seed(6)
    x0 = torch.randn(TP_TOKENS, TP_D, generator=gen, device="cpu").to(_DEV)
    target = torch.randn(TP_TOKENS, TP_D, generator=gen, device="cpu").to(_DEV)
    tp = handpar.TensorParallelMLP(fc1, fc2, f=f, g=g)
    x = x0.clone().requires_grad_(True)
    with handpar.recorded_collectives() as fwd:
        y = tp(x)
    loss = _mse(y, target)
    with handpar.recorded_collectives() as bwd:
        loss.backward()
    xs = x0.clone().requires_grad_(True)  # the single-process reference, on every rank
    ys = fc2(torch.nn.functional.gelu(fc1(xs)))
    _mse(ys, target).backward()
    pairs = {
        "output": (y, ys),
        "w1": (tp.w1.grad, fc1.weight.grad.chunk(world, 0)[rank]),
        "b1": (tp.b1.grad, fc1.bias.grad.chunk(world, 0)[rank]),
        "w2": (tp.w2.grad, fc2.weight.grad.chunk(world, 1)[rank]),
        "b2": (tp.b2.grad, fc2.bias.grad),
        "input": (x.grad, xs.grad),
    }
    rel = {k: (_rel(a.detach(), b.detach()) if a is not None else None) for k, (a, b) in pairs.items()}
    ratio = {k: (float((a.detach() * b.detach()).sum() / (b.detach() ** 2).sum()) if a is not None else None)
             for k, (a, b) in pairs.items()}
    return {"rel": rel, "ratio": ratio, "forward": _calls(fwd), "backward": _calls(bwd),
            "held": {"w1": list(tp.w1.shape), "w2": list(tp.w2.shape), "b2": list(tp.b2.shape)}}


def _sp_modules() -> tuple[Any, Any, Any]:
    """The pre-norm block's LayerNorm, fc1 and fc2 (the same on every rank)."""
    import torch
    from torch import nn

    torch.manual_seed(9)
    norm = nn.LayerNorm(TP_D).to(_DEV)
    with torch.no_grad():  # not the default 1 and 0, so that a wrong LayerNorm gradient shows
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.1, 0.1)
    return norm, nn.Linear(TP_D, 4 * TP_D).to(_DEV), nn.Linear(4 * TP_D, TP_D).to(_DEV)


def _sp_data(i: int) -> tuple[Any, Any]:
    """Batch ``i`` of the sequence-parallel block: all TP_TOKENS tokens, inputs and targets."""
    import torch

    gen = torch.Generator().manual_seed(10 + i)
    return (torch.randn(TP_TOKENS, TP_D, generator=gen, device="cpu").to(_DEV),
            torch.randn(TP_TOKENS, TP_D, generator=gen, device="cpu").to(_DEV))


def _my_tokens() -> slice:
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    return slice(rank * TP_TOKENS // world, (rank + 1) * TP_TOKENS // world)


def _sp_loop_rel(steps: int = 3) -> float:
    """handpar.train_sequence_parallel, the whole loop (SGD), against the block trained in one process: the
    largest relative difference of this rank's parameters."""
    import copy

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from labkit import handpar

    rank, world = dist.get_rank(), dist.get_world_size()
    norm, fc1, fc2 = _sp_modules()
    ref = [copy.deepcopy(m) for m in (norm, fc1, fc2)]
    block = handpar.SequenceParallelBlock(norm, fc1, fc2)
    batches = [_sp_data(i) for i in range(steps)]
    mine = _my_tokens()
    handpar.train_sequence_parallel(block, torch.optim.SGD(block.parameters(), lr=0.5),
                                    [(x[mine], y[mine]) for x, y in batches],
                                    lambda out, y: F.mse_loss(out, y, reduction="sum") / (TP_TOKENS * TP_D))
    rn, r1, r2 = ref
    opt = torch.optim.SGD([p for m in ref for p in m.parameters()], lr=0.5)
    for x, y in batches:
        opt.zero_grad()
        _mse(x + r2(F.gelu(r1(rn(x)))), y).backward()
        opt.step()
    pairs = [(block.ln_w, rn.weight), (block.ln_b, rn.bias), (block.mlp.b2, r2.bias),
             (block.mlp.w1, r1.weight.chunk(world, 0)[rank]), (block.mlp.b1, r1.bias.chunk(world, 0)[rank]),
             (block.mlp.w2, r2.weight.chunk(world, 1)[rank])]
    return max(_rel(a.detach(), b.detach()) for a, b in pairs)


def _sp_case() -> dict[str, Any]:
    """The pre-norm block x + MLP(LayerNorm(x)) with tensor + sequence parallelism against one process; the
    activations autograd saves per rank, against the same block with tensor parallelism only."""
    import torch.distributed as dist
    import torch.nn.functional as F

    from labkit import activations, handpar

    rank, world = dist.get_rank(), dist.get_world_size()
    norm, fc1, fc2 = _sp_modules()
    x0, target = _sp_data(0)
    mine = _my_tokens()
    sp = handpar.SequenceParallelBlock(norm, fc1, fc2)
    x = x0[mine].clone().requires_grad_(True)
    with handpar.recorded_collectives() as fwd:
        y, saved_sp = activations.measure_saved_tensors(lambda: sp(x), sp.parameters())
    loss = F.mse_loss(y, target[mine], reduction="sum") / target.numel()  # my tokens' share of the mean loss
    with handpar.recorded_collectives() as bwd:
        loss.backward()
        handpar.allreduce_sequence_parallel_grads(sp)
    tp = handpar.TensorParallelMLP(fc1, fc2)  # tensor parallelism only: the LayerNorm on every token
    xt = x0.clone().requires_grad_(True)
    _, saved_tp = activations.measure_saved_tensors(
        lambda: xt + tp(F.layer_norm(xt, (TP_D,), norm.weight, norm.bias, norm.eps)), [*tp.parameters(), *norm.parameters()])
    xs = x0.clone().requires_grad_(True)  # the single-process reference, on every rank
    ys = xs + fc2(F.gelu(fc1(norm(xs))))
    _mse(ys, target).backward()
    pairs = {
        "output": (y, ys[mine]),
        "ln_weight": (sp.ln_w.grad, norm.weight.grad), "ln_bias": (sp.ln_b.grad, norm.bias.grad),
        "w1": (sp.mlp.w1.grad, fc1.weight.grad.chunk(world, 0)[rank]),
        "b1": (sp.mlp.b1.grad, fc1.bias.grad.chunk(world, 0)[rank]),
        "w2": (sp.mlp.w2.grad, fc2.weight.grad.chunk(world, 1)[rank]),
        "b2": (sp.mlp.b2.grad, fc2.bias.grad),
        "input": (x.grad, xs.grad[mine]),
    }
    rel = {k: (_rel(a.detach(), b.detach()) if a is not None else None) for k, (a, b) in pairs.items()}
    return {"rel": rel, "forward": _calls(fwd), "backward": _calls(bwd), "tokens_held": x.shape[0],
            "saved_sp": saved_sp.activations, "saved_tp": saved_tp.activations}


def part_tp(args: argparse.Namespace) -> dict[str, Any]:
    res = _gather(_tp_case())
    sp = _gather(_sp_case())
    return {"tokens": TP_TOKENS, "d_model": TP_D, "hidden": 4 * TP_D, "ranks": res, "sp": sp,
            "loop_rel": _gather(_sp_loop_rel())}


# ---------------------------------------------------------------------------------------------------------
# part pp
# ---------------------------------------------------------------------------------------------------------

def _pp_model(width: int = PP_WIDTH, layers: int = PP_LAYERS) -> list[Any]:
    """The pipeline's two stages (the same on every rank): ``layers`` linear layers each, GELU between them."""
    import torch
    from torch import nn

    torch.manual_seed(7)
    seq = [m for _ in range(2 * layers) for m in (nn.Linear(width, width), nn.GELU())][:-1]
    return [nn.Sequential(*seq[:2 * layers]).to(_DEV), nn.Sequential(*seq[2 * layers:]).to(_DEV)]


def _pp_data(batch: int = PP_BATCH, width: int = PP_WIDTH) -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(8)
    return (torch.randn(batch, width, generator=g, device="cpu").to(_DEV),
            torch.randn(batch, width, generator=g, device="cpu").to(_DEV))


def _pp_reference(batch: int = PP_BATCH, width: int = PP_WIDTH, layers: int = PP_LAYERS) -> tuple[float, list[Any]]:
    """Loss and gradients of the whole model on the whole batch, in one process."""
    import torch

    stages = _pp_model(width, layers)
    x, y = _pp_data(batch, width)
    loss = _mse(torch.nn.Sequential(*stages)(x), y)
    loss.backward()
    return float(loss), [[p.grad.clone() for p in s.parameters()] for s in stages]


class _Timeline:
    """Forward and backward intervals of one stage module, from hooks around it (nothing inside the schedule)."""

    def __init__(self, module: Any) -> None:
        self.spans: list[tuple[str, float, float]] = []
        self._start = 0.0
        self._params = [p for p in module.parameters() if p.requires_grad]
        self._left = 0
        module.register_forward_pre_hook(lambda m, a: self._begin())
        module.register_forward_hook(lambda m, a, o: self._end("F"))
        module.register_full_backward_pre_hook(lambda m, g: self._begin_backward())
        for p in self._params:  # backward ends when the last parameter's gradient has been accumulated
            p.register_post_accumulate_grad_hook(lambda p: self._accumulated())

    def _begin(self) -> None:
        self._sync()
        self._start = time.perf_counter()

    def _end(self, kind: str) -> None:
        self._sync()
        self.spans.append((kind, self._start, time.perf_counter()))

    def _sync(self) -> None:
        """On a GPU, wait for this stage's compute stream, so a span is compute, not the launch (a no-op on the CPU).

        Not the whole device: that would also wait for NCCL's stream and turn every isend into a rendezvous."""
        from labkit import device as dev_gate

        dev_gate.synchronize(self._params[0].device if self._params else _device(), stream_only=True)

    def _begin_backward(self) -> None:
        self._left = len(self._params)
        self._begin()

    def _accumulated(self) -> None:
        self._left -= 1
        if self._left == 0:
            self._end("B")


def _pp_run(m: int, step_fn: Any, stage: Any, x: Any, y: Any) -> Any:
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    xs = list(x.chunk(m)) if rank == 0 else None
    ys = list(y.chunk(m)) if rank == world - 1 else None
    return step_fn(stage, xs, ys, _mse, (x.shape[0] // m, x.shape[1]))


def _bubble(spans_per_rank: list[list[tuple[str, float, float]]]) -> dict[str, float]:
    start = min(s[1] for spans in spans_per_rank for s in spans)
    end = max(s[2] for spans in spans_per_rank for s in spans)
    busy = sum(s[2] - s[1] for spans in spans_per_rank for s in spans)
    return {"bubble": 1 - busy / (len(spans_per_rank) * (end - start)), "span_s": end - start}


def part_pp(args: argparse.Namespace) -> dict[str, Any]:
    import torch.distributed as dist

    from labkit import handpar

    rank, world = dist.get_rank(), dist.get_world_size()
    if world != 2:
        raise ValueError("the pipeline part has 2 stages: run it on 2 ranks")
    # stage 0's input needs no gradient, so torch says its backward pre-hook fires on the output's gradient:
    # exactly when the stage's backward starts, which is what the timeline wants
    warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed")
    ref_loss, ref_grads = _pp_reference()
    x, y = _pp_data()
    out: dict[str, Any] = {"batch": PP_BATCH, "width": PP_WIDTH, "stages": world, "runs": {}}
    for m in args.micro:
        if PP_BATCH % m:
            raise ValueError(f"micro-batch count {m} does not divide the batch of {PP_BATCH}")
        stage = _pp_model()[rank]
        tl = _Timeline(stage)
        bubbles, loss, events = [], None, []
        for rep in range(3):  # one warm-up, then two timed steps
            stage.zero_grad(set_to_none=True)
            tl.spans.clear()
            dist.barrier()
            with handpar.recorded_collectives() if rep == 0 else contextlib.nullcontext([]) as ev:
                loss = _pp_run(m, handpar.gpipe_step, stage, x, y)
            if rep == 0:
                events = ev
                grads = [p.grad.clone() for p in stage.parameters()]
            if rep:
                bubbles.append(_bubble(_gather(tl.spans)))
        grad_rel = max(_rel(a, b) for a, b in zip(grads, ref_grads[rank]))
        spans = _gather(tl.spans)
        t0 = min(s[1] for sp in spans for s in sp)
        losses = [v for v in _gather(loss) if v is not None]
        out["runs"][str(m)] = {
            "loss_rel": abs(losses[-1] - ref_loss) / ref_loss,
            "grad_rel": _gather(grad_rel),
            "bubble": statistics.median(b["bubble"] for b in bubbles),
            "span_s": statistics.median(b["span_s"] for b in bubbles),
            "timeline": [[(k, a - t0, b - t0) for k, a, b in sp] for sp in spans],
            "p2p": _gather(_calls(events)),
        }
    out["reference_loss"] = ref_loss
    out["loop_rel"] = _gather(_gpipe_loop_rel())
    out["fixed_cost"] = _pp_fixed_cost(args.micro)
    out["pipelining"] = _pipelining(4, ref_loss, ref_grads)
    return out


def _gpipe_loop_rel(steps: int = 3, m: int = 4, width: int = 256) -> float:
    """handpar.train_gpipe, the whole loop (SGD, ``m`` micro-batches), against the whole model trained in one
    process: the largest relative difference of this rank's stage's parameters."""
    import torch
    import torch.distributed as dist

    from labkit import handpar

    rank, world = dist.get_rank(), dist.get_world_size()
    stage = _pp_model(width)[rank]
    whole = torch.nn.Sequential(*_pp_model(width))
    batches = [_pp_data(PP_BATCH, width) for _ in range(steps)]  # the same batch each step: fine for a check
    handpar.train_gpipe(stage, torch.optim.SGD(stage.parameters(), lr=0.1),
                        [(x if rank == 0 else None, y if rank == world - 1 else None) for x, y in batches],
                        _mse, m, (PP_BATCH // m, width))
    opt = torch.optim.SGD(whole.parameters(), lr=0.1)
    for x, y in batches:
        opt.zero_grad()
        _mse(whole(x), y).backward()
        opt.step()
    mine = whole[rank]
    return max(_rel(a.detach(), b.detach()) for a, b in zip(stage.parameters(), mine.parameters()))


PP_FIXED_MS = (160.0, 320.0)  # the fixed-cost pipeline: ms of forward and of backward per stage for the whole batch


def _pp_fixed_cost(micro: list[int], width: int = 64) -> dict[str, Any]:
    """The bubble of the same GPipe step when each stage's work has a fixed cost that needs no core: a narrow
    stage, then a wait of ``PP_FIXED_MS`` (forward, backward) in proportion to the micro-batch's rows. Two ranks
    sharing a small machine's cores then cannot slow each other down, and only the schedule sets the bubble."""
    import torch
    import torch.distributed as dist

    from labkit import handpar

    fwd_ms, bwd_ms = PP_FIXED_MS

    class Work(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, t: Any) -> Any:
            ctx.rows = t.shape[0]
            time.sleep(fwd_ms * 1e-3 * t.shape[0] / PP_BATCH)
            return t.view_as(t)

        @staticmethod
        def backward(ctx: Any, g: Any) -> Any:
            time.sleep(bwd_ms * 1e-3 * ctx.rows / PP_BATCH)
            return g

    class Stage(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, t: Any) -> Any:
            return Work.apply(self.inner(t))

    rank = dist.get_rank()
    x, y = _pp_data(PP_BATCH, width)
    stage = Stage(_pp_model(width)[rank])
    tl = _Timeline(stage)
    measured: dict[str, list[float]] = {str(m): [] for m in micro}
    for rep in range(3):  # a warm-up sweep (the largest m only), then two timed sweeps over every m
        for m in (micro if rep else [max(micro)]):
            stage.zero_grad(set_to_none=True)
            tl.spans.clear()
            dist.barrier()
            _pp_run(m, handpar.gpipe_step, stage, x, y)
            if rep:
                measured[str(m)].append(_bubble(_gather(tl.spans))["bubble"])
    # a busy machine only ever adds idle time (a late wake-up, a hand-off that waits for a core): the least
    # disturbed step is the best estimate of what the schedule itself leaves idle
    bubbles = {m: min(v) for m, v in measured.items()}
    return {"forward_ms": fwd_ms, "backward_ms": bwd_ms, "width": width, "bubble": bubbles}


def _pipelining(m: int, ref_loss: float, ref_grads: list[Any]) -> dict[str, Any]:
    """The same GPipe step with torch.distributed.pipelining (PipelineStage + ScheduleGPipe)."""
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    rank, world = dist.get_rank(), dist.get_world_size()
    stage_mod = _pp_model()[rank]
    x, y = _pp_data()
    try:
        stage = PipelineStage(stage_mod, rank, world, _device())
        schedule = ScheduleGPipe(stage, n_microbatches=m, loss_fn=_mse)
        losses: list[Any] = []
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y, losses=losses)
    except Exception as exc:  # report plainly what does not work, rather than hide it
        return {"works": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    grad_rel = max(_rel(p.grad, g) for p, g in zip(stage_mod.parameters(), ref_grads[rank]))
    loss = float(sum(float(v) for v in losses) / m) if losses else None
    res = _gather({"grad_rel": grad_rel, "loss": loss})
    last = res[-1]["loss"]
    return {"works": True, "grad_rel": [r["grad_rel"] for r in res], "loss_rel": abs(last - ref_loss) / ref_loss,
            "schedule": "ScheduleGPipe", "micro_batches": m}


# ---------------------------------------------------------------------------------------------------------
# part fsdp
# ---------------------------------------------------------------------------------------------------------

def _local(t: Any) -> Any:
    return t.to_local() if hasattr(t, "to_local") else t


def _storage_bytes(tensors: Any) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        s = _local(t).untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def _reference_curve(steps: int) -> list[float]:
    """Single-process AdamW on the global batch (both ranks' rows): the loss curve every sharding must give."""
    import torch
    import torch.distributed as dist

    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD, foreach=False)
    losses = []
    for step in range(steps):
        x, y = _global_batch(step, dist.get_world_size())
        opt.zero_grad(set_to_none=True)
        loss = _mse(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses


def _fsdp2(steps: int, mixed: bool = False) -> dict[str, Any]:
    """FSDP2 on the MLP for ``steps`` steps: losses, the bytes each rank holds after the last backward, the dtypes
    of what it holds and of the weights its layers compute with, the last step's collectives. ``mixed``: with
    ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``; otherwise fp32, and a DCP round trip."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from labkit import handpar

    rank = dist.get_rank()
    try:
        model = _sharded_mlp(MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
                             if mixed else None)
        seen: set[str] = set()  # the dtype of the gathered weights each linear layer computes with
        for layer in model.net:
            if isinstance(layer, torch.nn.Linear):
                layer.register_forward_pre_hook(lambda m, a: seen.add(_dtype_name(m.weight)))
        opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD, foreach=False)
        losses, events, snap = [], [], {}
        for step in range(steps):
            x, y = _batch(step, rank)
            last = step == steps - 1
            opt.zero_grad(set_to_none=True)
            with handpar.recorded_collectives() if last else contextlib.nullcontext([]) as ev:
                loss = _mse(model(x).float(), y)
                loss.backward()
            if last:
                params = list(model.parameters())
                states = [v for p in params for k, v in opt.state[p].items() if k != "step"]
                snap = {"params": _storage_bytes(params), "grads": _storage_bytes(p.grad for p in params),
                        "optimizer": _storage_bytes(states),
                        "shards": [list(_local(p).shape) for p in params],
                        "dtypes": sorted({_dtype_name(_local(p)) for p in params}),
                        "grad_dtypes": sorted({_dtype_name(_local(p.grad)) for p in params})}
                events = ev
            opt.step()
            losses.append(_mean_over_ranks(loss))
    except Exception as exc:
        return {"works": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    out = {"works": True, "losses": losses, "bytes": _gather(snap), "compute_dtypes": sorted(seen),
           "collectives": _calls(events)}
    return out if mixed else out | {"dcp": _dcp_roundtrip(model)}


def _dtype_name(t: Any) -> str:
    return str(t.dtype).replace("torch.", "")


@contextlib.contextmanager
def _checkpoint_dir() -> Any:
    """A fresh private directory that every rank sees: rank 0 makes it, the others learn its name; removed at the
    end (it is this run's own). ``None`` when the ranks span several nodes: a temporary directory is not shared."""
    import shutil
    import tempfile

    import torch.distributed as dist

    if int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size())) != dist.get_world_size():
        yield None
        return
    path = [tempfile.mkdtemp(prefix="labkit-ckpt-") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(path, src=0)
    try:
        yield path[0]
    finally:
        dist.barrier()
        if dist.get_rank() == 0:
            shutil.rmtree(path[0], ignore_errors=True)


def _dcp_roundtrip(model: Any) -> dict[str, Any]:
    """Save FSDP2's sharded state dict with torch.distributed.checkpoint (each rank writes its shards), load it
    into a plain, unsharded MLP, and compare with the FSDP2 model's full weights."""
    import torch
    import torch.distributed.checkpoint as dcp

    with _checkpoint_dir() as ckpt:
        if ckpt is None:
            return {"works": False, "error": "the ranks span several nodes: a temporary directory is not shared"}
        try:
            dcp.save({"model": model.state_dict()}, checkpoint_id=ckpt)
            files = sorted(os.listdir(ckpt))
            plain = _mlp(seed=1)  # other initial weights: the load must overwrite every one
            target = {"model": plain.state_dict()}
            dcp.load(target, checkpoint_id=ckpt)  # every rank reads whole tensors from both ranks' shards
            plain.load_state_dict(target["model"])
            full = [p.full_tensor() for p in model.parameters()]
            equal = all(torch.equal(a.detach(), b.detach()) for a, b in zip(plain.parameters(), full))
        except Exception as exc:
            return {"works": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    return {"works": True, "files": files, "equal": _gather(equal)}


def _sharded_mlp(mp: Any = None) -> Any:
    """The MLP with ``fully_shard`` on each linear layer, then on the whole model (``mp``: a MixedPrecisionPolicy)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    # the mesh names --device: without it FSDP2 picks the machine's accelerator, a GPU even for a CPU run
    mesh = init_device_mesh(_device().type, (dist.get_world_size(),))
    kw = {"mesh": mesh} if mp is None else {"mesh": mesh, "mp_policy": mp}
    model = _mlp()
    for layer in model.net:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, **kw)
    fully_shard(model, **kw)
    return model


def _fsdp_unsharded_grad_bytes(model: Any) -> int | None:
    """Bytes of the whole (unsharded) gradients FSDP2 keeps between micro-batches while gradient sync is off.

    They live inside FSDP2, not in ``p.grad`` (which holds only the sharded gradient): this reads its internal
    ``FSDPParam`` objects, a private API, so ``None`` when this torch lays them out differently."""
    from torch.distributed.fsdp import FSDPModule

    try:
        held = []
        for module in model.modules():
            if isinstance(module, FSDPModule):
                state = module._get_fsdp_state()
                groups = getattr(state, "_fsdp_param_groups", None)  # torch >= 2.12: a list
                if groups is None:  # earlier torch: one group or None
                    groups = [g for g in (state._fsdp_param_group,) if g is not None]
                for group in groups:
                    for fp in group.fsdp_params:
                        g = fp.unsharded_accumulated_grad
                        held.append(g if g is not None else fp._unsharded_param.grad)
        return _storage_bytes(held)
    except AttributeError:
        return None


def _fsdp2_accumulation(micro: int = 2) -> dict[str, Any]:
    """FSDP2 accumulating ``micro`` micro-batches, gradient sync off until the last: the collectives and the
    gradient bytes after each micro-batch."""
    import torch.distributed as dist

    from labkit import handpar

    rank = dist.get_rank()
    try:
        model = _sharded_mlp()
        per_micro = []
        for i in range(micro):
            last = i == micro - 1
            model.set_requires_gradient_sync(last)  # no reduce-scatter until the last micro-batch
            x, y = _batch(100 + i, rank)
            with handpar.recorded_collectives() as ev:
                (_mse(model(x), y) / micro).backward()
            grads = [p.grad for p in model.parameters()]
            per_micro.append({"collectives": _calls(ev), "sharded_grad_bytes": _storage_bytes(grads),
                              "unsharded_grad_bytes": _fsdp_unsharded_grad_bytes(model)})
    except Exception as exc:
        return {"works": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    return {"works": True, "per_micro": per_micro}


def part_fsdp(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"steps": args.steps, "reference_losses": _reference_curve(args.steps),
                           "fsdp2": _fsdp2(args.steps), "fsdp2_accumulation": _fsdp2_accumulation(),
                           "fsdp2_mixed": _fsdp2(args.steps, mixed=True)}
    if args.deepspeed:
        ds = _ds_run(3, args.steps, checkpoint=True)
        ds.pop("_flat")
        out["deepspeed"] = ds
    return out


# ---------------------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------------------

def rank_device(requested: str | None = None) -> Any:
    """This rank's device: ``requested`` (or the device gate's pick); on CUDA, the GPU of its local rank, made
    current so that object collectives and barriers use it. Introduced in notebook 11."""
    import torch

    from labkit import device as dev_gate

    dev = dev_gate.pick_device(requested)
    if dev_gate.is_cuda(dev):
        local = int(os.environ.get("LOCAL_RANK", "0"))
        try:
            dev = dev_gate.resolve(torch.device("cuda", local))  # the gate checks that this GPU exists
        except ValueError as exc:
            raise ValueError(f"local rank {local} has no GPU of its own ({exc}): start one rank per GPU, "
                             "or pass --device cpu") from None
        dev_gate.set_current_device(dev)
    return dev


def _two_rank_args(ap: argparse.ArgumentParser, argv: Sequence[str] | None, cli: bool,
                  command: str) -> argparse.Namespace:
    """Parse ``argv`` for a recipe that runs on 2 torchrun ranks. Outside torchrun: ``ValueError`` when called as a
    function, before any argument is read; with ``cli=True`` (``python -m``) ``--help`` still works, and anything
    else is one line on stderr, exit status 2. Introduced in notebook 11."""
    if not isinstance(cli, bool):
        raise TypeError(f"cli must be True or False, got {safe_repr(cli)}")
    outside = os.environ.get("WORLD_SIZE") != "2" or "RANK" not in os.environ
    msg = f"run this under torchrun with 2 ranks: torchrun --nproc_per_node 2 -m {command}"
    if outside and not cli:
        raise ValueError(msg)
    args = ap.parse_args(argv)
    if outside:
        ap.error(msg)
    return args


def main(argv: Sequence[str] | None = None, *, cli: bool = False) -> int:
    """Run the requested parts on this rank; rank 0 prints the result.

    Raises ``ValueError`` when not started by torchrun with 2 ranks (``cli=True``, as ``python -m`` runs it: one
    line on stderr and exit status 2; ``--help`` works anywhere). Introduced in notebook 11.
    """
    args = _two_rank_args(build_parser(), argv, cli, "labkit.recipes.handpar")
    args.parts = [s.strip() for s in args.parts.split(",") if s.strip()]
    args.micro = [int(s) for s in args.micro.split(",") if s.strip()]
    import torch
    import torch.distributed as dist

    from labkit import device as dev_gate
    from labkit import dist as ldist

    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1") or 1)))
    t_start = time.perf_counter()
    global _DEV
    _DEV = rank_device(args.device)
    ldist.init_process_group(dev_gate.dist_backend(_DEV), timeout_s=args.pg_timeout,
                             device=_DEV if dev_gate.is_cuda(_DEV) else None)
    rank = dist.get_rank()
    try:
        result: dict[str, Any] = {"world_size": dist.get_world_size(), "backend": dist.get_backend(),
                                  "device": str(_DEV), "torch": torch.__version__}
        parts = {"ddp": part_ddp, "zero1": part_zero1, "tp": part_tp, "pp": part_pp, "fsdp": part_fsdp}
        timings = {}
        for name in args.parts:
            t0 = time.perf_counter()
            result[name] = parts[name](args)
            timings[name] = time.perf_counter() - t0
        result["timings_s"] = timings
        result["total_s"] = time.perf_counter() - t_start
        if rank == 0:
            ldist.emit_result(result)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    import functools

    from labkit.dist import run_rank_main

    run_rank_main(functools.partial(main, cli=True))
