"""Case "loader": training steps that spend most of their time waiting for the next batch.

Each example is read from slow shared storage: about 1 ms per record, most of it waiting on the file system
(emulated with a sleep, which is what such a read costs the CPU: nothing). Each record also says how long its
read took. The model is a small MLP, a millisecond or two per step against some 35 ms of reading, so that the
reads stay the profile's top row even on a heavily loaded machine (a model of 1024 wide layers fell behind
aten::mm there). The script runs ``steps`` steps under ``torch.profiler`` (after ``warmup`` steps, with
:func:`labkit.profiling.profile_steps`) and reports how long each step waited in ``next(loader)`` against how
long reading its batch took, the profiler's table, and the step time.

Introduced in notebook 13.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Sequence
from typing import Any

#: What one record costs to read from the storage: the file system's speed, not a setting of the script.
READ_MS = 1.0
CONFIG: dict[str, Any] = {"steps": 12, "warmup": 3, "batch_size": 32, "num_workers": 0, "prefetch_factor": 2,
                          "pin_memory": False}


class RecordFile:
    """A map-style dataset whose records are read one by one from slow storage. Introduced in notebook 13."""

    def __init__(self, n: int, read_ms: float) -> None:
        import torch

        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 256, generator=g)
        self.y = torch.randn(n, 1, generator=g)
        self.read_s = read_ms / 1000.0

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[Any, Any, float]:
        t0 = time.perf_counter()
        time.sleep(self.read_s)  # the read: the process waits on the file system
        return self.x[i], self.y[i], time.perf_counter() - t0  # the record, and how long reading it took


def make_loader(cfg: dict[str, Any]) -> Any:
    """The DataLoader, as the learner reads it. Introduced in notebook 13."""
    from torch.utils.data import DataLoader

    workers = cfg["num_workers"]
    extra = {"prefetch_factor": cfg["prefetch_factor"], "persistent_workers": True} if workers > 0 else {}
    return DataLoader(RecordFile(4096, READ_MS), batch_size=cfg["batch_size"], shuffle=True,
                      num_workers=workers, pin_memory=cfg["pin_memory"], **extra)


def train(cfg: dict[str, Any]) -> dict[str, Any]:
    """The training loop, profiled. Introduced in notebook 13."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from labkit import profiling

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = make_loader(cfg)
    batches = (batch for _epoch in itertools.count() for batch in loader)  # epoch after epoch
    wait, busy, read = [], [], []

    def step() -> None:
        t0 = time.perf_counter()
        with torch.profiler.record_function("wait for data: next(loader)"):
            x, y, read_s = next(batches)
        t1 = time.perf_counter()
        with torch.profiler.record_function("compute: forward, backward, step"):
            loss = F.mse_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        wait.append(t1 - t0)
        busy.append(time.perf_counter() - t1)
        read.append(float(read_s.sum()))  # what reading this batch's records took, wherever it happened

    # warm-up steps first (the workers start, the first batches arrive), then the profiled steps
    prof = profiling.profile_steps(step, steps=cfg["steps"], warmup=cfg["warmup"])
    table = profiling.op_table(prof, row_limit=6)
    wait, busy, read = wait[cfg["warmup"]:], busy[cfg["warmup"]:], read[cfg["warmup"]:]
    return {"wait_share": sum(wait) / (sum(wait) + sum(busy)),
            "step_s": statistics.median(w + b for w, b in zip(wait, busy)),  # the median step: robust to hiccups
            "wait_s": wait, "busy_s": busy, "read_s": read, "table": table}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the case with ``--config`` and print its evidence. Introduced in notebook 13."""
    import torch

    from labkit.clinic._script import finish, read_config

    cfg = read_config(CONFIG, argv)
    for name in ("steps", "warmup", "batch_size", "prefetch_factor"):
        if cfg[name] < 1:
            raise ValueError(f"{name} must be >= 1, got {cfg[name]}")
    if cfg["num_workers"] < 0:
        raise ValueError(f"num_workers must be >= 0, got {cfg['num_workers']}")
    torch.set_num_threads(1)
    out = train(cfg)
    print(out["table"], flush=True)
    wait_ms, read_ms = (statistics.median(out[k]) * 1e3 for k in ("wait_s", "read_s"))
    print(f"{out['wait_share']:.0%} of the step time waiting for data; median step {out['step_s'] * 1e3:.1f} ms, of "
          f"which {wait_ms:.1f} ms in next(loader), while reading its batch took {read_ms:.1f} ms", flush=True)
    finish({"config": cfg, **out})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
