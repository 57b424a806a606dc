"""Case "unused": a 2-rank DDP run that stops at its second step with an error about reduction.

A model with a shared trunk and two heads, one per task; this run trains the main task only. DDP all-reduces
every parameter's gradient in buckets, and by default expects every parameter to get one in every backward pass.

Run it under ``torchrun --nproc_per_node 2``. Introduced in notebook 13.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

CONFIG: dict[str, Any] = {"steps": 5, "lr": 0.05, "find_unused_parameters": False, "pg_timeout_s": 10.0}


def build() -> Any:
    """The model: a trunk and two heads. Introduced in notebook 13."""
    import torch
    from torch import nn

    class TwoHeads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.trunk = nn.Sequential(nn.Linear(16, 64), nn.ReLU())
            self.main_head, self.aux_head = nn.Linear(64, 1), nn.Linear(64, 1)

        def forward(self, x: torch.Tensor, task: str = "main") -> torch.Tensor:
            h = self.trunk(x)
            return self.main_head(h) if task == "main" else self.aux_head(h)
    return TwoHeads()


def train(cfg: dict[str, Any], rank: int, world: int) -> list[float]:
    """The training loop as the learner reads it. Introduced in notebook 13."""
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from labkit import data

    x, y = data.make_regression(n=512, in_features=16, seed=0)
    batches = data.Batches(x, y, batch_size=64, seed=0)
    model = DDP(build(), find_unused_parameters=cfg["find_unused_parameters"])
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"])
    losses = []
    for step in range(cfg["steps"]):
        xb, yb = batches(step, rank=rank, world_size=world)
        loss = F.mse_loss(model(xb, task="main"), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
    return losses


def main(argv: Sequence[str] | None = None) -> int:
    """Join the process group, run the case, print the evidence on rank 0. Introduced in notebook 13."""
    from labkit.clinic._script import finish, gloo_ranks, read_config

    cfg = read_config(CONFIG, argv)
    if cfg["steps"] < 1 or not cfg["pg_timeout_s"] > 0:
        raise ValueError("steps must be >= 1 and pg_timeout_s > 0")
    with gloo_ranks(cfg["pg_timeout_s"]) as env:
        losses = train(cfg, env.rank, env.world_size)
        finish({"config": cfg, "losses": losses})
    return 0


if __name__ == "__main__":
    from labkit.dist import run_rank_main

    run_rank_main(main, exit_on_error=True)
