"""Case "ds-batch": a DeepSpeed run, tuned on one GPU, that does not start on two.

The batch settings were written for one GPU: 8 examples per micro-batch, 4 accumulation steps, 32 examples per
optimizer step. Now the same config runs on 2 ranks (DeepSpeed's CPU accelerator, gloo here; CUDA and NCCL on
GPUs) with ZeRO stage 1 in fp32.

Run it under ``torchrun --nproc_per_node 2``. Introduced in notebook 13.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

CONFIG: dict[str, Any] = {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 8,
                          "gradient_accumulation_steps": 4, "steps": 3}


def ds_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The DeepSpeed config, as the learner reads it. Introduced in notebook 13."""
    conf = {
        "train_batch_size": cfg["train_batch_size"],
        "train_micro_batch_size_per_gpu": cfg["train_micro_batch_size_per_gpu"],
        "gradient_accumulation_steps": cfg["gradient_accumulation_steps"],
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": {"stage": 1},
        "steps_per_print": 10**6,
    }
    return conf


def train(cfg: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    """Build the engine and train a few steps. Introduced in notebook 13."""
    import deepspeed
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from labkit import data, models

    model = models.MLP(16, 64, 1, depth=2, seed=0)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config(cfg))
    micro, accum = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    x, y = data.make_regression(n=1024, in_features=16, seed=0)
    batches = data.Batches(x, y, batch_size=micro * world, seed=0)
    losses = []
    for step in range(cfg["steps"]):
        total = torch.zeros(())
        for m in range(accum):
            xb, yb = batches(step * accum + m, rank=rank, world_size=world)
            loss = F.mse_loss(engine(xb), yb)
            engine.backward(loss)
            engine.step()  # DeepSpeed steps the optimizer at the accumulation boundary
            total += loss.detach()
        dist.all_reduce(total)
        losses.append(float(total) / (accum * world))
        if rank == 0:
            print(f"step {step}  loss {losses[-1]:.4f}", flush=True)
    return {"losses": losses, "train_batch_size": engine.train_batch_size(), "micro_batch": micro,
            "grad_accum": accum}


def main(argv: Sequence[str] | None = None) -> int:
    """Start DeepSpeed on every rank, run the case, print the evidence on rank 0. Introduced in notebook 13."""
    from labkit.clinic._script import deepspeed_ranks, finish, read_config

    cfg = read_config(CONFIG, argv)
    with deepspeed_ranks() as deepspeed:
        import torch.distributed as dist

        rank, world = dist.get_rank(), dist.get_world_size()
        out = train(cfg, rank, world)
        finish({"config": cfg, "world_size": world, "deepspeed": deepspeed.__version__, **out})
    return 0


if __name__ == "__main__":
    from labkit.dist import run_rank_main

    run_rank_main(main, exit_on_error=True)  # records a failure for torchrun, then ends the process at once
