"""DistributedDataParallel training recipe: run it under torchrun or srun; rank 0 prints one JSON result.

Command line (stable; the slurm scripts use it)::

    torchrun --nproc_per_node 2 -m labkit.recipes.ddp --model mlp --steps 20 --batch 32
    srun -n 2 python -m labkit.recipes.ddp --model gpt --precision bf16 --accum 2 --ckpt-dir ckpt
    python -m labkit.recipes.ddp --help

Flags: ``--model {mlp,gpt}``, ``--precision {fp32,bf16,fp16}``, ``--steps`` (optimizer steps),
``--batch`` (per-rank micro-batch), ``--accum`` (micro-batches per step), ``--lr``, ``--seed``,
``--data-size``, ``--hidden``/``--depth`` (MLP size), ``--ckpt-dir``/``--ckpt-every``/``--resume``,
``--crash-rank R --crash-step S`` (fault injection: rank R raises at the start of step S),
``--slow-rank R --slow-ms M`` (rank R sleeps M ms every micro-batch: the slow-rank effect),
``--sync-every-micro`` (all-reduce on every micro-batch: accumulation without ``no_sync``),
``--scaler-first-rank R`` (rank R creates its GradScaler before the optimizer and the DDP wrap, the others after),
``--device``, ``--threads``, ``--pg-timeout``, ``--log-every``. Sizes have upper bounds, given in ``--help``
(``--data-size`` 2**24 examples, ``--hidden`` 65,536, ``--depth`` 10,000 and an MLP of at most 4 billion
parameters, what one 80 GB GPU trains here): a bad value is one line on stderr, exit status 2, before torch loads.

What happens, in order:

1. join the process group with the backend the device gate picks (gloo on CPU, NCCL on CUDA);
2. build the model (same seed on every rank) and move it to its device, then the optimizer;
3. wrap the model in DDP (which broadcasts rank 0's parameters and buffers), register an all-reduce-counting hook;
4. create the GradScaler (fp16 only). Its place does not matter: a new scaler's state is a constant, and DDP
   neither reads it nor replaces the optimizer's parameters (notebook 09 corrects the seed article on this);
5. with ``--resume``, restore model/optimizer/scaler/step/loss history from ``CKPT_DIR/last.pt``
   (:mod:`labkit.train`'s checkpoint format) if it exists; the sampler then skips the batches already seen. A
   checkpoint without a loss history of one number per step is refused (``CheckpointError``, one line);
6. :func:`train_loop`, the loop itself, as plain as nanoGPT's: each step, ``accum`` micro-batches; all but the
   last under ``model.no_sync()`` (no all-reduce), autocast around forward+loss, then the AMP step of
   :mod:`labkit.precision` (scaled backward; unscale, step or skip, update). Around it, not in it: fault
   injection and slow ranks (in the batch source), step timing, logging, and rank 0's atomic checkpoint every
   ``--ckpt-every`` steps (and at the end), followed by a barrier on all ranks.

**Stopping early, cleanly.** If ``$LABKIT_STOP_FILE`` is set, after every step the ranks check (one tiny MAX
all-reduce, so all of them agree) whether that file exists; if it does, they write a checkpoint at the end of the
current step and exit 0, and the result says ``"stopped_at"``. ``slurm/ddp.sbatch`` creates the file on the
walltime warning (``--signal=B:USR1@...``), then requeues the job or prints how to resume.

Precision policies are :mod:`labkit.precision`'s ``fp32``, ``bf16`` and ``fp16`` (autocast over fp32 weights in
all three). Under ``srun`` without torchrun the rank layout comes from ``SLURM_PROCID``/``SLURM_NTASKS``/
``SLURM_LOCALID`` (see :func:`labkit.dist.rank_env`); multi-node runs must export ``MASTER_ADDR``.

Rank 0 prints ``LABKIT_RESULT {json}`` with the global mean loss per step, every rank's gradient and
parameter checksums (sha256 of the raw bytes, so "equal" means bit-identical), all-reduce counts,
scaler scales, timings and the world size.

Introduced in notebook 09.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import math
import os
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = ["build_parser", "checksum", "latest_checkpoint", "main", "tensor_sum", "train_loop"]



def checksum(tensors: Sequence[Any]) -> str:
    """Return a short sha256 hex digest of the raw bytes of ``tensors`` (equal digests: bit-identical).

    Introduced in notebook 09.
    """
    import torch

    from labkit._validate import check_dense

    h = hashlib.sha256()
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"checksum takes tensors, got {type(t).__name__}")
        h.update(check_dense("each tensor", t).detach().to("cpu").contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def tensor_sum(tensors: Sequence[Any]) -> float:
    """Return the float64 sum of all elements of ``tensors`` (a human-readable companion to checksum).

    Introduced in notebook 09.
    """
    import torch

    from labkit._validate import check_dense

    ts = list(tensors)  # TypeError if not iterable
    if not all(isinstance(t, torch.Tensor) for t in ts):
        raise TypeError("tensor_sum takes a sequence of tensors")
    for t in ts:
        check_dense("each tensor", t)
    return float(sum(float(t.detach().double().sum()) for t in ts))


def latest_checkpoint(ckpt_dir: str | os.PathLike) -> Path | None:
    """Return the checkpoint the recipe resumes from (``labkit.train.CHECKPOINT_NAME`` in ``ckpt_dir``), or None.

    Introduced in notebook 09.
    """
    from labkit.train import CHECKPOINT_NAME

    path = Path(ckpt_dir) / CHECKPOINT_NAME
    return path if path.is_file() else None


def build_parser() -> argparse.ArgumentParser:
    """Return the recipe's command-line parser (see the module docstring).

    Bad values, and flags that contradict each other or this launch's world size, are rejected while
    parsing (exit status 2, one line on stderr), before any process group starts.
    Introduced in notebook 09.
    """
    from labkit import _cli
    from labkit._validate import MAX_DEPTH

    whole, seed = _cli.int_in(0), _cli.int_in(0, 2**32 - 1)
    ap = _cli.ArgumentParser(
        prog="python -m labkit.recipes.ddp", checks=[_check_flags],
        description="DDP training recipe (run under torchrun or srun). Rank 0 prints one "
                    "LABKIT_RESULT {json} line: losses, per-rank checksums, timings, world size.")
    ap.add_argument("--model", choices=["mlp", "gpt"], default="mlp",
                    help="mlp: regression MLP; gpt: TinyGPT on the 'reverse' token task (default: mlp)")
    ap.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32",
                    help="fp32, or autocast to bf16 / fp16 (fp16 adds a GradScaler) (default: fp32)")
    ap.add_argument("--steps", type=_cli.int_in(1, _MAX_STEPS), default=20,
                    help=f"optimizer steps in total, at most {_MAX_STEPS:,} (default: 20)")
    ap.add_argument("--batch", type=_cli.int_in(1, _MAX_DATA), default=32,
                    help="micro-batch per rank, at most --data-size / ranks (default: 32)")
    ap.add_argument("--accum", type=_cli.int_in(1, _MAX_ACCUM), default=1,
                    help=f"micro-batches per optimizer step, at most {_MAX_ACCUM:,} (default: 1)")
    ap.add_argument("--lr", type=_cli.float_in(0.0, low_open=True), default=3e-3,
                    help="AdamW learning rate, a finite number > 0 (default: 3e-3)")
    ap.add_argument("--seed", type=seed, default=0, help="model, data and sampler seed (default: 0)")
    ap.add_argument("--data-size", type=_cli.int_in(1, _MAX_DATA), default=4096,
                    help=f"examples in the data set, at most {_MAX_DATA:,}: every rank generates all of them in "
                         "host memory (default: 4096)")
    ap.add_argument("--hidden", type=_cli.int_in(1, _MAX_HIDDEN), default=256,
                    help=f"MLP width, at most {_MAX_HIDDEN:,} (default: 256)")
    ap.add_argument("--depth", type=_cli.int_in(0, MAX_DEPTH), default=3,
                    help=f"MLP hidden layers, at most {MAX_DEPTH:,}; the MLP may have at most "
                         f"{_MAX_TRAIN_PARAMS:,} parameters (default: 3)")
    ap.add_argument("--ckpt-dir", default=None, help="directory for checkpoints (default: none)")
    ap.add_argument("--ckpt-every", type=whole, default=0,
                    help="save every K steps (0: only at the end; needs --ckpt-dir) (default: 0)")
    ap.add_argument("--resume", action="store_true",
                    help="continue from the newest checkpoint in --ckpt-dir, if there is one")
    ap.add_argument("--crash-rank", type=whole, default=None, help="fault injection: this rank raises ...")
    ap.add_argument("--crash-step", type=whole, default=None, help="... at the start of this step (0-based)")
    ap.add_argument("--slow-rank", type=whole, default=None, help="this rank sleeps --slow-ms per micro-batch")
    ap.add_argument("--slow-ms", type=_cli.float_in(0.0, _MAX_SLOW_MS), default=0.0,
                    help="milliseconds the slow rank sleeps (needs --slow-rank)")
    ap.add_argument("--scaler-first-rank", type=whole, default=None,
                    help="this rank creates its GradScaler before the optimizer and the DDP wrap (fp16; the others "
                         "after): the order does not matter")
    ap.add_argument("--sync-every-micro", action="store_true",
                    help="all-reduce after every micro-batch (accumulation without no_sync, for comparison)")
    ap.add_argument("--device", type=_cli.device, default=None,
                    help="cpu or cuda (default: labkit.device.pick_device())")
    ap.add_argument("--threads", type=_cli.int_in(1, _MAX_THREADS), default=None,
                    help=f"torch threads per rank, at most {_MAX_THREADS:,} (default: $OMP_NUM_THREADS, else 1)")
    ap.add_argument("--pg-timeout", type=_cli.pg_timeout, default=60.0,
                    help="process-group (collective) timeout in seconds, at most a week (default: 60)")
    ap.add_argument("--log-every", type=whole, default=0, help="rank 0 prints the loss every K steps (0: never)")
    return ap


# The longest sleep --slow-ms takes (an hour): a typo cannot make a rank sleep for ever.
_MAX_SLOW_MS = 3600e3
# Sizes the flags take, each refused while parsing (before torch is imported) rather than by an allocation or a
# loop that does not end. --data-size: every rank generates the whole data set in host memory, up to ~0.4 KB an
# example (the GPT task's token tensors), so 2**24 examples are ~7 GB per rank, 4,096 times the default.
_MAX_DATA = 2**24
# --hidden: wider than any production model's MLP (GPT-3's is 49,152).
_MAX_HIDDEN = 2**16
# The MLP's parameters: what one 80 GB GPU trains with this recipe, at 20 bytes a parameter (fp32 weights and
# gradients, AdamW's two states, DDP's gradient buckets).
_MAX_TRAIN_PARAMS = 4 * 10**9
# --steps: ten million optimizer steps (the loss history holds one number per step); --accum: micro-batches per
# step; --threads: more than any node's cores.
_MAX_STEPS = 10**7
_MAX_ACCUM = 2**16
_MAX_THREADS = 1024


def _check_flags(args: argparse.Namespace) -> None:
    """The parser's check of flags together, and of the launcher's environment (ValueError -> exit status 2)."""
    from labkit import dist as ldist

    _validate(args, ldist.rank_env().world_size)  # a bad RANK/WORLD_SIZE/MASTER_PORT says so here, in one line
    if args.ckpt_dir:
        _check_writable(Path(args.ckpt_dir))


def _check_writable(path: Path) -> None:
    """Raise ValueError unless ``path`` is, or can become, a directory this process can write to: found before the
    model is built, not at the first checkpoint. Nothing is created: a temporary probe file goes into the nearest
    folder that exists (``path`` itself, or the parent it would be made in) and is removed at once."""
    import tempfile

    probe = path
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        raise ValueError(f"--ckpt-dir {path}: {probe} is not a directory")
    try:
        with tempfile.NamedTemporaryFile(dir=probe, prefix=".labkit-probe-"):
            pass
    except OSError as exc:
        raise ValueError(f"--ckpt-dir {path}: cannot write in {probe} ({exc.strerror or exc})") from None


def _validate(args: argparse.Namespace, world: int | None) -> None:
    """Raise ValueError for flags that contradict each other (or, when ``world`` is known, the world size)."""
    from labkit._validate import mlp_param_count

    for name in ("steps", "batch", "accum", "data_size", "hidden"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.depth < 0 or args.ckpt_every < 0 or args.log_every < 0 or args.seed < 0:
        raise ValueError("--depth, --ckpt-every, --log-every and --seed must be >= 0")
    if not (args.lr > 0 and math.isfinite(args.lr)):
        raise ValueError(f"--lr must be a finite number > 0, got {args.lr}")
    if (args.crash_rank is None) != (args.crash_step is None):
        raise ValueError("--crash-rank and --crash-step go together")
    if args.crash_step is not None and not 0 <= args.crash_step < args.steps:
        raise ValueError(f"--crash-step must be in [0, --steps {args.steps}), got {args.crash_step}")
    if (args.slow_rank is None) != (args.slow_ms == 0):
        raise ValueError("--slow-rank and --slow-ms (> 0) go together")
    if args.scaler_first_rank is not None and args.precision != "fp16":
        raise ValueError("--scaler-first-rank needs --precision fp16 (only fp16 has a GradScaler)")
    if (args.ckpt_every or args.resume) and not args.ckpt_dir:
        raise ValueError("--ckpt-every and --resume need --ckpt-dir")
    if args.model == "mlp":
        n_params = mlp_param_count(16, args.hidden, 1, args.depth)
        if n_params > _MAX_TRAIN_PARAMS:
            raise ValueError(f"--hidden {args.hidden} --depth {args.depth} make an MLP of {n_params:,} parameters; "
                             f"at most {_MAX_TRAIN_PARAMS:,} train on one 80 GB GPU here (20 bytes each: fp32 "
                             "weights and gradients, AdamW's two states, DDP's buckets)")
    if world is None:
        return
    if args.crash_rank is not None and not 0 <= args.crash_rank < world:
        raise ValueError(f"--crash-rank must be in [0, {world}), got {args.crash_rank}")
    if args.slow_rank is not None and not 0 <= args.slow_rank < world:
        raise ValueError(f"--slow-rank must be in [0, {world}), got {args.slow_rank}")
    if args.scaler_first_rank is not None and not 0 <= args.scaler_first_rank < world:
        raise ValueError(f"--scaler-first-rank must be in [0, {world}), got {args.scaler_first_rank}")
    if args.data_size // world < args.batch:
        raise ValueError(f"--data-size {args.data_size} gives each of {world} ranks fewer than "
                         f"--batch {args.batch} examples")


def _build(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """Return (model, dataset, loss_fn) on the CPU, identical on every rank (seeded)."""
    import torch
    from torch.utils.data import TensorDataset

    from labkit import data, models

    if args.model == "mlp":
        x, y = data.make_regression(n=args.data_size, in_features=16, seed=args.seed)
        model = models.MLP(16, args.hidden, 1, depth=args.depth, activation="gelu", seed=args.seed)
        return model, TensorDataset(x, y), torch.nn.functional.mse_loss
    task = data.make_token_task("reverse", n=args.data_size, n_digits=6, vocab_size=12, seed=args.seed)
    model = models.TinyGPT(models.GPTConfig(vocab_size=task.vocab_size, seq_len=task.seq_len), seed=args.seed)
    return model, TensorDataset(task.inputs, task.targets), models.lm_loss


def _micro_batches(loader: Any, sampler: Any, start: int) -> Iterator[tuple[Any, ...]]:
    """Yield micro-batches from global micro-batch index ``start`` on, epoch after epoch (resumable)."""
    per_epoch = len(loader)
    epoch, skip = divmod(start, per_epoch)
    while True:
        sampler.set_epoch(epoch)
        yield from itertools.islice(iter(loader), skip, None)
        epoch, skip = epoch + 1, 0


def train_loop(ddp: Any, opt: Any, scaler: Any, policy: Any, batches: Iterator[tuple[Any, Any]], loss_fn: Any,
               steps: int, accum: int = 1, start: int = 0,
               sync_every_micro: bool = False) -> Iterator[tuple[int, float, Any]]:
    """The DDP training loop: yield ``(step, loss, precision.StepInfo)`` after each optimizer step.

    ``ddp`` is the DDP-wrapped model, ``batches`` yields ``(x, y)`` micro-batches already on the device,
    ``policy`` a :mod:`labkit.precision` policy, ``scaler`` a ``torch.amp.GradScaler`` (fp16) or ``None``.
    Introduced in notebook 09.
    """
    from labkit import precision

    device_type = next(ddp.parameters()).device.type
    for step in range(start, steps):
        opt.zero_grad(set_to_none=True)
        step_loss = 0.0
        for micro in range(accum):
            x, y = next(batches)
            last = micro == accum - 1
            sync = contextlib.nullcontext() if last or sync_every_micro else ddp.no_sync()  # all-reduce on last
            with sync:
                with precision.autocast(policy, device_type):
                    loss = loss_fn(ddp(x), y) / accum
                precision.backward(loss, scaler)  # DDP all-reduces the (scaled) gradients during backward
            step_loss += float(loss.detach())
        yield step, step_loss, precision.update(opt, scaler)  # unscale, step or skip, new scale


def _instrumented(batches: Iterator[tuple[Any, ...]], args: argparse.Namespace, rank: int, start: int,
                  device: Any) -> Iterator[tuple[Any, Any]]:
    """The micro-batch source with the recipe's fault injection: a crash at a step, a slow rank."""
    import time as _time

    index = start * args.accum
    for xb, yb in batches:
        if args.crash_rank == rank and args.crash_step == index // args.accum and index % args.accum == 0:
            raise RuntimeError(f"injected crash: rank {rank} at step {index // args.accum} "
                               "(--crash-rank/--crash-step)")
        if args.slow_rank == rank and args.slow_ms > 0:
            _time.sleep(args.slow_ms / 1000.0)
        index += 1
        yield xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)


