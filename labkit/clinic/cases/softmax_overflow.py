"""Case "softmax": a transformer whose fp16 loss is NaN from the first step.

A tiny GPT (notebook 04's) with a hand-written attention softmax, ``exp(x) / sum(exp(x))``, fine-tuned with
fp16 autocast and a ``GradScaler``. It starts from a checkpoint of a long run whose attention logits have grown
(the query and key weights are 12 times their initial size: large attention logits are a known effect of long
training). The script logs the loss and the loss scale, then runs one forward pass with
``labkit.debug.first_nonfinite`` to find the first module whose output held a NaN or inf.

Introduced in notebook 13.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

CONFIG: dict[str, Any] = {"steps": 6, "lr": 3e-4, "softmax": "naive", "init_scale": 65536.0}


def load_model(cfg: dict[str, Any]) -> Any:
    """The model, as the checkpoint of the long run left it. Introduced in notebook 13."""
    import torch

    from labkit import models

    model = models.TinyGPT(vocab_size=12, seq_len=12, softmax=cfg["softmax"], seed=0)
    with torch.no_grad():  # stands in for the checkpoint: query and key weights grown 12x
        d = model.config.d_model
        for block in model.blocks:
            block.attn.qkv.weight[: 2 * d].mul_(12.0)
    return model


def train(cfg: dict[str, Any], model: Any) -> dict[str, list[float]]:
    """The fine-tuning loop as the learner reads it. Introduced in notebook 13."""
    import torch

    from labkit import data, models

    task = data.make_token_task("reverse", n=512, n_digits=6, vocab_size=12, seed=0)
    batches = data.Batches(task.inputs, task.targets, batch_size=32, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"])
    scaler = torch.amp.GradScaler("cpu", init_scale=cfg["init_scale"])
    log: dict[str, list[float]] = {"loss": [], "scale": []}
    for step in range(cfg["steps"]):
        xb, yb = batches(step)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = models.lm_loss(model(xb), yb)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)  # skipped when a gradient is inf/NaN
        scaler.update()
        log["loss"].append(loss.item())
        log["scale"].append(scaler.get_scale())
        print(f"step {step}  loss {loss.item():.4f}  loss scale {scaler.get_scale():g}", flush=True)
    return log


def main(argv: Sequence[str] | None = None) -> int:
    """Run the case with ``--config``, then look for the first NaN; print the evidence. Introduced in notebook 13."""
    import torch

    from labkit import data, debug, models
    from labkit.clinic._script import finish, read_config

    cfg = read_config(CONFIG, argv)
    if cfg["softmax"] not in models.SOFTMAX_IMPLS:
        raise ValueError(f"softmax must be one of {models.SOFTMAX_IMPLS}, got {cfg['softmax']!r}")
    torch.set_num_threads(1)
    model = load_model(cfg)
    log = train(cfg, model)
    task = data.make_token_task("reverse", n=64, n_digits=6, vocab_size=12, seed=1)
    with torch.autocast("cpu", dtype=torch.float16):
        found = debug.first_nonfinite(model, lambda: model(task.inputs[:32]))
    where = found.describe() if found else "no module output held a NaN or inf"
    print("labkit.debug.first_nonfinite:", where, flush=True)
    absmax = [a.last_scores_absmax for a in model.attentions]
    print("largest |attention logit| per block:", ", ".join(f"{v:.1f}" for v in absmax),
          f"(fp16's exp overflows above {math.log(65504):.2f})", flush=True)
    finish({"config": cfg, **log, "first_nonfinite": None if found is None else found.module,
            "first_nonfinite_kind": None if found is None else found.kind, "describe": where,
            "scores_absmax": absmax})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
