"""Case "bf16-scaler": bf16 training whose loss scale never moves from 65536.

An fp16 AMP recipe switched to bf16 by changing the autocast dtype, keeping its ``GradScaler``. The script trains
a tiny GPT and logs the loss, the loss scale, the skipped steps and the largest scaled gradient against the
largest finite value of the gradients' format, and times the scaler's own work (unscale and the inf/NaN check).

Introduced in notebook 13.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

CONFIG: dict[str, Any] = {"steps": 12, "precision": "bf16", "grad_scaler": True, "growth_interval": 2000}


def train(cfg: dict[str, Any]) -> dict[str, Any]:
    """The training loop as the learner reads it. Introduced in notebook 13."""
    import torch

    from labkit import data, models, precision

    task = data.make_token_task("reverse", n=512, n_digits=6, vocab_size=12, seed=0)
    batches = data.Batches(task.inputs, task.targets, batch_size=32, seed=0)
    model = models.TinyGPT(vocab_size=12, seq_len=12, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dtype = precision.dtype(cfg["precision"])
    scaler = torch.amp.GradScaler("cpu", growth_interval=cfg["growth_interval"], enabled=cfg["grad_scaler"])
    log: dict[str, Any] = {"loss": [], "scale": [], "skipped": [], "max_scaled_grad": [], "scaler_s": 0.0}
    for step in range(cfg["steps"]):
        xb, yb = batches(step)
        with torch.autocast("cpu", dtype=dtype):
            loss = models.lm_loss(model(xb), yb)
        opt.zero_grad(set_to_none=True)
        scale = scaler.get_scale() if cfg["grad_scaler"] else 1.0
        scaler.scale(loss).backward()
        log["max_scaled_grad"].append(max(float(p.grad.abs().max()) for p in model.parameters()))
        t0 = time.perf_counter()
        scaler.unscale_(opt)  # (a no-op when the scaler is disabled)
        log["scaler_s"] += time.perf_counter() - t0
        scaler.step(opt)
        scaler.update()
        log["loss"].append(loss.item())
        log["scale"].append(scale)
        log["skipped"].append(cfg["grad_scaler"] and scaler.get_scale() < scale)
        print(f"step {step:2d}  loss {loss.item():.4f}  loss scale {scale:g}", flush=True)
    log["format_max"] = float(torch.finfo(dtype).max)
    return log


def main(argv: Sequence[str] | None = None) -> int:
    """Run the case with ``--config`` and print its evidence. Introduced in notebook 13."""
    import torch

    from labkit.clinic._script import finish, read_config

    cfg = read_config(CONFIG, argv)
    if cfg["precision"] not in ("bf16", "fp16"):
        raise ValueError(f"precision must be 'bf16' or 'fp16', got {cfg['precision']!r}")
    if cfg["growth_interval"] < 1:
        raise ValueError(f"growth_interval must be >= 1, got {cfg['growth_interval']}")
    torch.set_num_threads(1)
    log = train(cfg)
    print(f"skipped steps: {sum(log['skipped'])}; largest scaled gradient {max(log['max_scaled_grad']):.3g}, "
          f"largest {cfg['precision']} value {log['format_max']:.3g}", flush=True)
    finish({"config": cfg, "grad_scaler": cfg["grad_scaler"], **log})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
