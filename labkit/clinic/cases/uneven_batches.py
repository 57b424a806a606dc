"""Case "uneven": a 2-rank DDP run whose last step of the epoch never ends.

Each rank reads its own shard file, and the two files hold different numbers of records, so one rank has one more
batch than the other. DDP all-reduces the gradients in every backward pass; a rank with no batch left calls no
backward. The process group has a short timeout (``pg_timeout_s``) so that the wait becomes an error here.

Run it under ``torchrun --nproc_per_node 2``. Introduced in notebook 13.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

CONFIG: dict[str, Any] = {"examples": 288, "batch": 32, "drop_last": False, "loop": "for xb, yb in shard",
                          "pg_timeout_s": 5.0}
#: How the training loop may be written (``loop``).
CHOICES = {"loop": ("for xb, yb in shard", "for xb, yb in shard[:4]", "with model.join(): for xb, yb in shard")}


def train(cfg: dict[str, Any], rank: int) -> int:
    """The training loop as the learner reads it; returns the steps this rank took. Introduced in notebook 13."""
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from labkit import data, models

    x, y = data.make_regression(n=cfg["examples"], in_features=16, seed=0)
    cut = cfg["examples"] * 5 // 9                       # the data set is stored as two shard files
    lo, hi = ((0, cut), (cut, cfg["examples"]))[rank]
    shard = list(zip(x[lo:hi].split(cfg["batch"]), y[lo:hi].split(cfg["batch"])))
    if cfg["drop_last"] and len(shard[-1][0]) < cfg["batch"]:
        shard = shard[:-1]                               # a last, partial batch is dropped
    model = DDP(models.MLP(16, 64, 1, depth=2, seed=0))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    joined = cfg["loop"].startswith("with model.join()")
    if cfg["loop"].endswith("[:4]"):
        shard = shard[:4]
    steps = 0
    with model.join() if joined else contextlib.nullcontext():
        for xb, yb in shard:
            loss = F.mse_loss(model(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()                              # DDP all-reduces the gradients here
            opt.step()
            steps += 1
            print(f"rank {rank} step {steps}/{len(shard)} loss {loss.item():.4f}", flush=True)
    print(f"rank {rank}: epoch done after {steps} steps", flush=True)
    return steps


def main(argv: Sequence[str] | None = None) -> int:
    """Join the process group, run the case, print the evidence on rank 0. Introduced in notebook 13."""
    import torch.distributed as dist

    from labkit.clinic._script import finish, gloo_ranks, read_config

    cfg = read_config(CONFIG, argv, CHOICES)
    if cfg["examples"] < 4 or cfg["batch"] < 1 or not cfg["pg_timeout_s"] > 0:
        raise ValueError("examples must be >= 4, batch >= 1 and pg_timeout_s > 0")
    with gloo_ranks(cfg["pg_timeout_s"]) as env:
        steps = train(cfg, env.rank)
        gathered: list[Any] = [None] * env.world_size
        dist.all_gather_object(gathered, steps)
        finish({"config": cfg, "steps": gathered})
    return 0


if __name__ == "__main__":
    from labkit.dist import run_rank_main

    run_rank_main(main, exit_on_error=True)