def _run(args: argparse.Namespace) -> dict[str, Any] | None:
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler

    from labkit import device as dev_gate
    from labkit import dist as ldist
    from labkit import precision
    from labkit import train as ltrain

    t_start = time.perf_counter()
    threads = args.threads or int(os.environ.get("OMP_NUM_THREADS", "1") or 1)
    torch.set_num_threads(max(1, threads))
    device = dev_gate.pick_device(args.device)
    renv = ldist.rank_env()
    if dev_gate.is_cuda(device):
        device = torch.device("cuda", renv.local_rank)
    backend = dev_gate.dist_backend(device)
    _validate(args, renv.world_size)
    policy = precision.get_policy(args.precision)  # fp32, or bf16/fp16 autocast over fp32 weights
    if not dev_gate.computes(policy.compute_dtype, device):
        raise ValueError(f"--precision {args.precision}: autocast to {policy.compute_dtype} does not work on {device}")
    dev_gate.set_current_device(device)  # object collectives and barriers then use this rank's GPU
    renv = ldist.init_process_group(backend, timeout_s=args.pg_timeout,
                                    device=device if dev_gate.is_cuda(device) else None)
    rank, world = renv.rank, renv.world_size

    # 2. model (seeded: identical on every rank) and optimizer; --scaler-first-rank makes its scaler first
    first = args.scaler_first_rank == rank
    scaler_first = torch.amp.GradScaler(device.type) if first else None
    model, dataset, loss_fn = _build(args)
    model.to(device)
    opt = ltrain.make_optimizer(model.parameters(), "adamw", lr=args.lr)
    # 3. DDP wrap (broadcasts rank 0's parameters) + a hook that counts the all-reduces it issues
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    comm = {"calls": 0, "bytes": 0}

    def counting_hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP rejects string annotations
        state["calls"] += 1
        state["bytes"] += bucket.buffer().numel() * bucket.buffer().element_size()
        return default_hooks.allreduce_hook(None, bucket)  # type: ignore[arg-type]

    ddp.register_comm_hook(comm, counting_hook)
    # 4. the GradScaler (fp16 only; bf16 has fp32's exponent range and needs none); before or after the wrap alike
    scaler = scaler_first if first else torch.amp.GradScaler(device.type) if policy.scaler else None
    # 5. resume
    start, losses, resumed_from = 0, [], None
    ckpt_dir = Path(args.ckpt_dir) if args.ckpt_dir else None
    if args.resume and ckpt_dir is not None:
        path = latest_checkpoint(ckpt_dir)
        if path is not None:
            state = ltrain.load_checkpoint(path)
            if state.get("policy") != args.precision:
                raise ValueError(f"{path} was written with --precision {state.get('policy')}, "
                                 f"not {args.precision}")
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            if scaler is not None and state.get("scaler"):
                scaler.load_state_dict(state["scaler"])
            start, losses = int(state["step"]), _resumed_losses(path, state)
            resumed_from = start
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=args.seed,
                                 drop_last=True)
    loader = DataLoader(dataset, batch_size=args.batch, sampler=sampler, drop_last=True, num_workers=0)
    batches = _micro_batches(loader, sampler, start * args.accum)
    if rank == 0 and ckpt_dir is not None:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    t_ready = time.perf_counter()

    step_times: list[float] = []
    local_losses: list[float] = []
    skipped, saved = 0, []
    source = _instrumented(batches, args, rank, start, device)
    stopped_at = None
    t0 = time.perf_counter()
    for step, step_loss, info in train_loop(ddp, opt, scaler, policy, source, loss_fn, args.steps, args.accum,
                                            start, args.sync_every_micro):
        dev_gate.synchronize(device)
        step_times.append(time.perf_counter() - t0)
        local_losses.append(step_loss)
        skipped += int(info.skipped)
        if ckpt_dir is not None and args.ckpt_every and (step + 1) % args.ckpt_every == 0 and step + 1 < args.steps:
            saved += _checkpoint(ckpt_dir, step + 1, model, opt, scaler, args.precision, losses,
                                 local_losses, rank, world)
        if rank == 0 and args.log_every and (step + 1) % args.log_every == 0:
            print(f"step {step + 1}/{args.steps} local loss {step_loss:.4f} "
                  f"({step_times[-1] * 1e3:.1f} ms)", flush=True)
        if step + 1 < args.steps and ldist.stop_requested(device):  # the walltime warning (slurm/ddp.sbatch)
            stopped_at = step + 1  # every rank agrees (one all-reduce), so all of them stop after this step
            if rank == 0:
                print(f"stop requested (${ldist.STOP_FILE_VAR}): checkpoint at step {stopped_at}, then exit", flush=True)
            break
        t0 = time.perf_counter()
    t_train = time.perf_counter() - t_ready
    done = stopped_at if stopped_at is not None else args.steps

    # global mean loss per step (one all-reduce at the end, not one per step)
    lt = torch.tensor(local_losses, dtype=torch.float64, device=device)
    dist.all_reduce(lt)
    run_losses = (lt / world).tolist()
    all_losses = losses + run_losses
    if ckpt_dir is not None:
        saved += _checkpoint(ckpt_dir, done, model, opt, scaler, args.precision, losses,
                             local_losses, rank, world, global_losses=all_losses)
    params = [p for p in model.parameters()]
    grads = [p.grad for p in params if p.grad is not None]
    mine = {"grad_checksum": checksum(grads) if grads else None, "param_checksum": checksum(params),
            "grad_sum": tensor_sum(grads) if grads else None, "param_sum": tensor_sum(params),
            "allreduce_calls": comm["calls"], "allreduce_bytes": comm["bytes"],
            "scaler_scale": scaler.get_scale() if scaler is not None else None, "skipped_steps": skipped,
            "scaler_created": None if scaler is None else "before the wrap" if first else "after the wrap",
            "step_s_median": statistics.median(step_times) if step_times else None,
            "train_s": t_train}
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, mine)
    if rank != 0:
        return None
    n_steps = done - start
    def per(key: str) -> list[Any]:
        return [g[key] for g in gathered]

    return {
        "recipe": "ddp", "world_size": world, "backend": backend, "device": str(device),
        "launcher": renv.launcher, "model": args.model,
        "params": sum(p.numel() for p in params), "precision": args.precision,
        "steps": args.steps, "start_step": start, "resumed_from": resumed_from, "stopped_at": stopped_at,
        "batch_per_rank": args.batch, "accum": args.accum, "global_batch": args.batch * world * args.accum,
        "lr": args.lr, "seed": args.seed, "losses": all_losses,
        "grad_checksums": per("grad_checksum"), "param_checksums": per("param_checksum"),
        "grad_sums": per("grad_sum"), "param_sums": per("param_sum"),
        "allreduce_calls": per("allreduce_calls"), "allreduce_bytes": per("allreduce_bytes"),
        "micro_batches": n_steps * args.accum, "sync_every_micro": args.sync_every_micro,
        "scaler_scales": per("scaler_scale"), "skipped_steps": per("skipped_steps"),
        "scaler_created": per("scaler_created"),
        "timings": {"init_s": t_ready - t_start, "train_s": t_train, "train_s_per_rank": per("train_s"),
                    "step_s_median_per_rank": per("step_s_median")},
        "samples_per_s": (n_steps * args.batch * world * args.accum / t_train) if t_train > 0 else None,
        "checkpoint_steps": saved,
        "checkpoint": str(latest_checkpoint(ckpt_dir)) if ckpt_dir is not None else None,
        "threads_per_rank": torch.get_num_threads(),
    }


