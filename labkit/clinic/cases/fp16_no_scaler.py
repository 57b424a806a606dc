"""Case "noscale": fp16 training whose loss is stuck from the first step.

A small MLP predicts a 256-sample signal whose values are around 1e-4 (the data are in the wrong unit, a
common accident), trained with SGD under fp16 autocast. The last layer starts at zero, a usual choice for an
output layer. The script logs the loss on the whole data set and the fraction of gradients that are exactly 0.

Introduced in notebook 13.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

CONFIG: dict[str, Any] = {"steps": 40, "lr": 0.5, "precision": "fp16", "scaler_enabled": False}


def train(cfg: dict[str, Any]) -> dict[str, list[float]]:
    """The training loop as the learner reads it. Introduced in notebook 13."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from labkit import data, precision

    x, y = data.make_regression(n=1024, in_features=16, out_features=256, target_scale=1e-4, seed=0)
    batches = data.Batches(x, y, batch_size=128, seed=0)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 256))
    nn.init.zeros_(model[-1].weight)
    nn.init.zeros_(model[-1].bias)
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=0.9)
    dtype = precision.dtype(cfg["precision"])
    scaler = torch.amp.GradScaler("cpu", enabled=cfg["scaler_enabled"])  # disabled: scale() and step() pass through
    log: dict[str, list[float]] = {"loss": [], "zero_grads": []}
    largest = 2 * float(y.abs().max()) / (128 * 256)  # the output starts at 0: pred - y = -y
    print(f"largest output gradient 2|pred - y|/N at step 0: {largest:.1e} (fp16's smallest subnormal: "
          f"{2.0**-24:.1e})", flush=True)
    for step in range(cfg["steps"]):
        xb, yb = batches(step)
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            loss = F.mse_loss(model(xb).float(), yb)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        scaler.step(opt)
        scaler.update()
        with torch.no_grad():
            log["loss"].append(F.mse_loss(model(x), y).item())
        log["zero_grads"].append(float((grads == 0).float().mean()))
        print(f"step {step:2d}  loss {log['loss'][-1]:.6e}  gradients exactly 0: {log['zero_grads'][-1]:6.1%}",
              flush=True)
    return log


def main(argv: Sequence[str] | None = None) -> int:
    """Run the case with ``--config`` and print its evidence. Introduced in notebook 13."""
    import torch

    from labkit.clinic._script import finish, read_config

    cfg = read_config(CONFIG, argv)
    if cfg["precision"] not in ("fp16", "bf16", "fp32"):
        raise ValueError(f"precision must be 'fp16', 'bf16' or 'fp32', got {cfg['precision']!r}")
    torch.set_num_threads(1)
    finish({"config": cfg, **train(cfg)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
