"""Case "tp-grad": a 2-rank tensor-parallel run whose loss falls as it should, and whose weights are wrong.

A small model: an input layer kept whole on every rank, a tensor-parallel MLP block (Megatron's column- then
row-parallel split, notebook 11) and a head kept whole. Rank 0 also trains the same model in one process, from the
same weights on the same batches, as the reference the 2-rank run must match.

Run it under ``torchrun --nproc_per_node 2``. Introduced in notebook 13.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

CONFIG: dict[str, Any] = {"steps": 5, "lr": 0.05, "f_backward": "identity", "average_replicated_grads": False}
#: What the f operator in front of the column-parallel layer may do with the gradient going back (``f_backward``).
CHOICES = {"f_backward": ("identity", "all_reduce", "all_reduce, then / world_size")}


def make_f(backward: str) -> Any:
    """Megatron's f as this script builds it: the identity forward; backward, ``backward``. Introduced in notebook 13."""
    import torch
    import torch.distributed as dist

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            if backward.startswith("all_reduce"):
                grad = grad.clone()
                dist.all_reduce(grad)
                if backward.endswith("world_size"):
                    grad /= dist.get_world_size()
            return grad
    return F


def train(cfg: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    """The training loop as the learner reads it. Introduced in notebook 13."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn

    from labkit import data
    from labkit.handpar import TensorParallelMLP

    torch.manual_seed(0)
    inp, fc1, fc2, head = nn.Linear(16, 32), nn.Linear(32, 64), nn.Linear(64, 32), nn.Linear(32, 1)
    whole = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32), nn.Linear(32, 1))
    whole.load_state_dict({f"{i}.{k}": v for i, m in zip((0, 1, 3, 4), (inp, fc1, fc2, head))
                           for k, v in m.state_dict().items()})  # the 1-process reference, same weights
    tp = TensorParallelMLP(fc1, fc2, f=make_f(cfg["f_backward"]))
    replicated = list(inp.parameters()) + list(head.parameters()) + [tp.b2]
    params = replicated + [tp.w1, tp.b1, tp.w2]
    opt, ref_opt = torch.optim.SGD(params, lr=cfg["lr"]), torch.optim.SGD(whole.parameters(), lr=cfg["lr"])
    x, y = data.make_regression(n=256, in_features=16, seed=0)
    batches = data.Batches(x, y, batch_size=64, seed=0)
    log: dict[str, Any] = {"loss": [], "ref_loss": []}
    for step in range(cfg["steps"]):
        xb, yb = batches(step)                 # tensor parallelism: every rank sees the same batch
        loss = F.mse_loss(head(tp(inp(xb))), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg["average_replicated_grads"]:
            for p in replicated:
                dist.all_reduce(p.grad)
                p.grad /= world
        opt.step()
        ref_loss = F.mse_loss(whole(xb), yb)
        ref_opt.zero_grad(set_to_none=True)
        ref_loss.backward()
        ref_opt.step()
        log["loss"].append(loss.item())
        log["ref_loss"].append(ref_loss.item())
        print(f"rank {rank} step {step}: loss {loss.item():.5f} (1-process reference {ref_loss.item():.5f})",
              flush=True)
    ref_w = whole[0].weight.detach()
    log["input_layer_rel_diff"] = float((inp.weight.detach() - ref_w).norm() / ref_w.norm())
    return log


def main(argv: Sequence[str] | None = None) -> int:
    """Join the process group, run the case, print the evidence on rank 0. Introduced in notebook 13."""
    import torch.distributed as dist

    from labkit.clinic._script import finish, gloo_ranks, read_config

    cfg = read_config(CONFIG, argv, CHOICES)
    if cfg["steps"] < 1:
        raise ValueError("steps must be >= 1")
    with gloo_ranks(30.0) as env:
        log = train(cfg, env.rank, env.world_size)
        diffs: list[Any] = [None] * env.world_size
        dist.all_gather_object(diffs, log["input_layer_rel_diff"])
        print(f"rank {env.rank}: input layer's weights differ from the 1-process run's by "
              f"{log['input_layer_rel_diff']:.2e} (relative)", flush=True)
        finish({"config": cfg, **log, "input_layer_rel_diff": diffs})
    return 0


if __name__ == "__main__":
    from labkit.dist import run_rank_main

    run_rank_main(main, exit_on_error=True)
