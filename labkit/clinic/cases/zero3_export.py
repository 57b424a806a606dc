"""Case "zero3-save": a 2-rank DeepSpeed ZeRO-3 run whose exported model cannot be loaded.

Training goes well. At the end, rank 0 exports the trained weights to a file for a plain PyTorch user (no
DeepSpeed), who loads them into the same model class and evaluates.

Run it under ``torchrun --nproc_per_node 2``. Introduced in notebook 13.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Sequence
from typing import Any

CONFIG: dict[str, Any] = {"steps": 3, "lr": 1e-3, "export": "engine.module.state_dict()"}
#: How the script may collect the weights to export (``export``).
CHOICES = {"export": ("engine.module.state_dict()", "GatheredParameters(...): engine.module.state_dict()")}


def export(engine: Any, cfg: dict[str, Any], path: str) -> None:
    """Collect the trained weights and write them, on rank 0, as the learner reads it. Introduced in notebook 13."""
    import deepspeed
    import torch
    import torch.distributed as dist

    gather = cfg["export"].startswith("GatheredParameters")
    params = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(params) if gather else contextlib.nullcontext():  # on every rank
        state = {k: v.detach().clone() for k, v in engine.module.state_dict().items()}
    if dist.get_rank() == 0:
        torch.save(state, path)


def main(argv: Sequence[str] | None = None) -> int:
    """Train with ZeRO-3, export, reload in plain PyTorch on rank 0; print the evidence. Introduced in notebook 13."""
    from labkit.clinic._script import deepspeed_ranks, finish, read_config

    cfg = read_config(CONFIG, argv, CHOICES)
    if cfg["steps"] < 1:
        raise ValueError("steps must be >= 1")
    with deepspeed_ranks() as deepspeed:
        import torch
        import torch.distributed as dist
        import torch.nn.functional as F

        from labkit import data, models, zero

        rank, world = dist.get_rank(), dist.get_world_size()
        ds_cfg = zero.config(3, "fp32", micro_batch=32, grad_accum=1, world_size=world, lr=cfg["lr"],
                             gradient_clipping=0.0, torch_adam=True, param_persistence_threshold=0)
        model = models.MLP(16, 64, 1, depth=2, seed=0)
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_cfg)
        x, y = data.make_regression(n=1024, in_features=16, seed=0)
        batches = data.Batches(x, y, batch_size=32 * world, seed=0)
        for step in range(cfg["steps"]):
            xb, yb = batches(step, rank=rank, world_size=world)
            loss = F.mse_loss(engine(xb), yb)
            engine.backward(loss)
            engine.step()
            print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
        with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
            with torch.no_grad():
                want = F.mse_loss(engine.module(x), y).item()    # the trained model's loss, weights gathered
        out: dict[str, Any] = {"config": cfg, "trained_loss": want}
        with tempfile.TemporaryDirectory(prefix="labkit-clinic-") as tmp:
            path = os.path.join(tmp, "model.pt")
            export(engine, cfg, path)
            dist.barrier()
            if rank == 0:
                state = torch.load(path, weights_only=True)
                out["file_bytes"] = os.path.getsize(path)
                out["shapes"] = {k: list(v.shape) for k, v in state.items()}
                print(f"exported {out['file_bytes']} bytes: " + ", ".join(f"{k} {tuple(v.shape)}"
                                                                          for k, v in list(state.items())[:2]), flush=True)
                plain = models.MLP(16, 64, 1, depth=2, seed=1)         # the user's model, other initial weights
                try:
                    plain.load_state_dict(state)
                    with torch.no_grad():
                        out["loaded_loss"] = F.mse_loss(plain(x), y).item()
                except RuntimeError as exc:
                    out["load_error"] = " ".join(ln.strip() for ln in str(exc).splitlines()[:2])
                    print(f"load_state_dict: {out['load_error']}", flush=True)
            dist.barrier()
        finish(out)
    return 0


if __name__ == "__main__":
    from labkit.dist import run_rank_main

    run_rank_main(main, exit_on_error=True)
