"""Case "scaler-ckpt": an fp16 run that is stopped, checkpointed and resumed, and then does not go on as before.

An MLP regression on unnormalised targets (values around 50), AdamW, fp16 autocast with a ``GradScaler`` at its
defaults. The script trains ``steps`` steps without a break (the reference), then trains again, stops at
``resume_at``, writes a checkpoint, builds everything afresh as a new job would, loads the checkpoint and
finishes. It logs the loss, the loss scale and the skipped steps of both runs.

Introduced in notebook 13.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

CONFIG: dict[str, Any] = {"steps": 30, "resume_at": 15, "lr": 1e-3, "checkpoint_keys": "model, optimizer, step"}
#: What the checkpoint may hold (``checkpoint_keys``).
CHOICES = {"checkpoint_keys": ("model, optimizer, step", "model, optimizer, step, rng", "model, optimizer, step, scaler",
                               "model, optimizer, step, scaler, rng")}


def build(cfg: dict[str, Any]) -> tuple[Any, Any, Any]:
    """A fresh model, optimizer and scaler, as every job builds them. Introduced in notebook 13."""
    import torch

    from labkit import models

    model = models.MLP(16, 128, 1, depth=3, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"])
    scaler = torch.amp.GradScaler("cpu")
    return model, opt, scaler


def train(model: Any, opt: Any, scaler: Any, steps: range, log: dict[str, list]) -> None:
    """The training loop (fp16 AMP). Introduced in notebook 13."""
    import torch
    import torch.nn.functional as F

    from labkit import data

    x, y = data.make_regression(n=1024, in_features=16, target_scale=50.0, seed=0)
    batches = data.Batches(x, y, batch_size=64, seed=0)  # the batch of a step does not depend on what ran before
    for step in steps:
        xb, yb = batches(step)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(model(xb).float(), yb)
        opt.zero_grad(set_to_none=True)
        scale = scaler.get_scale()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        log["loss"].append(loss.item())
        log["scale"].append(scale)
        log["skipped"].append(scaler.get_scale() < scale)  # the scale backed off: this step was skipped


def save(path: Path, model: Any, opt: Any, scaler: Any, step: int, cfg: dict[str, Any]) -> None:
    """Write the checkpoint. Introduced in notebook 13."""
    import torch

    state = {"model": model.state_dict, "optimizer": opt.state_dict, "step": lambda: step,
             "scaler": scaler.state_dict, "rng": torch.get_rng_state}
    ckpt = {name: state[name]() for name in cfg["checkpoint_keys"].split(", ")}
    torch.save(ckpt, path)


def resume(path: Path, model: Any, opt: Any, scaler: Any) -> int:
    """Load the checkpoint into freshly built objects; return the step to go on from. Introduced in notebook 13."""
    import torch

    ckpt = torch.load(path, weights_only=True)
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
    if "scaler" in ckpt:
        scaler.load_state_dict(ckpt["scaler"])
    if "rng" in ckpt:
        torch.set_rng_state(ckpt["rng"])
    return int(ckpt["step"])


def _digest(model: Any) -> str:
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.detach().contiguous().view(-1).numpy().tobytes())
    return h.hexdigest()[:12]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the case with ``--config`` and print its evidence. Introduced in notebook 13."""
    import torch

    from labkit.clinic._script import finish, read_config

    cfg = read_config(CONFIG, argv, CHOICES)
    if not 0 < cfg["resume_at"] < cfg["steps"]:
        raise ValueError(f"resume_at must be between 1 and steps - 1, got {cfg['resume_at']}")
    torch.set_num_threads(1)
    ref: dict[str, list] = {"loss": [], "scale": [], "skipped": []}
    model, opt, scaler = build(cfg)
    train(model, opt, scaler, range(cfg["steps"]), ref)
    ref_digest = _digest(model)

    run: dict[str, list] = {"loss": [], "scale": [], "skipped": []}
    model, opt, scaler = build(cfg)
    train(model, opt, scaler, range(cfg["resume_at"]), run)
    with tempfile.TemporaryDirectory(prefix="labkit-clinic-") as tmp:
        path = Path(tmp) / "last.pt"
        save(path, model, opt, scaler, cfg["resume_at"], cfg)
        del model, opt, scaler  # the job ends here; a new one starts from the file
        model, opt, scaler = build(cfg)
        start = resume(path, model, opt, scaler)
    print(f"resumed at step {start} with loss scale {scaler.get_scale():g} "
          f"(the run had reached {run['scale'][-1]:g} before the stop)", flush=True)
    train(model, opt, scaler, range(start, cfg["steps"]), run)
    for name, r in (("uninterrupted", ref), ("resumed", run)):
        after = [s for s, k in enumerate(r["skipped"]) if k and s >= cfg["resume_at"]]
        print(f"{name:>13}: skipped steps after step {cfg['resume_at']}: {after or 'none'}; "
              f"final loss {r['loss'][-1]:.2f}", flush=True)
    finish({"config": cfg, "reference": ref, "resumed": run, "reference_digest": ref_digest,
            "resumed_digest": _digest(model)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
