"""Case "graph": memory that grows with every training step.

An MLP trained with AdamW; after every step the script also measures the loss on a held-out batch, for the
log, and keeps a running total of it. The script logs the process's resident memory (RSS, what ``top``, ``htop``
or Slurm's accounting show) after each step, and, exactly, how many bytes the autograd graph behind the running
total still holds.

Introduced in notebook 13.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from typing import Any

CONFIG: dict[str, Any] = {"steps": 12, "val_batch": 512, "val_accumulate": "val_total += val_loss", "gc_every_step": False}
#: The lines that may add the validation loss to its running total (``val_accumulate``).
CHOICES = {"val_accumulate": ("val_total += val_loss", "val_total += val_loss.item()", "val_total += val_loss.detach()")}


def train(cfg: dict[str, Any]) -> dict[str, list[float]]:
    """The training loop as the learner reads it. Introduced in notebook 13."""
    import torch
    import torch.nn.functional as F

    from labkit import data, memory, models

    x, y = data.make_regression(n=4096, in_features=64, seed=0)
    train_x, train_y, val_x, val_y = x[:3072], y[:3072], x[3072:3072 + cfg["val_batch"]], y[3072:3072 + cfg["val_batch"]]
    batches = data.Batches(train_x, train_y, batch_size=128, seed=0)
    model = models.MLP(64, 512, 1, depth=3, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    params = list(model.parameters())
    val_total: Any = 0.0
    log: dict[str, list[float]] = {"rss_mb": [], "graph_mb": [], "val_loss": []}
    for step in range(cfg["steps"]):
        xb, yb = batches(step)
        loss = F.mse_loss(model(xb), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        val_loss = F.mse_loss(model(val_x), val_y)  # for the log
        log["val_loss"].append(val_loss.item())
        if cfg["val_accumulate"] == "val_total += val_loss.item()":
            val_total += val_loss.item()
        elif cfg["val_accumulate"] == "val_total += val_loss.detach()":
            val_total += val_loss.detach()
        else:
            val_total += val_loss
        if cfg["gc_every_step"]:
            del val_loss
            gc.collect()
        held = memory.graph_saved_bytes(val_total, exclude=params) if torch.is_tensor(val_total) else 0
        log["rss_mb"].append((memory.process_rss() or 0) / 2**20)
        log["graph_mb"].append(held / 2**20)
        print(f"step {step:2d}  val loss {log['val_loss'][-1]:.4f}  RSS {log['rss_mb'][-1]:7.1f} MiB  "
              f"held by the graph of val_total {log['graph_mb'][-1]:6.1f} MiB", flush=True)
    return log


def main(argv: Sequence[str] | None = None) -> int:
    """Run the case with ``--config`` and print its evidence. Introduced in notebook 13."""
    import torch

    from labkit.clinic._script import finish, read_config

    cfg = read_config(CONFIG, argv, CHOICES)
    torch.set_num_threads(1)
    finish({"config": cfg, **train(cfg)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
