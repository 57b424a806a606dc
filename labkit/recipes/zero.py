"""Train the tiny GPT with DeepSpeed ZeRO and report losses, loss scales and exact per-rank model-state bytes.

Run it under torchrun (preferred) or the DeepSpeed launcher; each ``--runs`` entry is
``stage:dtype[:offload]`` and gets a fresh model and engine in the same processes::

    torchrun --nproc_per_node 2 -m labkit.recipes.zero --runs 0:bf16,1:bf16,2:bf16,3:bf16 --steps 6
    deepspeed --num_gpus 2 --module labkit.recipes.zero --runs 2:fp16

Rank 0 prints one ``LABKIT_RESULT {json}`` line (see :func:`labkit.dist.launch`) with, per run: the
losses (averaged over ranks and micro-batches), the loss scale after each step, every rank's exact
model-state bytes from :func:`labkit.zero.count_model_states` (taken after the backward of the first
micro-batch of the last step, while gradients are being accumulated; after the last backward when
``--grad-accum 1``), every rank's checksum of the final full parameters, and timings.

DeepSpeed's CPU accelerator JIT-compiles a shared-memory all-reduce op (``deepspeed_shm_comm``, about a
minute cold) the first time a process group starts. ``--shm-comm off`` (the default) tells DeepSpeed
the op is unavailable, so every collective goes through gloo, nothing is compiled and no
``/dev/shm/deepspeed_allreduce_buffer_*`` file is created; ``--shm-comm on`` uses it. Then each rank
removes (unlinks) its own buffer right after the process group starts, once every rank has mapped every
other rank's (a mapping outlives its name), so even a run that fails later leaves nothing in /dev/shm;
:func:`labkit.dist.launch` removes the buffers of ranks killed before that point.

DeepSpeed's stage-0 fp16/bf16 optimizer wrapper steps the torch optimizer once with zero gradients when
it is built. With ``torch_adam`` that leaves Adam's step counter at 1 before training, which shrinks the
first update to 0.74x and makes stage 0 drift from stages 1-3. The recipe resets that counter (and
reports ``adam_prestep``); ``--keep-prestep`` shows DeepSpeed's behaviour as is.

``--torch-adam``/``--no-torch-adam`` choose the optimizer kernel (``optimizer.params.torch_adam`` in each
run's config): torch's AdamW, nothing to compile, is the default with DeepSpeed's CPU accelerator;
on GPUs the default is DeepSpeed's own compiled Adam (``--no-torch-adam``), as notebook 10 advises.

**Stopping early.** If ``$LABKIT_STOP_FILE`` is set, after every step the ranks agree (one MAX all-reduce)
whether it exists; if so the run in progress ends after that step, the remaining runs are skipped, and the
result says ``"stopped_at"``. ``slurm/deepspeed.sbatch`` creates the file on the walltime warning. This recipe
compares ZeRO stages and keeps no checkpoints: DeepSpeed's own checkpoints are read back with pickle, which
labkit does not do from shared storage (see ``labkit.train.load_checkpoint``).

Introduced in notebook 10.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import glob
import hashlib
import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from labkit._validate import safe_repr

__all__ = ["build_parser", "get_accelerator_name", "main", "parse_runs", "shm_buffers", "train_loop"]


def parse_runs(text: str) -> list[tuple[int, str, str]]:
    """Parse ``"0:bf16,2:fp16:cpu"`` into ``[(0, "bf16", "none"), (2, "fp16", "cpu")]``; ValueError if bad.

    Introduced in notebook 10.
    """
    from labkit.zero import DTYPES, OFFLOAD_DEVICES, STAGES

    if not isinstance(text, str):
        raise TypeError(f"runs must be a str such as '0:bf16,3:bf16', got {type(text).__name__}")
    out = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        parts = item.split(":")
        if len(parts) not in (2, 3) or not parts[0].isdigit():
            raise ValueError(f"bad run {safe_repr(item)}: expected stage:dtype[:offload] such as 2:bf16 or 2:bf16:cpu")
        stage, dtype, off = int(parts[0]), parts[1], parts[2] if len(parts) == 3 else "none"
        if stage not in STAGES or dtype not in DTYPES or off not in OFFLOAD_DEVICES:
            raise ValueError(f"bad run {safe_repr(item)}: stage in {STAGES}, dtype in {DTYPES}, offload in "
                             f"{OFFLOAD_DEVICES}")
        out.append((stage, dtype, off))
    if not out:
        raise ValueError("no runs given; use e.g. --runs 0:bf16,3:bf16")
    return out


def shm_buffers(rank: int | None = None) -> list[str]:
    """Return this job's DeepSpeed shared-memory all-reduce buffers in /dev/shm (one rank's, or all).

    DeepSpeed names them ``deepspeed_allreduce_buffer_{uid}_{MASTER_ADDR}_{MASTER_PORT}_{rank}``.
    Introduced in notebook 10.
    """
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
        raise ValueError(f"rank must be None or an int >= 0, got {safe_repr(rank)}")
    prefix = (f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_{os.environ.get('MASTER_ADDR', '')}_"
              f"{os.environ.get('MASTER_PORT', '')}_")
    return sorted(glob.glob(prefix + ("*" if rank is None else str(rank))))


def build_parser() -> argparse.ArgumentParser:
    """Return the command-line parser (documented with ``--help``).

    Bad values are rejected while parsing (exit status 2, one line on stderr), including every run's
    DeepSpeed config as :func:`labkit.zero.config` checks it, before DeepSpeed starts.
    Introduced in notebook 10.
    """
    from labkit import _cli
    from labkit._validate import MAX_DEPTH, MAX_MODEL_PARAMS

    count = _cli.int_in(1)
    ap = _cli.ArgumentParser(
        prog="python -m labkit.recipes.zero", checks=[_check_flags],
        description="Train the tiny GPT with DeepSpeed ZeRO; rank 0 prints one LABKIT_RESULT {json} line.")
    ap.add_argument("--runs", type=_runs, default="0:bf16,1:bf16,2:bf16,3:bf16",
                    help="comma-separated stage:dtype[:offload] runs (default: %(default)s)")
    ap.add_argument("--steps", type=_cli.int_in(1, _MAX_STEPS), default=6,
                    help=f"optimizer steps per run, at most {_MAX_STEPS:,} (default: 6)")
    ap.add_argument("--micro-batch", type=_cli.int_in(1, _MAX_MICRO_BATCH), default=8,
                    help=f"samples per rank per micro-batch, at most {_MAX_MICRO_BATCH:,}")
    ap.add_argument("--grad-accum", type=_cli.int_in(1, _MAX_ACCUM), default=2,
                    help=f"micro-batches per optimizer step, at most {_MAX_ACCUM:,}")
    ap.add_argument("--lr", type=_cli.float_in(0.0, low_open=True), default=3e-3, help="a finite number > 0")
    ap.add_argument("--clip", type=_cli.float_in(0.0), default=1.0, help="gradient clipping (0 = off)")
    ap.add_argument("--d-model", type=_cli.int_in(1, _MAX_D_MODEL), default=96,
                    help=f"a multiple of the 4 attention heads, at most {_MAX_D_MODEL:,}")
    ap.add_argument("--n-layers", type=_cli.int_in(1, MAX_DEPTH), default=2,
                    help=f"transformer blocks, at most {MAX_DEPTH:,}; the model may have at most "
                         f"{MAX_MODEL_PARAMS:,} parameters (default: 2)")
    ap.add_argument("--bucket", type=_cli.int_in(2, _MAX_BUCKET), default=1 << 15,
                    help=f"reduce/prefetch bucket size in elements, at most {_MAX_BUCKET:,} (default: %(default)s)")
    ap.add_argument("--initial-scale-power", type=_cli.int_in(0, 64), default=16,
                    help="fp16: start at 2**this (0-64)")
    ap.add_argument("--loss-scale-window", type=count, default=1000, help="fp16: clean steps per doubling")
    ap.add_argument("--hysteresis", type=count, default=2, help="fp16: overflows before halving")
    ap.add_argument("--shm-comm", choices=["off", "on"], default="off",
                    help="use DeepSpeed's compiled shared-memory all-reduce (default: off, pure gloo)")
    ap.add_argument("--torch-adam", action=argparse.BooleanOptionalAction, default=None,
                    help="torch.optim.AdamW (no C++ compile) instead of DeepSpeed's compiled Adam "
                         "(default: on with DeepSpeed's CPU accelerator, off on GPUs)")
    ap.add_argument("--seed", type=_cli.int_in(0, 2**32 - 1), default=0)
    ap.add_argument("--keep-prestep", dest="reset_prestep", action="store_false",
                    help="keep the Adam step counter DeepSpeed's stage-0 wrapper advances at start-up "
                         "(default: reset it, see the module docstring)")
    ap.add_argument("--local_rank", "--local-rank", type=_cli.int_in(0), default=None,
                    help=argparse.SUPPRESS)
    return ap


# Sizes the flags take, refused while parsing rather than by an allocation or a loop that does not end:
# --steps ten million optimizer steps; --micro-batch and --grad-accum 65,536, thousands of times the defaults;
# --d-model wider than any production transformer (GPT-3: 12,288); --bucket 2**31 elements, four times DeepSpeed's
# default (ZeRO-2 allocates its gradient buckets that size, whole).
_MAX_STEPS = 10**7
_MAX_MICRO_BATCH = 2**16
_MAX_ACCUM = 2**16
_MAX_D_MODEL = 2**16
_MAX_BUCKET = 2**31


def _runs(text: str) -> str:
    """``type=`` for ``--runs``: text that :func:`parse_runs` reads; returns it as given."""
    from labkit import _cli

    try:
        parse_runs(text)
    except ValueError as exc:
        raise _cli.BadValue(str(exc)) from None
    return text


def _check_flags(args: argparse.Namespace) -> None:
    """The parser's check of flags together: the model shape and every run's DeepSpeed config."""
    from labkit import _cli, models

    models.GPTConfig(d_model=args.d_model, n_layers=args.n_layers)
    _cli.launcher_env(args)  # a bad RANK/WORLD_SIZE/MASTER_PORT says so here, in one line
    world = _cli.launch_world() or 1
    for stage, dtype, offload in parse_runs(args.runs):
        _ds_config(stage, dtype, offload, args, world, accelerator="cpu")


def _ds_config(stage: int, dtype: str, offload: str, args: argparse.Namespace, world: int,
               accelerator: str) -> dict[str, Any]:
    """The DeepSpeed config of one run, from the flags; ``torch_adam`` defaults to on for the "cpu" accelerator."""
    from labkit import zero

    torch_adam = args.torch_adam if args.torch_adam is not None else accelerator == "cpu"
    return zero.config(stage, dtype, offload=offload, micro_batch=args.micro_batch,
                       grad_accum=args.grad_accum, world_size=world, lr=args.lr,
                       gradient_clipping=args.clip, initial_scale_power=args.initial_scale_power,
                       loss_scale_window=args.loss_scale_window, hysteresis=args.hysteresis,
                       reduce_bucket_size=args.bucket, param_persistence_threshold=0, torch_adam=torch_adam)


def _checksum(engine: Any, stage: int) -> tuple[str, float]:
    """Return (sha256 prefix, float64 sum) of the full parameters, gathered first under stage 3."""
    import contextlib

    import deepspeed
    import torch

    params = list(engine.module.parameters())
    ctx = deepspeed.zero.GatheredParameters(params) if stage == 3 else contextlib.nullcontext()
    h = hashlib.sha256()
    total = 0.0
    with ctx, torch.no_grad():
        for p in params:
            t = p.detach().float().contiguous().cpu()
            h.update(t.numpy().tobytes())
            total += float(t.double().sum())
    return h.hexdigest()[:16], total


def _loss_scale(engine: Any) -> float | None:
    opt = engine.optimizer
    for holder in (opt, getattr(opt, "loss_scaler", None)):
        if holder is None:
            continue
        for name in ("cur_scale", "loss_scale"):
            v = getattr(holder, name, None)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                return float(v)
            if hasattr(v, "item"):
                return float(v.item())
    return None


def _collectives(events: list[tuple[str, int]]) -> dict[str, dict[str, int]]:
    """``handpar.recorded_collectives``' events as {name: {"calls": n, "elements": total}}."""
    out: dict[str, dict[str, int]] = {}
    for name, n in events:
        c = out.setdefault(name, {"calls": 0, "elements": 0})
        c["calls"] += 1
        c["elements"] += n
    return out


