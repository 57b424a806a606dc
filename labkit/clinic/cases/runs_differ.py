"""Case "repro": two runs of the same script, with the same seed, that end with different weights.

The training data come as named shards (as files in a folder would); the script trains on every shard once,
without duplicates. It sets ``torch.manual_seed`` first. Two copies of the same run start at once (2 processes
under torchrun, each training on its own; they only meet at the end to compare notes), and the script logs,
per run, a checksum of the initial weights, the order of the shards, the final loss and a checksum of the
final weights.

Run it under ``torchrun --nproc_per_node 2``. Introduced in notebook 13.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

CONFIG: dict[str, Any] = {"seed": 0, "shard_list": "list(set(shards))", "deterministic": False, "lr": 0.05}
#: How the list of shards may be built (``shard_list``).
CHOICES = {"shard_list": ("list(set(shards))", "tuple(set(shards))", "sorted(set(shards))")}


def _digest(model: Any) -> str:
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.detach().contiguous().view(-1).numpy().tobytes())
    return h.hexdigest()[:12]


def train(cfg: dict[str, Any]) -> dict[str, Any]:
    """The training script as the learner reads it. Introduced in notebook 13."""
    import torch
    import torch.nn.functional as F

    from labkit import data, models

    torch.manual_seed(cfg["seed"])
    torch.use_deterministic_algorithms(cfg["deterministic"])
    x, y = data.make_regression(n=1024, in_features=16, seed=0)
    shards = {f"shard-{i:02d}": (x[i * 64:(i + 1) * 64], y[i * 64:(i + 1) * 64]) for i in range(16)}
    if cfg["shard_list"] == "sorted(set(shards))":  # every shard once, in an order given by CONFIG
        names = sorted(set(shards))
    elif cfg["shard_list"] == "tuple(set(shards))":
        names = tuple(set(shards))
    else:
        names = list(set(shards))
    model = models.MLP(16, 64, 1, depth=2)  # initialised from the global RNG, seeded above
    init = _digest(model)
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=0.9)
    for name in names:
        xb, yb = shards[name]
        loss = F.mse_loss(model(xb), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    with torch.no_grad():
        final_loss = F.mse_loss(model(x), y).item()
    return {"init_digest": init, "order": names, "final_loss": final_loss, "final_digest": _digest(model)}


def main(argv: Sequence[str] | None = None) -> int:
    """Train once per process, gather both runs' notes on rank 0, print the evidence. Introduced in notebook 13."""
    import torch
    import torch.distributed as dist

    from labkit import dist as ldist
    from labkit.clinic._script import finish, read_config

    cfg = read_config(CONFIG, argv, CHOICES)
    torch.set_num_threads(1)
    out = train(cfg)  # each process on its own: no collective until the runs are over
    print(f"run {ldist.rank_env().rank}: seed {cfg['seed']}, initial weights {out['init_digest']}, "
          f"first shards {', '.join(out['order'][:4])}, ...; final loss {out['final_loss']:.6f}, "
          f"final weights {out['final_digest']}", flush=True)
    ldist.init_process_group("gloo", timeout_s=60)
    try:
        runs: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(runs, out)
        finish({"config": cfg, "runs": runs})
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    from labkit.dist import run_rank_main

    run_rank_main(main, exit_on_error=True)  # records a failure for torchrun, then ends the process at once
