"""Run by tests/test_handpar.py under torchrun with 3 ranks: when are hand-written DDP gradients bitwise DDP's?

With 3 ranks neither 1/3 nor a three-term sum is exact, so the bits depend on how the gradients are scaled and on
where each element sits in the all-reduced buffer. Every version sees the same weights and data for 3 backward
passes (no optimizer step, so a difference at one step cannot carry over into the next); rank 0 prints, per
version, which steps gave gradients bitwise equal to torch DDP's, and the largest relative difference.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from labkit import dist as ldist
from labkit import handpar, models

STEPS, CAP_MB = 3, 0.25


class _DivideAfter(handpar.BucketedGradients):
    """DDP's bucket layout, but the sum divided by the world size afterwards instead of scaled by fl(1/n) before."""

    def _grad_ready(self, i: int) -> None:
        self.ready[i] += 1
        if self.ready[i] == len(self.buckets[i]):
            flat = torch.cat([p.grad.reshape(-1) for p in self.buckets[i]])
            self.inflight.append((i, flat, dist.all_reduce(flat, async_op=True)))

    def wait(self) -> None:
        super().wait()
        for bucket in self.buckets:
            for p in bucket:
                p.grad.div_(self.world)


def grads(kind: str) -> list[torch.Tensor]:
    rank, world = dist.get_rank(), dist.get_world_size()
    model = models.MLP(64, 256, 1, depth=3, activation="gelu", seed=0)
    front, sync = model, lambda: None
    if kind == "ddp":
        front = DDP(model, bucket_cap_mb=CAP_MB)
    elif kind == "bucketed":
        sync = handpar.BucketedGradients(model, bucket_mb=CAP_MB).wait
    elif kind == "bucketed_divide_after":
        sync = _DivideAfter(model, bucket_mb=CAP_MB).wait
    elif kind == "overlap":
        sync = handpar.overlap_gradients(model)
    elif kind == "naive":
        def sync() -> None:
            handpar.allreduce_gradients(model)
    elif kind == "divide_after":
        def sync() -> None:
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad.div_(world)
    out = []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(64, 64, generator=g)
        model.zero_grad(set_to_none=True)
        F.mse_loss(front(x), torch.tanh(x[:, :1])).backward()
        sync()
        out.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
    return out


def main() -> int:
    ldist.init_process_group("gloo", timeout_s=60)
    try:
        ref = grads("ddp")
        result = {"world_size": dist.get_world_size()}
        for kind in ("naive", "divide_after", "overlap", "bucketed", "bucketed_divide_after"):
            mine = grads(kind)
            equal = [bool(torch.equal(a, b)) for a, b in zip(mine, ref)]
            rel = max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(mine, ref))
            everyone: list = [None] * dist.get_world_size()
            dist.all_gather_object(everyone, equal)
            result[kind] = {"bitwise_per_step": [all(e[i] for e in everyone) for i in range(STEPS)], "max_rel": rel}
        if dist.get_rank() == 0:
            ldist.emit_result(result)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    ldist.run_rank_main(main)
