"""Case "ifname": a 2-rank job that fails before its first step, the same way on every rank.

The job script was copied from another cluster; it exports the network interface its collectives should use (the
nodes of that cluster talk over InfiniBand's IP interface, ``ib0``). gloo reads ``GLOO_SOCKET_IFNAME``, NCCL reads
``NCCL_SOCKET_IFNAME``; here both ranks run on one machine, whose only interface they share is loopback.

Run it under ``torchrun --nproc_per_node 2``. Introduced in notebook 13.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

CONFIG: dict[str, Any] = {"GLOO_SOCKET_IFNAME": "ib0", "NCCL_SOCKET_IFNAME": "ib0", "pg_timeout_s": 5.0}
#: The interface names the job script may export (``GLOO_SOCKET_IFNAME``, ``NCCL_SOCKET_IFNAME``).
CHOICES = {"GLOO_SOCKET_IFNAME": ("ib0", "eth9", "lo"), "NCCL_SOCKET_IFNAME": ("ib0", "eth9", "lo")}


def job_env(cfg: dict[str, Any]) -> None:
    """The job script's exports, as the learner reads them. Introduced in notebook 13."""
    os.environ["GLOO_SOCKET_IFNAME"] = cfg["GLOO_SOCKET_IFNAME"]
    os.environ["NCCL_SOCKET_IFNAME"] = cfg["NCCL_SOCKET_IFNAME"]


def main(argv: Sequence[str] | None = None) -> int:
    """Export the job's settings, join the process group, all-reduce once. Introduced in notebook 13."""
    import torch
    import torch.distributed as dist

    from labkit.clinic._script import finish, gloo_ranks, read_config

    cfg = read_config(CONFIG, argv, CHOICES)
    job_env(cfg)
    print(f"rank {os.environ.get('RANK')}: GLOO_SOCKET_IFNAME={os.environ['GLOO_SOCKET_IFNAME']} "
          f"NCCL_SOCKET_IFNAME={os.environ['NCCL_SOCKET_IFNAME']}", flush=True)
    with gloo_ranks(cfg["pg_timeout_s"]):
        t = torch.ones(4)
        dist.all_reduce(t)
        finish({"config": cfg, "all_reduce": t.tolist()})
    return 0


if __name__ == "__main__":
    from labkit.dist import run_rank_main

    run_rank_main(main, exit_on_error=True)