def train_loop(engine: Any, batches: Any, steps: int, grad_accum: int, rank: int, world: int,
               watch: Callable[[int, int], Any] = lambda step, micro: contextlib.nullcontext(),
               between: Callable[[int, int], None] = lambda step, micro: None) -> Iterator[tuple[int, float]]:
    """The DeepSpeed training loop: yield ``(step, loss)`` after each optimizer step (this rank's mean loss).

    ``engine`` is what ``deepspeed.initialize`` returned; ``batches(i, rank=, world_size=)`` gives micro-batch ``i``
    of this rank. DeepSpeed does what DDP's loop does by hand. ``engine.backward`` divides the loss by ``grad_accum``
    (and returns it divided: the loop averages the undivided loss itself), scales it in fp16 (ZeRO stages 1-3), runs
    backward and reduces the gradients: at stages 0 and 1 during the backward of the boundary micro-batch only (stage
    1 bucket by bucket), at stages 2 and 3 bucket by bucket in every micro-batch's backward, each rank keeping its
    slice (stage 3 also gathers the weights for every micro-batch). ``engine.step`` only counts the micro-batch, except
    at the boundary (every ``grad_accum``-th call): there it clips, unscales (fp16: skips the step on an overflow and
    updates the scale), steps the optimizer, all-gathers the new weights (stages 1 and 2) and clears the gradients. ``watch`` and
    ``between`` are the recipe's instrumentation (collectives recorded; model-state bytes counted).
    Introduced in notebook 10.
    """
    import torch

    from labkit import models

    for step in range(steps):
        total = torch.zeros((), dtype=torch.float64, device="cpu")
        for micro in range(grad_accum):
            x, y = batches(step * grad_accum + micro, rank=rank, world_size=world)
            with watch(step, micro):
                logits = engine(x.to(engine.device))
                loss = models.lm_loss(logits.float(), y.to(engine.device))
                engine.backward(loss)  # loss / grad_accum, scaled (fp16), backward, gradients reduced (when: by stage)
                between(step, micro)
                engine.step()  # counts the micro-batch; at the boundary: clip, unscale, step, gather, clear the grads
            total += loss.detach().double().cpu()  # .cpu() waits for the device: the step's time is the GPU's
        yield step, float(total) / grad_accum


