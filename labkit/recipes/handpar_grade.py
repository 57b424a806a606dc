"""Grade notebook 11's exercises on the ranks: run a learner's module next to the real thing.

Run under torchrun with 2 ranks; rank 0 prints one ``LABKIT_RESULT {json}`` line with, per file, every rank's
findings (what matched the reference and what did not)::

    torchrun --nproc_per_node 2 -m labkit.recipes.handpar_grade --file tp=my_tp.py [--file ddp=my_ddp.py ...]

Exercises (``EXERCISE=PATH``), and the names each file must define:

- ``ddp``: ``overlap_gradients(model) -> wait``, against torch ``DistributedDataParallel`` (bitwise gradients for 2
  steps) and whether all-reduces start during backward;
- ``zero1``: ``zero1_step(flat_param, flat_grad, shard, optimizer)`` inside :class:`labkit.handpar.ShardedAdamW`,
  against unsharded AdamW after 3 steps (bitwise), and against AdamW on summed gradients (the typical mistake);
- ``tp``: ``CopyToTP`` and ``ReduceFromTP`` inside :class:`labkit.handpar.TensorParallelMLP`, against the
  single-process MLP (output and every gradient, the input's too);
- ``gpipe``: ``gpipe_step(stage, inputs, targets, loss_fn, act_shape)`` with 4 micro-batches on a small 2-stage
  model, against the whole model on the whole batch.

The judging (what the findings mean for the learner) is :mod:`labkit.exercises.nb11`'s. The setups are
:mod:`labkit.recipes.handpar`'s. Introduced in notebook 11.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import uuid
from collections.abc import Sequence
from typing import Any

from labkit._validate import safe_repr
from labkit.recipes import handpar as H

__all__ = ["GRADES", "build_parser", "grade", "main"]

#: The exercises and the names each learner's file must define.
GRADES = {"ddp": ("overlap_gradients",), "zero1": ("zero1_step",), "tp": ("CopyToTP", "ReduceFromTP"),
          "gpipe": ("gpipe_step",)}
PP_SMALL = (64, 256, 2)  # the pipeline the gpipe grader runs: batch, width, linear layers per stage


def build_parser() -> argparse.ArgumentParser:
    """Return the command-line parser (``--help`` documents it). Introduced in notebook 11."""
    from labkit import _cli

    ap = _cli.ArgumentParser(prog="python -m labkit.recipes.handpar_grade",
                             description="Grade notebook 11's exercises on 2 ranks (under torchrun).")
    ap.add_argument("--file", action="append", default=[], required=True,
                    help=f"EXERCISE=PATH, EXERCISE one of {', '.join(GRADES)} (repeatable)")
    ap.add_argument("--pg-timeout", type=_cli.pg_timeout, default=30.0, help="collective timeout, s (default: 30)")
    ap.add_argument("--device", type=_cli.device, default=None,
                    help="cpu or cuda (default: labkit.device.pick_device()); on cuda each rank uses its local GPU")
    return ap


def _load(path: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"learner_{uuid.uuid4().hex[:8]}", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot load {path} as a Python module")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class _Work:
    """A collective's work handle, passed through; it notes in its recorder when someone waits on it."""

    def __init__(self, work: Any, rec: _Calls, name: str) -> None:
        self._work, self._rec, self._name = work, rec, name
        self.waited = False
        rec.works.append(self)

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        self.waited = True
        self._rec.events.append(("wait", self._name))
        self._rec.numels.append(0)
        return self._work.wait(*args, **kwargs)

    def get_future(self) -> Any:
        """The handle's future. A learner may wait through it (``torch.futures.wait_all``, as DDP's comm hooks do),
        where no wrapper can see the wait: taking the future counts as waiting; the bitwise comparison of the
        gradients still catches one never waited for."""
        self.waited = True
        return self._work.get_future()

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._work, attr)


