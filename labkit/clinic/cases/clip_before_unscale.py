"""Case "clip": fp16 AMP training with gradient clipping, where the loss does not move.

An MLP regression trained with SGD, fp16 autocast and a ``GradScaler``; gradients are clipped to norm 1.0.
The script logs the loss on the whole data set and the gradient norm that ``clip_grad_norm_`` saw.

Introduced in notebook 13.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

CONFIG: dict[str, Any] = {"steps": 30, "lr": 0.05, "max_norm": 1.0, "after_backward": "clip_grad_norm_, scaler.step"}
#: The orders the lines after backward may take (``after_backward``).
CHOICES = {"after_backward": ("clip_grad_norm_, scaler.step", "scaler.unscale_, clip_grad_norm_, scaler.step",
                              "clip_grad_norm_, scaler.unscale_, scaler.step")}


def train(cfg: dict[str, Any]) -> dict[str, list[float]]:
    """The training loop as the learner reads it. Introduced in notebook 13."""
    import torch
    import torch.nn.functional as F

    from labkit import data, models

    x, y = data.make_regression(n=1024, in_features=16, seed=0)
    batches = data.Batches(x, y, batch_size=64, seed=0)
    model = models.MLP(16, 64, 1, depth=2, seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=0.9)
    scaler = torch.amp.GradScaler("cpu")
    log: dict[str, list[float]] = {"loss": [], "clip_saw": [], "scale": []}
    for step in range(cfg["steps"]):
        xb, yb = batches(step)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(model(xb).float(), yb)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        for line in cfg["after_backward"].split(", "):  # the lines after backward, in this order
            if line == "scaler.unscale_":
                scaler.unscale_(opt)
            elif line == "clip_grad_norm_":
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["max_norm"])
            else:
                scaler.step(opt)
        scaler.update()
        with torch.no_grad():
            log["loss"].append(F.mse_loss(model(x), y).item())  # the whole data set
        log["clip_saw"].append(float(norm))
        log["scale"].append(float(scaler.get_scale()))
        print(f"step {step:2d}  loss {log['loss'][-1]:.4f}  grad norm seen by clip {float(norm):9.3g}  "
              f"scale {scaler.get_scale():g}", flush=True)
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