def _one_run(stage: int, dtype: str, offload: str, args: argparse.Namespace, world: int, rank: int,
             task: Any) -> dict[str, Any]:
    import deepspeed
    import torch
    import torch.distributed as dist

    from labkit import data, handpar, models, zero
    from labkit import dist as ldist

    model = models.TinyGPT(vocab_size=task.vocab_size, seq_len=task.seq_len, d_model=args.d_model,
                           n_layers=args.n_layers, seed=args.seed)
    numels = [p.numel() for p in model.parameters()]
    cfg = _ds_config(stage, dtype, offload, args, world, get_accelerator_name())
    t0 = time.perf_counter()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    init_s = time.perf_counter() - t0
    # DeepSpeed's stage-0 fp16/bf16 wrapper (FP16_UnfusedOptimizer) steps the torch optimizer once with
    # zero gradients at construction, to allocate its states. With torch's AdamW that advances Adam's
    # step counter to 1, so every later bias correction is one step off and the first update is 0.74x
    # the size it is at stages 1-3. Undo only the counter (the states are still zero, weight decay is 0).
    prestep = 0
    for st in engine.basic_optimizer.state.values():
        s_ = st.get("step")
        if s_ is not None and float(s_) > 0:
            prestep = max(prestep, int(float(s_)))
            if args.reset_prestep:
                s_.zero_() if hasattr(s_, "zero_") else st.__setitem__("step", 0)
    batches = data.Batches(task.inputs, task.targets, batch_size=args.micro_batch * world, seed=args.seed)
    losses, scales, overflows, step_s = [], [], [], []
    snapshot: dict[str, Any] | None = None
    per_micro: list[dict[str, Any]] = []
    last = args.steps - 1

    @contextlib.contextmanager
    def watch(step: int, micro: int) -> Iterator[None]:
        """The last step's collectives, micro-batch by micro-batch (recorded only then)."""
        if step != last:
            yield
            return
        with handpar.recorded_collectives() as ev:
            yield
        per_micro.append(_collectives(ev))

    def between(step: int, micro: int, engine: Any = engine) -> None:
        """After backward, before step: the model-state bytes while gradients are accumulated (the last step)."""
        nonlocal snapshot
        if step == last and (micro == 0 if args.grad_accum > 1 else True):
            snapshot = zero.count_model_states(engine)

    t_train = ts = time.perf_counter()
    stopped_at = None
    for step, loss in train_loop(engine, batches, args.steps, args.grad_accum, rank, world, watch, between):
        step_s.append(time.perf_counter() - ts)
        acc = torch.tensor(loss, dtype=torch.float64, device=engine.device)  # NCCL reduces device tensors only
        dist.all_reduce(acc)
        losses.append(float(acc) / world)
        scales.append(_loss_scale(engine) if dtype == "fp16" else None)
        overflows.append(bool(getattr(engine.optimizer, "overflow", False)) if dtype == "fp16" else False)
        if step + 1 < args.steps and ldist.stop_requested(engine.device):  # every rank agrees
            stopped_at = step + 1
            break
        ts = time.perf_counter()
    train_s = time.perf_counter() - t_train
    digest, total = _checksum(engine, stage)
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, {"bytes": snapshot, "checksum": digest, "param_sum": total})
    result = {
        "stage": stage, "dtype": dtype, "offload": offload, "stopped_at": stopped_at,
        "optimizer": type(engine.optimizer).__name__,
        "adam_prestep": prestep, "adam_prestep_reset": bool(prestep and args.reset_prestep),
        "losses": losses, "loss_scales": scales, "overflow": overflows,
        "skipped_steps": int(getattr(engine, "skipped_steps", 0)),
        "bytes_per_rank": [g["bytes"] for g in gathered],
        "checksums": [g["checksum"] for g in gathered],
        "param_sums": [g["param_sum"] for g in gathered],
        "n_params": sum(numels), "param_numels": numels,
        # the last step's collectives on this rank, one dict per micro-batch: {name: {"calls", "elements"}}
        "collectives_per_micro": per_micro,
        "config": cfg,
        # fp16's loss-scale settings, under the names labkit.scaling.deepspeed_scale_sequence takes (None in bf16)
        **{k: (cfg["fp16"][k] if dtype == "fp16" else None)
           for k in ("initial_scale_power", "loss_scale_window", "hysteresis")},
        "timings": {"init_s": init_s, "train_s": train_s,
                    "step_s_median": statistics.median(step_s[1:] or step_s)},
    }
    del engine, model, between, watch  # between's default argument holds the engine too
    gc.collect()
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """Run the requested ZeRO runs in this rank and print the result on rank 0; return the exit status.

    Introduced in notebook 10.
    """
    args = build_parser().parse_args(argv)
    runs = parse_runs(args.runs)
    for name in ("steps", "micro_batch", "grad_accum", "d_model", "n_layers", "bucket"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    from labkit import device as dev_gate

    if "DS_ACCELERATOR" not in os.environ and not dev_gate.is_cuda(dev_gate.pick_device()):
        os.environ["DS_ACCELERATOR"] = "cpu"  # say it, rather than let DeepSpeed guess and warn
    t_start = time.perf_counter()
    import deepspeed
    import torch
    import torch.distributed as dist

    from labkit import data, precision
    from labkit import dist as ldist

    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    if args.shm_comm == "off":
        import deepspeed.ops

        # DeepSpeed caches its op-compatibility table in this module attribute (and documents that edits
        # to it persist); marking the op unavailable makes every collective go through gloo.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    if "LOCAL_SIZE" not in os.environ and "LOCAL_WORLD_SIZE" in os.environ:
        os.environ["LOCAL_SIZE"] = os.environ["LOCAL_WORLD_SIZE"]  # what the shm op checks (torchrun)
    t0 = time.perf_counter()
    backend = "gloo" if get_accelerator_name() == "cpu" else None
    deepspeed.init_distributed(dist_backend=backend)
    init_dist_s = time.perf_counter() - t0
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        # init_distributed returns on a rank once it has mapped every peer's shm buffer; after a barrier all
        # ranks have, so the names can go now: the mappings live on until exit, and nothing leaks later.
        dist.barrier()
        _remove_own_buffers(rank)
        from deepspeed.accelerator import get_accelerator

        acc = get_accelerator()
        where = "cpu" if acc.device_name() == "cpu" else f"cuda:{os.environ.get('LOCAL_RANK', '0')}"
        for _, dtype, _ in runs:
            if dtype == "fp32":
                continue
            tdt = precision.dtype(dtype)
            ds_ok, runs_here = dev_gate.deepspeed_accepts(tdt), dev_gate.computes(tdt, where)
            if not (ds_ok and runs_here):
                raise RuntimeError(
                    f"{dtype} is not supported on this device ({where}): labkit.device.computes says "
                    f"{runs_here}, labkit.device.deepspeed_accepts says {ds_ok}; run bf16 or fp32 instead")
        task = data.make_token_task("reverse", n=2048, n_digits=6, vocab_size=12, seed=args.seed)
        results = []
        for s, d, o in runs:  # a stop request (the walltime warning) ends the run in progress and skips the rest
            results.append(_one_run(s, d, o, args, world, rank, task))
            if results[-1]["stopped_at"] is not None:
                break
        dist.barrier()
        _remove_own_buffers(rank)  # unlinking a mapped file is safe: the mapping lives until exit
        dist.barrier()
        left = shm_buffers()  # every rank of this job has cleaned up by now
        if rank == 0:
            ldist.emit_result({
                "recipe": "zero", "world_size": world, "backend": dist.get_backend(),
                "accelerator": acc.device_name(), "deepspeed": deepspeed.__version__,
                "shm_comm": args.shm_comm, "steps": args.steps, "micro_batch": args.micro_batch,
                "grad_accum": args.grad_accum, "runs": results, "shm_files_left": left,
                "timings": {"init_distributed_s": init_dist_s, "total_s": time.perf_counter() - t_start},
            })
    finally:
        try:
            dist.destroy_process_group()
        finally:
            _remove_own_buffers(rank)
    return 0


def _remove_own_buffers(rank: int) -> None:
    for path in shm_buffers(rank):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def get_accelerator_name() -> str:
    """Return DeepSpeed's accelerator name ("cpu", "cuda", …). Introduced in notebook 10."""
    from deepspeed.accelerator import get_accelerator

    return str(get_accelerator().device_name())


if __name__ == "__main__":
    build_parser().parse_args()  # --help and a bad flag answer at once, before torch is imported
    from labkit.dist import run_rank_main

    run_rank_main(main)  # flushes, then exits without C++ teardown (see its docstring)