class _Calls:
    """While active, the ``torch.distributed`` functions in ``names`` record each call in ``events`` as
    ``(name, "blocking" | "async")``, and a wait on an async call's handle as ``("wait", name)``; ``numels`` holds,
    event by event, the element count of a call's first tensor (0 for waits and marks), ``works`` every handle
    handed out. They are patched where a learner's module can reach them: as ``dist.<name>`` or imported by name
    after entering."""

    def __init__(self, *names: str) -> None:
        self.names = names
        self.events: list[tuple[str, str]] = []
        self.numels: list[int] = []
        self.works: list[_Work] = []
        self._saved: list[tuple[Any, str, Any]] = []
        self._depth = 0

    def __enter__(self) -> _Calls:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        for name in self.names:
            original = getattr(c10d, name)

            def call(*args: Any, _name: str = name, _fn: Any = original, **kwargs: Any) -> Any:
                if self._depth:  # called from inside another watched function (send may use isend): not the learner's
                    return _fn(*args, **kwargs)
                self._depth += 1
                try:
                    work = _fn(*args, **kwargs)
                finally:
                    self._depth -= 1
                self.events.append((_name, "blocking" if work is None else "async"))
                first = args[0] if args else next(iter(kwargs.values()), None)
                self.numels.append(first.numel() if hasattr(first, "numel") else 0)
                return work if work is None else _Work(work, self, _name)

            for owner in (dist, c10d):
                self._saved.append((owner, name, getattr(owner, name)))
                setattr(owner, name, call)
        return self

    def __exit__(self, *exc: Any) -> None:
        for owner, name, fn in reversed(self._saved):
            setattr(owner, name, fn)
        self._saved.clear()

    def count(self, kind: str) -> int:
        """How many calls were ``kind`` ("blocking" or "async")."""
        return sum(1 for _, k in self.events if k == kind)

    def step_done(self) -> None:
        """Mark the end of a training step: :meth:`waited_early` looks at each step on its own."""
        self.events.append(("step", ""))
        self.numels.append(0)

    def unwaited(self) -> int:
        """Async calls whose handle nobody waited on (their results may not have arrived when used)."""
        return sum(1 for w in self.works if not w.waited)

    def waited_early(self) -> int:
        """Waits that came, within a step, before that step's last call was issued (waiting inside a hook
        serialises the overlap)."""
        early, step = 0, []
        for event in [*self.events, ("step", "")]:
            if event[0] != "step":
                step.append(event[0])
                continue
            last = max((i for i, name in enumerate(step) if name != "wait"), default=-1)
            early += sum(1 for i, name in enumerate(step) if name == "wait" and i < last)
            step = []
        return early


#: The collectives a gradient sync could be written with (a blocking one serialises backward).
_SYNC_CALLS = ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_single", "reduce_scatter_single")