def _resumed_losses(path: Path, state: dict[str, Any]) -> list[float]:
    """Return the loss curve a ``--resume`` continues: the checkpoint's ``history["loss"]``, one number per step.

    The recipe's checkpoints hold the global mean loss of every step done (``state["step"]`` of them). A
    checkpoint whose history has no such list (missing, not a list, of another length, or holding anything but
    numbers: written by something else, or altered) is refused with :class:`labkit.train.CheckpointError`, one
    line naming the file, rather than resumed with a loss curve that does not match its steps.
    """
    from labkit import train as ltrain

    loss, step = state["history"].get("loss"), state["step"]
    problem = _loss_problem(loss, step)
    if problem is not None:
        raise ltrain.CheckpointError(path, f"its history has no 'loss' list of {step} numbers, one per step done "
                                           f"({problem}), so --resume cannot continue the run's loss curve")
    return [float(x) for x in loss]


def _loss_problem(loss: Any, step: int) -> str | None:
    """Say what keeps ``loss`` from being a loss history of ``step`` numbers, or None if nothing does."""
    if not isinstance(loss, list):
        return "it has none" if loss is None else f"it has a {type(loss).__name__}"
    if len(loss) != step:
        return f"it has {len(loss)}"
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in loss):
        return "it holds something that is not a number"
    return None


