"""Case "rdzv": a 2-rank job that never starts training: the ranks cannot meet.

The script was adapted from a single-node tutorial, which sets ``MASTER_ADDR`` and ``MASTER_PORT`` itself before
``init_process_group``. Here the port in the script is the one an earlier job used (``"stale"``: the clinic's
runner reserves a port on 127.0.0.1 where nothing listens, and puts its number here). The launcher, torchrun,
runs its own rendezvous store on the port it was given, and tells the ranks with the same two variables. The
process group has a short timeout (``pg_timeout_s``).

Run it under ``torchrun --nproc_per_node 2``. Introduced in notebook 13.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Sequence
from typing import Any

CONFIG: dict[str, Any] = {"master_addr": "127.0.0.1", "master_port": "stale", "tutorial_sets": "MASTER_ADDR, MASTER_PORT",
                          "pg_timeout_s": 3.0}
#: Which os.environ lines of the tutorial the script keeps (``tutorial_sets``; "" for none).
CHOICES = {"tutorial_sets": ("MASTER_ADDR, MASTER_PORT", "MASTER_PORT", "")}


def join(cfg: dict[str, Any]) -> None:
    """Join the process group, as the learner reads it. Introduced in notebook 13."""
    import torch.distributed as dist

    launcher = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
    given = {"MASTER_ADDR": cfg["master_addr"], "MASTER_PORT": str(cfg["master_port"])}
    for name in filter(None, cfg["tutorial_sets"].split(", ")):  # the tutorial's os.environ lines
        os.environ[name] = given[name]
    print(f"rank {os.environ['RANK']}: torchrun set {launcher}; joining via "
          f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}", flush=True)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=cfg["pg_timeout_s"]))


def main(argv: Sequence[str] | None = None) -> int:
    """Join, check the group with one all-reduce, print the evidence on rank 0. Introduced in notebook 13."""
    import torch
    import torch.distributed as dist

    from labkit.clinic._script import finish, read_config

    cfg = read_config(CONFIG, argv, CHOICES)
    if cfg["master_port"] == "stale":
        raise ValueError("master_port 'stale' is resolved by the clinic's runner: run this case with "
                         "labkit.clinic.run_case('rdzv'), or pass a port number")
    join(cfg)
    try:
        t = torch.ones(1)
        dist.all_reduce(t)
        print(f"rank {dist.get_rank()}: joined a group of {dist.get_world_size()}; all_reduce gave {t.item():g}",
              flush=True)
        finish({"config": cfg, "world_size": dist.get_world_size(), "all_reduce": t.item()})
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    from labkit.dist import run_rank_main

    run_rank_main(main, exit_on_error=True)  # records a failure for torchrun, then ends the process at once