def _grade_ddp(mod: Any, calls: _Calls | None = None) -> dict[str, Any]:
    """The learner's overlap_gradients against torch DDP: bitwise gradients, and all-reduces during backward."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = dist.get_rank()
    mine, ref = H._mlp(), H._mlp()
    ddp = DDP(ref)
    wait = mod.overlap_gradients(mine)
    if not callable(wait):
        return {"returned": type(wait).__name__}
    opt_a = torch.optim.AdamW(mine.parameters(), lr=H.LR, foreach=False)
    opt_b = torch.optim.AdamW(ref.parameters(), lr=H.LR, foreach=False)
    bitwise, ratios, issued = True, [], []
    for step in range(2):
        x, y = H._batch(step, rank)
        for o in (opt_a, opt_b):
            o.zero_grad(set_to_none=True)
        issued.append(H._ddp_step(mine, wait, x, y))
        if calls is not None:
            calls.step_done()
        H._mse(ddp(x), y).backward()
        a, b = H._flat(p.grad for p in mine.parameters()), H._flat(p.grad for p in ref.parameters())
        bitwise = bitwise and torch.equal(a, b)
        ratios.append(float((a * b).sum() / (b * b).sum()))
        opt_a.step()
        opt_b.step()
    return {"bitwise": bitwise, "ratio": ratios[0], "in_backward": min(c["issued_in_backward"] for c in issued),
            "issued": issued[-1]["issued"], "n_tensors": len(list(mine.parameters())),
            "blocking": calls.count("blocking") if calls is not None else 0,
            "waited_early": calls.waited_early() if calls is not None else 0,
            "unwaited": calls.unwaited() if calls is not None else 0}


def _grade_zero1(mod: Any) -> dict[str, Any]:
    import torch

    steps = 3
    ref, _ = H._replicated_adamw(steps)
    summed, _ = H._replicated_adamw(steps, average=False)
    model, opt, _, events = H._sharded(steps, step_fn=mod.zero1_step)
    init = H._flat(H._mlp().parameters())
    mine, theirs = H._flat(model.parameters()), H._flat(ref.parameters())
    lo, hi = opt.rank * opt.part, min(opt.numel, (opt.rank + 1) * opt.part)
    outside = torch.ones(opt.numel, dtype=torch.bool, device=mine.device)
    outside[lo:hi] = False
    return {"bitwise": torch.equal(mine, theirs), "rel": H._rel(mine, theirs),
            "summed": torch.equal(mine, H._flat(summed.parameters())),
            "outside_unchanged": bool(torch.equal(mine[outside], init[outside])),
            "inside_rel": H._rel(mine[lo:hi], theirs[lo:hi]), "digest": H._digest(mine),
            "state_numel": sum(v.numel() for k, v in opt.optimizer.state[opt.shard].items() if k != "step"),
            "part": opt.part, "padded": opt.padded, "collectives": H._calls(events)}


def _p2p_marks(calls: _Calls | None, start: int) -> tuple[str, int]:
    """The point-to-point events since event ``start``, as marks: "S" a send or isend, "R" a blocking recv or the
    wait on an irecv (when the data is needed); and the new event count."""
    if calls is None:
        return "", 0
    marks = []
    for name, kind in calls.events[start:]:
        if name in ("send", "isend"):
            marks.append("S")
        elif name == "recv" or (name == "wait" and kind == "irecv"):
            marks.append("R")
    return "".join(marks), len(calls.events)


def _grade_gpipe(mod: Any, calls: _Calls | None = None) -> dict[str, Any]:
    import torch.distributed as dist

    rank = dist.get_rank()
    batch, width, layers = PP_SMALL
    ref_loss, ref_grads = H._pp_reference(batch, width, layers)
    x, y = H._pp_data(batch, width)
    stage = H._pp_model(width, layers)[rank]
    m = 4
    from labkit import handpar

    # what this stage did, in order: "F" per forward of its first layer, "B" per backward reaching its last layer's
    # output, "S" per send or isend, "R" per receive (recorded by `calls`; those made since the last mark go first)
    order: list[str] = []
    seen = [len(calls.events) if calls is not None else 0]

    def mark(kind: str) -> None:
        marks, seen[0] = _p2p_marks(calls, seen[0])
        order.extend(marks)
        order.append(kind)

    hooks = [stage[0].register_forward_pre_hook(lambda *_: mark("F")),
             stage[-1].register_full_backward_pre_hook(lambda *_: mark("B"))]
    try:
        with handpar.recorded_collectives() as ev:
            loss = H._pp_run(m, mod.gpipe_step, stage, x, y)
    finally:
        for h in hooks:
            h.remove()
    order.extend(_p2p_marks(calls, seen[0])[0])
    grads = [p.grad for p in stage.parameters()]
    if any(g is None for g in grads):
        return {"missing_grads": True, "order": "".join(order)}
    ratio = [float((a * b).sum() / (b * b).sum()) for a, b in zip(grads, ref_grads[rank])]
    return {"grad_rel": max(H._rel(a, b) for a, b in zip(grads, ref_grads[rank])), "ratio": min(ratio),
            "ratio_max": max(ratio), "loss": loss, "ref_loss": ref_loss, "m": m,
            "loss_rel": (abs(loss - ref_loss) / ref_loss) if isinstance(loss, (int, float)) else None,
            "p2p": H._calls(ev), "order": "".join(order)}


def grade(name: str, path: str) -> dict[str, Any]:
    """Run a learner's file for exercise ``name`` on this rank; every rank returns its findings.

    ``path`` is a ``.py`` file; it runs in this process. Needs the process group (run under torchrun).
    Introduced in notebook 11.
    """
    import torch.distributed as dist

    if name not in GRADES:
        raise ValueError(f"name must be one of {sorted(GRADES)}, got {safe_repr(name)}")
    if not isinstance(path, (str, os.PathLike)) or not str(path).endswith(".py") or not os.path.isfile(path):
        raise ValueError(f"path must name an existing .py file, got {safe_repr(path)}")
    if not dist.is_initialized():
        raise ValueError("grade runs on a rank: join the process group first (run under torchrun)")
    # the learner's module is loaded and run while its collectives are recorded (how it calls them: blocking or
    # not, waited when, reduce-scatter or all-reduce, sends between which computations)
    watched = {"ddp": _SYNC_CALLS,
               "zero1": ("reduce_scatter_single", "reduce_scatter_tensor", "reduce_scatter", "all_reduce"),
               "tp": (), "gpipe": ("send", "isend", "recv", "irecv")}[name]
    with _Calls(*watched) as calls:
        mod = _load(str(path))
        missing = [n for n in GRADES[name] if not hasattr(mod, n)]
        if missing:
            return {"missing": missing}
        if name == "ddp":
            return _grade_ddp(mod, calls)
        if name == "zero1":  # (the references around it all-reduce too, per tensor: a whole-vector one is the learner's)
            found = _grade_zero1(mod)
            return {**found, "reduce_scatters": sum(1 for n, _ in calls.events if n.startswith("reduce_scatter")),
                    "whole_all_reduces": sum(1 for (n, _), k in zip(calls.events, calls.numels)
                                             if n == "all_reduce" and k >= found["padded"])}
        if name == "tp":
            return H._tp_case(f=mod.CopyToTP, g=mod.ReduceFromTP)
        return _grade_gpipe(mod, calls)


def main(argv: Sequence[str] | None = None, *, cli: bool = False) -> int:
    """Grade every ``--file`` on this rank; rank 0 prints every rank's findings.

    Raises ``ValueError`` when not started by torchrun with 2 ranks (``cli=True``, as ``python -m`` runs it: one
    line on stderr and exit status 2; ``--help`` works anywhere). Introduced in notebook 11.
    """
    ap = build_parser()
    args = H._two_rank_args(ap, argv, cli, "labkit.recipes.handpar_grade --file EXERCISE=PATH")
    jobs = []
    for item in args.file:
        name, sep, path = item.partition("=")
        if not sep or name not in GRADES:
            ap.error(f"--file {item!r}: expected EXERCISE=PATH with EXERCISE one of {', '.join(GRADES)}")
        if not path.endswith(".py") or not os.path.isfile(path):
            ap.error(f"--file {item!r}: {path} is not a .py file")
        jobs.append((name, path))
    import torch
    import torch.distributed as dist

    from labkit import device as dev_gate
    from labkit import dist as ldist

    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1") or 1)))
    H._DEV = H.rank_device(args.device)  # the setups follow it; the backend comes from the device gate
    ldist.init_process_group(dev_gate.dist_backend(H._DEV), timeout_s=args.pg_timeout,
                             device=H._DEV if dev_gate.is_cuda(H._DEV) else None)
    try:
        grades = [{"exercise": n, "file": f, "ranks": H._gather(grade(n, f))} for n, f in jobs]
        if dist.get_rank() == 0:
            ldist.emit_result({"world_size": dist.get_world_size(), "grades": grades})
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    import functools

    from labkit.dist import run_rank_main

    run_rank_main(functools.partial(main, cli=True))