def _checkpoint(ckpt_dir: Path, step: int, model: Any, opt: Any, scaler: Any, policy: str,
                prior: list[float], local_losses: list[float], rank: int, world: int,
                global_losses: list[float] | None = None) -> list[int]:
    """Rank 0 writes a checkpoint atomically; every rank then waits at a barrier (so none races ahead)."""
    import torch
    import torch.distributed as dist

    from labkit import train as ltrain

    if global_losses is None:  # the mean over ranks of the losses so far (small: one float per step)
        lt = torch.tensor(local_losses, dtype=torch.float64, device=next(model.parameters()).device)
        dist.all_reduce(lt)
        global_losses = prior + (lt / world).tolist()
    if rank == 0:  # labkit.train's format: temp file + os.replace, never a torn file
        ltrain.save_checkpoint(ckpt_dir / ltrain.CHECKPOINT_NAME, step=step, model=model, optimizer=opt,
                               scaler=scaler, policy=policy, history={"loss": global_losses})
    dist.barrier()
    return [step]


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the flags, train on this rank, print the result on rank 0; return the exit status.

    Introduced in notebook 09.
    """
    import torch.distributed as dist

    from labkit import dist as ldist

    args = build_parser().parse_args(argv)
    # On an exception the process group is left alone: torchrun's record() writes this rank's error file
    # first, and only the exit then closes the connections, so the other ranks fail *after* it and the
    # launch names this rank as the root cause (destroying the group first let a peer fail first).
    # A checkpoint that --resume cannot use is the user's file, not a bug: one line, exit status 2 (every rank
    # reads the same file and says the same).
    from labkit.train import CheckpointError

    try:
        result = _run(args)
    except CheckpointError as exc:
        print(f"python -m labkit.recipes.ddp: error: {exc}", file=sys.stderr, flush=True)
        return 2
    if result is not None:
        ldist.emit_result(result)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    build_parser().parse_args()  # --help and a bad flag answer at once, before torch is imported
    from labkit.dist import run_rank_main

    run_rank_main(main)  # flushes, then exits without C++ teardown (see its docstring)
