"""Run by tests/test_handpar.py under torchrun with 2 ranks: every by-hand strategy follows its parameters' dtype.

The CPU proxy for "follows the parameters' device": with float64 parameters, every buffer the strategies allocate
(DDP's buckets, ZeRO-1's flat parameters and gradients, the pipeline's received activations and gradients) must be
float64 too, or the collectives and the autograd graph fail or silently round to float32. Each strategy trains one
step of a float64 model and is compared with the same step in one process, in float64; rank 0 prints, per
strategy, the dtypes it saw and the largest difference from one process.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from labkit import dist as ldist
from labkit import handpar

DT = torch.float64


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)).to(DT)


def _data(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(10 + rank)
    return torch.randn(8, 16, generator=g, dtype=DT), torch.randn(8, 4, generator=g, dtype=DT)


def _full_batch(world: int) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = zip(*(_data(r) for r in range(world)))
    return torch.cat(xs), torch.cat(ys)


def _reference_grads(world: int) -> list[torch.Tensor]:
    model = _mlp()
    x, y = _full_batch(world)
    F.mse_loss(model(x), y).backward()
    return [p.grad for p in model.parameters()]


def ddp(kind: str) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    model = _mlp()
    sync = {"naive": lambda: handpar.allreduce_gradients(model),
            "overlap": handpar.overlap_gradients(model) if kind == "overlap" else None,
            "bucketed": handpar.BucketedGradients(model, bucket_mb=0.001).wait if kind == "bucketed" else None}[kind]
    x, y = _data(rank)
    F.mse_loss(model(x), y).backward()
    sync()
    grads = [p.grad for p in model.parameters()]
    diff = max(float((a - b).abs().max()) for a, b in zip(grads, _reference_grads(world)))
    return {"dtypes": sorted({str(g.dtype) for g in grads}), "max_diff": diff}


def zero1() -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    model, ref = _mlp(), _mlp()
    opt = handpar.ShardedAdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, foreach=False)
    x, y = _data(rank)
    for _ in range(2):
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()  # this rank's own gradients: zero1_step averages them
        opt.step()
        ref_opt.zero_grad()
        fx, fy = _full_batch(world)
        F.mse_loss(ref(fx), fy).backward()
        ref_opt.step()
    diff = max(float((a - b).abs().max()) for a, b in zip(model.parameters(), ref.parameters()))
    dtypes = {str(opt.flat.dtype), str(opt.shard.dtype)} | {str(p.dtype) for p in model.parameters()}
    return {"dtypes": sorted(dtypes), "max_diff": diff}


def tp() -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1)
    fc1, fc2 = nn.Linear(16, 32).to(DT), nn.Linear(32, 4).to(DT)
    layer = handpar.TensorParallelMLP(fc1, fc2)
    x, _ = _full_batch(world)  # every tensor-parallel rank sees the whole batch
    out = layer(x)
    out.sum().backward()
    ref = fc2(F.gelu(fc1(x)))
    diff = float((out - ref).abs().max())
    dtypes = {str(out.dtype)} | {str(p.grad.dtype) for p in layer.parameters()}
    return {"dtypes": sorted(dtypes), "max_diff": diff, "rank": rank}


def pp() -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    full = _mlp()
    stages = [full[:2], full[2:]]
    stage = stages[rank]
    x, y = _full_batch(world)
    micro = 4
    xs, ys = list(x.chunk(micro)), list(y.chunk(micro))
    loss = handpar.gpipe_step(stage, xs if rank == 0 else None, ys if rank == world - 1 else None,
                              F.mse_loss, act_shape=(x.shape[0] // micro, 32))
    ref = _mlp()
    F.mse_loss(ref(x), y).backward()
    mine = [p.grad for p in stage.parameters()]
    theirs = [p.grad for p in [ref[:2], ref[2:]][rank].parameters()]
    diff = max(float((a - b).abs().max()) for a, b in zip(mine, theirs))
    out = {"dtypes": sorted({str(g.dtype) for g in mine}), "max_diff": diff}
    if loss is not None:
        out["loss_is_float"] = isinstance(loss, float)
    return out


def main() -> int:
    ldist.init_process_group("gloo", timeout_s=60)
    try:
        parts = {"ddp_naive": lambda: ddp("naive"), "ddp_overlap": lambda: ddp("overlap"),
                 "ddp_bucketed": lambda: ddp("bucketed"), "zero1": zero1, "tp": tp, "pp": pp}
        mine = {name: fn() for name, fn in parts.items()}
        everyone: list = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        if dist.get_rank() == 0:
            ldist.emit_result({"world_size": dist.get_world_size(), "ranks": everyone})
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    ldist.run_rank_main(main)
