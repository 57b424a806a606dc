"""Case "lr": a recipe tuned on 1 GPU, moved to 2 ranks, learns worse per example seen.

The recipe's notes: one GPU, batch 32, plain SGD with lr 0.1, 30 steps (960 examples). On 2 ranks each rank
keeps its batch of 32 (the global batch is 64) and the run sees the same 960 examples in 15 steps. Rank 0 first
replays the 1-GPU run from the notes (the curve to compare with), then both ranks train with DDP (gloo here,
NCCL on GPUs). The script logs the loss on the whole data set against the number of examples seen.

Run it under ``torchrun --nproc_per_node 2``. Introduced in notebook 13.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: The recipe's notes, from the 1-GPU run.
RECIPE: dict[str, Any] = {"batch": 32, "lr": 0.1, "examples": 960}
CONFIG: dict[str, Any] = {"batch_per_rank": 32, "lr": 0.1, "examples": 960}


def train(lr: float, batch_per_rank: int, steps: int, rank: int, world: int) -> list[float]:
    """The training loop (SGD, DDP when world > 1); the whole-data loss after each step. Introduced in notebook 13."""
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from labkit import data, models

    x, y = data.make_regression(n=4096, in_features=16, seed=0)
    batches = data.Batches(x, y, batch_size=batch_per_rank * world, seed=1)
    net = models.MLP(16, 64, 1, depth=2, seed=0)
    model = DDP(net) if world > 1 else net
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    curve = []
    for step in range(steps):
        xb, yb = batches(step, rank=rank, world_size=world)
        loss = F.mse_loss(model(xb), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP averages the gradients over the ranks
        opt.step()
        with torch.no_grad():
            curve.append(F.mse_loss(net(x), y).item())
    return curve


def main(argv: Sequence[str] | None = None) -> int:
    """Replay the 1-GPU run on rank 0, train on all ranks, print the evidence. Introduced in notebook 13."""
    import torch
    import torch.distributed as dist

    from labkit import dist as ldist
    from labkit.clinic._script import finish, read_config

    cfg = read_config(CONFIG, argv)
    if cfg["batch_per_rank"] < 1 or cfg["examples"] < 1 or not cfg["lr"] > 0:
        raise ValueError("batch_per_rank and examples must be >= 1 and lr > 0")
    torch.set_num_threads(1)
    env = ldist.init_process_group("gloo", timeout_s=60)
    try:
        world = env.world_size
        one = None
        if env.rank == 0:
            one = train(RECIPE["lr"], RECIPE["batch"], RECIPE["examples"] // RECIPE["batch"], 0, 1)
            print(f"1 GPU (the notes): batch {RECIPE['batch']}, lr {RECIPE['lr']}: loss after "
                  f"{RECIPE['examples']} examples {one[-1]:.4f}", flush=True)
        steps = cfg["examples"] // (cfg["batch_per_rank"] * world)
        curve = train(cfg["lr"], cfg["batch_per_rank"], steps, env.rank, world)
        if env.rank == 0:
            print(f"{world} ranks: batch {cfg['batch_per_rank']} per rank (global {cfg['batch_per_rank'] * world}), "
                  f"lr {cfg['lr']:g}: loss after {steps * cfg['batch_per_rank'] * world} examples {curve[-1]:.4f}",
                  flush=True)
        finish({"config": cfg, "world_size": world, "recipe": RECIPE, "one_gpu": one, "curve": curve,
                "global_batch": cfg["batch_per_rank"] * world})
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    from labkit.dist import run_rank_main

    run_rank_main(main, exit_on_error=True)  # records a failure for torchrun, then ends the process at once
