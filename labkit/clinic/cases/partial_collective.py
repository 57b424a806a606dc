"""Case "hang": a 2-rank data-parallel run that stops making progress after its first checkpoint.

Each rank computes gradients on its half of the batch and the ranks average them with ``all_reduce`` (what DDP
does, bucket by bucket). Every ``ckpt_every`` steps rank 0 writes a checkpoint and then waits at a barrier
"until the file is written". The process group has a short timeout (``pg_timeout_s``), so that a rank that
waits for a partner who never comes raises an error instead of waiting for the default 30 minutes.

Run it under ``torchrun --nproc_per_node 2``. Introduced in notebook 13.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from typing import Any

CONFIG: dict[str, Any] = {"steps": 6, "ckpt_every": 3, "barrier_ranks": "0", "pg_timeout_s": 5.0}
#: The ranks that call the barrier after a checkpoint (``barrier_ranks``).
CHOICES = {"barrier_ranks": ("0", "1", "0, 1")}


def train(cfg: dict[str, Any], rank: int, world: int, ckpt_dir: str) -> tuple[list[float], int]:
    """The training loop as the learner reads it. Introduced in notebook 13."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from labkit import data, models

    x, y = data.make_regression(n=1024, in_features=16, seed=0)
    batches = data.Batches(x, y, batch_size=64, seed=0)
    model = models.MLP(16, 64, 1, depth=2, seed=0)  # the same weights on every rank
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses, checkpoints = [], 0
    for step in range(cfg["steps"]):
        xb, yb = batches(step, rank=rank, world_size=world)  # this rank's half of the global batch
        loss = F.mse_loss(model(xb), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        for p in model.parameters():  # average the gradients over the ranks
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
        losses.append(loss.item())
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
        if (step + 1) % cfg["ckpt_every"] == 0:
            if rank == 0:
                torch.save(model.state_dict(), os.path.join(ckpt_dir, "last.pt"))
                print(f"rank 0 step {step}: checkpoint written, waiting at the barrier", flush=True)
            if str(rank) in cfg["barrier_ranks"].split(", "):
                dist.barrier()  # "wait until the checkpoint is written"
            checkpoints += 1
    return losses, checkpoints


def main(argv: Sequence[str] | None = None) -> int:
    """Join the process group, run the case, print the evidence on rank 0. Introduced in notebook 13."""
    import torch.distributed as dist

    from labkit.clinic._script import finish, gloo_ranks, read_config

    cfg = read_config(CONFIG, argv, CHOICES)
    if cfg["steps"] < 1 or cfg["ckpt_every"] < 1 or not cfg["pg_timeout_s"] > 0:
        raise ValueError("steps and ckpt_every must be >= 1 and pg_timeout_s > 0")
    with gloo_ranks(cfg["pg_timeout_s"]) as env:
        with tempfile.TemporaryDirectory(prefix="labkit-clinic-") as ckpt_dir:
            losses, checkpoints = train(cfg, env.rank, env.world_size, ckpt_dir)
        gathered: list[Any] = [None] * env.world_size
        dist.all_gather_object(gathered, losses)
        finish({"config": cfg, "world_size": env.world_size, "losses": gathered, "checkpoints": checkpoints})
    return 0


if __name__ == "__main__":
    from labkit.dist import run_rank_main

    run_rank_main(main, exit_on_error=True)  # records a failure for torchrun, then ends the process at once
