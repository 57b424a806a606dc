"""DeepSpeed ZeRO made explicit: build and explain configs, predict partitions, count model-state bytes.

- :func:`config` builds a DeepSpeed config dict (ZeRO stage, fp16 dynamic loss scaling or bf16, optimizer
  offload, gradient clipping, and a batch triple kept consistent) and :func:`validate` checks any such
  dict, raising a ``ValueError`` that says what to change *before* DeepSpeed sees it.
- :func:`explain` turns a config into one readable line per key.
- :func:`partition_layout` predicts, per rank, how many elements of parameters and gradients DeepSpeed
  0.19 keeps for each stage, including its padding and the whole-tensor gradient granularity of stage 2.
- :func:`count_model_states` counts the exact bytes of every tensor a live DeepSpeed engine holds,
  grouped as params / grads / master / optimizer / buffers / other (used by :mod:`labkit.recipes.zero`).

Example::

    from labkit import zero
    cfg = zero.config(2, "bf16", offload="cpu", micro_batch=4, grad_accum=2, world_size=8)
    print(zero.explain(cfg))

Importing this module does not import DeepSpeed. Introduced in notebook 10.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from labkit._validate import MAX_WORLD_SIZE, as_float, check_int, safe_repr
from labkit.i18n import N_
from labkit.i18n import gettext as _

__all__ = [
    "CATEGORIES",
    "DTYPES",
    "OFFLOAD_DEVICES",
    "RECORDED_FP16_RUN",
    "STAGES",
    "batch_triple",
    "config",
    "count_model_states",
    "cut_tensors",
    "explain",
    "partition_layout",
    "validate",
]

#: ZeRO stages: 0 = plain data parallel, 1 = optimizer states sharded, 2 = + gradients, 3 = + parameters.
STAGES = (0, 1, 2, 3)
#: Training precisions :func:`config` knows.
DTYPES = ("fp32", "bf16", "fp16")
#: Where ``zero_optimization.offload_optimizer.device`` may point ("none" = no offload).
OFFLOAD_DEVICES = ("none", "cpu")
#: The groups :func:`count_model_states` sorts tensors into.
CATEGORIES = ("params", "grads", "master", "optimizer", "buffers", "other")

_MODEL_STATES = ("params", "grads", "master", "optimizer")

#: A real DeepSpeed fp16 run, recorded where DeepSpeed accepts fp16 on the CPU, for the machines where it does not
#: (its CPU accelerator refuses fp16 without AVX512-FP16/AMX). Notebook 10's section 3 run ``2:fp16``: ZeRO-2,
#: 2 gloo ranks, 8 steps, ``initial_scale_power`` 21, ``loss_scale_window`` 2, ``hysteresis`` 1, as printed by the
#: stored notebook 10 at commit 6d68e78 (DeepSpeed 0.19.8, torch 2.13.0+cpu). ``loss_scales`` is the scale after
#: each step. Notebook 10 replays DeepSpeed's rule on ``overflow`` and asserts it gives these scales.
RECORDED_FP16_RUN: dict[str, Any] = {
    "recorded_on": N_("an AMX Xeon (AVX512-FP16; AMX-BF16, no AMX-FP16), DeepSpeed 0.19.8, torch 2.13.0+cpu"),
    "stage": 2, "dtype": "fp16", "initial_scale_power": 21, "loss_scale_window": 2, "hysteresis": 1,
    "overflow": [True, True, True, False, False, False, True, False],
    "loss_scales": [2.0**20, 2.0**19, 2.0**18, 2.0**18, 2.0**18, 2.0**19, 2.0**18, 2.0**18],
    "skipped_steps": 4,
}


def _int(name: str, value: Any, minimum: int) -> int:
    return check_int(name, value, minimum)


def _world(world_size: Any) -> int:
    """world_size, at most MAX_WORLD_SIZE: the partition tables list every rank (2**40 would never end)."""
    return check_int("world_size", world_size, 1, MAX_WORLD_SIZE)


def _num(name: str, value: Any, *, positive: bool = False) -> float:
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(as_float(name, value))):
        raise TypeError(f"{name} must be a finite number, got {safe_repr(value)}")
    if value < 0 or (positive and value == 0):
        raise ValueError(f"{name} must be {'> 0' if positive else '>= 0'}, got {value}")
    return float(value)


def batch_triple(micro_batch: int, grad_accum: int | None = None, world_size: int = 1,
                 train_batch_size: int | None = None) -> tuple[int, int, int]:
    """Return a consistent ``(train_batch_size, micro_batch, grad_accum)`` or raise a ``ValueError`` saying why.

    DeepSpeed requires ``train_batch_size == micro_batch * grad_accum * world_size``. Give any two of
    ``train_batch_size``/``grad_accum`` (with ``micro_batch`` and ``world_size``) and the third is derived;
    give all of them and they are checked.

    Introduced in notebook 10.
    """
    mb = _int("micro_batch", micro_batch, 1)
    ws = _world(world_size)
    if grad_accum is None and train_batch_size is None:
        grad_accum = 1
    if grad_accum is not None:
        ga = _int("grad_accum", grad_accum, 1)
        tbs = mb * ga * ws
        if train_batch_size is not None and _int("train_batch_size", train_batch_size, 1) != tbs:
            raise ValueError(
                f"inconsistent batch config: train_batch_size={train_batch_size} but micro_batch * "
                f"grad_accum * world_size = {mb} * {ga} * {ws} = {tbs}. DeepSpeed needs them equal; change "
                "one of them (or leave train_batch_size out and it is derived).")
        return tbs, mb, ga
    tbs = _int("train_batch_size", train_batch_size, 1)
    if tbs % (mb * ws):
        raise ValueError(
            f"inconsistent batch config: train_batch_size={tbs} is not a multiple of micro_batch * "
            f"world_size = {mb} * {ws} = {mb * ws}, so no whole number of accumulation steps fits")
    return tbs, mb, tbs // (mb * ws)


def config(
    stage: int,
    dtype: str = "bf16",
    *,
    offload: str = "none",
    micro_batch: int = 4,
    grad_accum: int | None = None,
    world_size: int = 1,
    train_batch_size: int | None = None,
    lr: float = 1e-3,
    weight_decay: float = 0.0,
    gradient_clipping: float = 1.0,
    initial_scale_power: int = 16,
    loss_scale_window: int = 1000,
    hysteresis: int = 2,
    min_loss_scale: float = 1.0,
    overlap_comm: bool = False,
    contiguous_gradients: bool = True,
    reduce_bucket_size: int | None = None,
    param_persistence_threshold: int | None = None,
    torch_adam: bool = True,
) -> dict[str, Any]:
    """Build a DeepSpeed config dict for ZeRO ``stage`` in ``dtype``, validated before DeepSpeed sees it.

    - ``dtype`` "bf16" sets ``bf16.enabled``; "fp16" sets ``fp16`` with dynamic loss scaling
      (``loss_scale: 0``) starting at ``2**initial_scale_power``, halving on overflow after ``hysteresis``
      overflows, doubling after ``loss_scale_window`` clean steps, never below ``min_loss_scale``.
    - ``offload="cpu"`` keeps the fp32 master weights and Adam states on the CPU and runs the optimizer
      step there (``zero_optimization.offload_optimizer.device``); it needs stage >= 1.
    - The batch triple (``train_batch_size``, ``train_micro_batch_size_per_gpu``,
      ``gradient_accumulation_steps``) is made consistent by :func:`batch_triple`.
    - ``torch_adam=True`` uses ``torch.optim.AdamW`` instead of DeepSpeed's compiled Adam kernels (no
      one-off C++ compile; slower than DeepSpeedCPUAdam on big offloaded models).
    - ``reduce_bucket_size`` (elements) bounds the gradient communication buckets, and
      ``param_persistence_threshold`` (stage 3) keeps parameters smaller than it unsharded; both are left
      to DeepSpeed's defaults when None.

    Introduced in notebook 10.
    """
    if isinstance(stage, bool) or not isinstance(stage, int):
        raise TypeError(f"stage must be an int in {STAGES}, got {safe_repr(stage)}")
    if stage not in STAGES:
        raise ValueError(f"ZeRO stage must be one of {STAGES}, got {stage}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {safe_repr(dtype)}")
    if offload not in OFFLOAD_DEVICES:
        raise ValueError(f"offload must be one of {OFFLOAD_DEVICES}, got {safe_repr(offload)}")
    tbs, mb, ga = batch_triple(micro_batch, grad_accum, world_size, train_batch_size)
    _num("lr", lr, positive=True)
    _num("weight_decay", weight_decay)
    _num("gradient_clipping", gradient_clipping)
    for name, flag in (("overlap_comm", overlap_comm), ("contiguous_gradients", contiguous_gradients),
                       ("torch_adam", torch_adam)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, got {safe_repr(flag)}")
    cfg: dict[str, Any] = {
        "train_batch_size": tbs,
        "train_micro_batch_size_per_gpu": mb,
        "gradient_accumulation_steps": ga,
        "gradient_clipping": float(gradient_clipping),
        "optimizer": {"type": "AdamW", "params": {"lr": float(lr), "betas": [0.9, 0.999], "eps": 1e-8,
                                                  "weight_decay": float(weight_decay)}},
        "zero_optimization": {"stage": stage},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if torch_adam:
        cfg["optimizer"]["params"]["torch_adam"] = True
    if dtype == "fp16":
        _int("initial_scale_power", initial_scale_power, 0)
        if initial_scale_power > 64:
            raise ValueError(f"initial_scale_power must be <= 64 (2**64 overflows any gradient), got "
                             f"{initial_scale_power}")
        cfg["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": initial_scale_power,
                       "loss_scale_window": _int("loss_scale_window", loss_scale_window, 1),
                       "hysteresis": _int("hysteresis", hysteresis, 1),
                       "min_loss_scale": _num("min_loss_scale", min_loss_scale, positive=True)}
    elif dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    zo = cfg["zero_optimization"]
    if stage > 0:
        zo["overlap_comm"] = overlap_comm
        zo["contiguous_gradients"] = contiguous_gradients
        if reduce_bucket_size is not None:
            zo["reduce_bucket_size"] = _int("reduce_bucket_size", reduce_bucket_size, 2)
        if offload != "none":
            zo["offload_optimizer"] = {"device": offload, "pin_memory": False}
    elif offload != "none":
        raise ValueError("optimizer offload needs ZeRO stage >= 1 (stage 0 keeps no partitioned optimizer "
                         "to move); use stage=1, 2 or 3")
    if stage == 3:
        if param_persistence_threshold is not None:
            zo["stage3_param_persistence_threshold"] = _int("param_persistence_threshold",
                                                            param_persistence_threshold, 0)
        if reduce_bucket_size is not None:
            zo["stage3_prefetch_bucket_size"] = zo["reduce_bucket_size"]
    validate(cfg, world_size=world_size)
    return cfg


def validate(cfg: dict[str, Any], world_size: int | None = None) -> dict[str, Any]:
    """Check a DeepSpeed config dict and return it; raise ``ValueError`` naming the key to fix.

    Checks the batch triple against ``world_size`` (when given), that at most one of fp16/bf16 is
    enabled, the ZeRO stage, offload only with stage >= 1, and the fp16 loss-scale knobs.

    Introduced in notebook 10.
    """
    if not isinstance(cfg, dict):
        raise TypeError(f"a DeepSpeed config must be a dict, got {type(cfg).__name__}")
    zo = cfg.get("zero_optimization", {})
    if not isinstance(zo, dict):
        raise TypeError("zero_optimization must be a dict such as {'stage': 2}")
    stage = zo.get("stage", 0)
    if isinstance(stage, bool) or not isinstance(stage, int) or stage not in STAGES:
        raise ValueError(f"zero_optimization.stage must be one of {STAGES}, got {safe_repr(stage)}")
    for section in ("fp16", "bf16"):
        if not isinstance(cfg.get(section, {}), dict):
            raise TypeError(f"{section} must be a dict such as {{'enabled': True}}, got "
                            f"{type(cfg[section]).__name__}")
    fp16 = bool(cfg.get("fp16", {}).get("enabled", False))
    bf16 = bool(cfg.get("bf16", {}).get("enabled", False))
    if fp16 and bf16:
        raise ValueError("fp16.enabled and bf16.enabled are both true; choose one precision")
    off = zo.get("offload_optimizer", {}).get("device", "none") if isinstance(zo.get("offload_optimizer"),
                                                                              dict) else "none"
    if off not in ("none", "cpu", "nvme"):
        raise ValueError(f"zero_optimization.offload_optimizer.device must be 'cpu' or 'nvme', got {safe_repr(off)}")
    if off != "none" and stage == 0:
        raise ValueError("zero_optimization.offload_optimizer needs stage >= 1")
    keys = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    tbs, mb, ga = (cfg.get(k) for k in keys)
    for k, v in zip(keys, (tbs, mb, ga)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"{k} must be a positive int, got {safe_repr(v)}")
    if world_size is not None:
        _world(world_size)
        if mb is None:
            raise ValueError("train_micro_batch_size_per_gpu is missing")
        batch_triple(mb, ga, world_size, tbs)
    elif None not in (tbs, mb, ga) and tbs % (mb * ga):
        raise ValueError(f"train_batch_size={tbs} is not a multiple of micro batch * grad accumulation = "
                         f"{mb} * {ga}; no whole number of ranks fits")
    if fp16:
        f = cfg["fp16"]
        if f.get("loss_scale", 0) < 0:
            raise ValueError("fp16.loss_scale must be 0 (dynamic) or a positive static scale")
        if f.get("hysteresis", 2) < 1 or f.get("loss_scale_window", 1000) < 1:
            raise ValueError("fp16.hysteresis and fp16.loss_scale_window must be >= 1")
        if f.get("min_loss_scale", 1) <= 0:
            raise ValueError("fp16.min_loss_scale must be > 0")
    gc = cfg.get("gradient_clipping", 0.0)
    if isinstance(gc, bool) or not isinstance(gc, (int, float)) or gc < 0:
        raise ValueError(f"gradient_clipping must be a number >= 0 (0 turns it off), got {safe_repr(gc)}")
    return cfg


_EXPLAIN: dict[str, str] = {
    "train_batch_size": N_("global batch per optimizer step = micro batch x grad accumulation x ranks"),
    "train_micro_batch_size_per_gpu": N_("samples per rank per forward/backward (what sets activation memory)"),
    "gradient_accumulation_steps": N_("micro batches summed into the gradients before one optimizer step"),
    "gradient_clipping": N_("clip the global gradient norm to this value (0 = off), after unscaling"),
    "steps_per_print": N_("how often DeepSpeed logs progress (huge = quiet)"),
    "wall_clock_breakdown": N_("time forward/backward/step separately (adds synchronisation)"),
    "optimizer": N_("the optimizer DeepSpeed builds for you (so it can shard and offload it)"),
    "optimizer.type": N_("AdamW: Adam with decoupled weight decay; two fp32 states per parameter (8 bytes)"),
    "optimizer.params": N_("keyword arguments of the optimizer"),
    "optimizer.params.lr": N_("learning rate"),
    "optimizer.params.betas": N_("Adam's decay rates for the first and second moments"),
    "optimizer.params.eps": N_("added to sqrt(second moment) to avoid dividing by zero"),
    "optimizer.params.weight_decay": N_("decoupled weight decay"),
    "optimizer.params.torch_adam": N_("use torch.optim.AdamW, not DeepSpeed's compiled kernels (no C++ compile)"),
    "fp16": N_("fp16 mixed precision: fp16 params/grads, fp32 master weights, loss scaling"),
    "fp16.enabled": N_("train in fp16 (the model is cast to fp16; fp32 master copies stay in the optimizer)"),
    "fp16.loss_scale": N_("0 = dynamic loss scaling; a positive number = that static scale"),
    "fp16.initial_scale_power": N_("dynamic scaling starts at 2**this"),
    "fp16.loss_scale_window": N_("clean steps before the scale doubles (like GradScaler's growth_interval)"),
    "fp16.hysteresis": N_("halve the scale only at this many overflows (1 = at once, like GradScaler); "
                          "every overflowing step is skipped either way"),
    "fp16.min_loss_scale": N_("the scale never drops below this"),
    "bf16": N_("bf16 mixed precision: bf16 params/grads, fp32 master weights, no loss scaling needed"),
    "bf16.enabled": N_("train in bf16 (fp32's exponent range, so gradients do not underflow: no scaler)"),
    "zero_optimization": N_("ZeRO: shard model states across data-parallel ranks instead of replicating them"),
    "zero_optimization.stage": N_("0 = replicate all; 1 = shard optimizer states + master weights; "
                                  "2 = + gradients; 3 = + parameters"),
    "zero_optimization.overlap_comm": N_("reduce gradient buckets while backward still runs (hides "
                                         "communication, costs extra bucket memory)"),
    "zero_optimization.contiguous_gradients": N_("copy gradients into one contiguous buffer as they are "
                                                 "produced (less fragmentation, cheaper reduce)"),
    "zero_optimization.reduce_bucket_size": N_("elements per gradient reduce bucket (bigger = fewer, larger "
                                               "messages, more buffer memory)"),
    "zero_optimization.offload_optimizer": N_("move the optimizer (fp32 master + Adam states and the step) "
                                              "off the accelerator"),
    "zero_optimization.offload_optimizer.device": N_("where the optimizer lives: cpu (host RAM) or nvme"),
    "zero_optimization.offload_optimizer.pin_memory": N_("page-locked host buffers for faster GPU<->CPU "
                                                         "copies (uses locked RAM)"),
    "zero_optimization.stage3_param_persistence_threshold": N_("stage 3 keeps parameters smaller than this "
                                                               "(elements) whole on every rank"),
    "zero_optimization.stage3_prefetch_bucket_size": N_("stage 3: elements of parameters gathered ahead of "
                                                        "use"),
}


#: How deep :func:`explain` follows nested sections: a DeepSpeed config nests three or four levels.
_MAX_CFG_DEPTH = 32


def _flatten(d: dict[str, Any], prefix: str = "") -> Iterable[tuple[str, Any, bool]]:
    """``(dotted path, value, is a section)`` for every key, depth first, with a stack (no recursion)."""
    stack = [(iter(d.items()), prefix)]
    while stack:
        item = next(stack[-1][0], None)
        if item is None:
            stack.pop()
            continue
        k, v = item
        path = f"{stack[-1][1]}{k}"
        if isinstance(v, dict):
            yield path, v, True
            if len(stack) >= _MAX_CFG_DEPTH:
                raise ValueError(f"cfg nests sections deeper than {_MAX_CFG_DEPTH} levels (at {path[:80]}...); a "
                                 "DeepSpeed config has three or four")
            stack.append((iter(v.items()), path + "."))
        else:
            yield path, v, False


def explain(cfg: dict[str, Any]) -> str:
    """Return a readable explanation of every key of a DeepSpeed config, one ``key = value: meaning`` line each.

    Keys labkit does not know are listed as such rather than skipped. Introduced in notebook 10.
    """
    if not isinstance(cfg, dict):
        raise TypeError(f"cfg must be a dict, got {type(cfg).__name__}")
    lines = []
    for path, value, is_section in _flatten(cfg):
        depth = path.count(".")
        known = _EXPLAIN.get(path)
        text = _(known) if known else _("(a key labkit.zero does not explain; see the DeepSpeed config docs)")
        shown = "" if is_section else f" = {safe_repr(value)}"
        lines.append(f"{'  ' * depth}{path.split('.')[-1]}{shown}: {text}")
    return "\n".join(lines)


def partition_layout(param_numels: Sequence[int], world_size: int, stage: int) -> list[dict[str, int]]:
    """Predict, per rank, the elements of parameters and of accumulated gradients DeepSpeed 0.19 keeps.

    Returns one dict per rank with ``partition`` (elements of master weights and optimizer states this
    rank owns), ``padding`` (zeros DeepSpeed appended so the flat buffer splits evenly), ``params``
    (low-precision parameter elements held between steps) and ``grads`` (gradient elements held while
    accumulating micro-batches, before the boundary's reduction).

    - stage 0: everything whole on every rank;
    - stages 1/2: parameters are flattened in order and padded to a multiple of ``2 * world_size``; rank r
      owns the r-th equal slice. Stage 1 accumulates the whole gradient. Stage 2 accumulates gradients
      only for the parameters that overlap its slice, but whole tensors: a parameter cut by a partition
      boundary is accumulated in full on both ranks, so ``grads`` can exceed ``partition``;
    - stage 3: every parameter is padded to a multiple of ``world_size`` and split evenly; parameters,
      gradients, master weights and optimizer states are all exactly the partition.

    Introduced in notebook 10.
    """
    numels = [_int("param numel", n, 1) for n in param_numels]
    if not numels:
        raise ValueError("param_numels is empty")
    ws = _world(world_size)
    if isinstance(stage, bool) or not isinstance(stage, int) or stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}, got {safe_repr(stage)}")
    total = sum(numels)
    if stage == 0:
        return [{"partition": total, "padding": 0, "params": total, "grads": total} for _ in range(ws)]
    if stage == 3:
        part = sum(-(-n // ws) for n in numels)
        pad = sum(-(-n // ws) * ws - n for n in numels)
        # DeepSpeed puts each parameter's padding at the end of its last rank's slice
        out = []
        for r in range(ws):
            rpad = sum(max(0, (r + 1) * -(-n // ws) - n) - max(0, r * -(-n // ws) - n) for n in numels)
            out.append({"partition": part, "padding": rpad, "params": part, "grads": part})
        assert sum(o["padding"] for o in out) == pad
        return out
    align = 2 * ws
    padded = -(-total // align) * align
    part = padded // ws
    out = []
    for r in range(ws):
        lo, hi = r * part, (r + 1) * part
        rpad = max(0, hi - max(lo, total))
        if stage == 1:
            grads = total
        else:
            grads, start = 0, 0
            for n in numels:
                if start < hi and start + n > lo:
                    grads += n
                start += n
        out.append({"partition": part, "padding": rpad, "params": total, "grads": grads})
    return out


def cut_tensors(param_numels: Sequence[int], world_size: int) -> list[dict[str, int]]:
    """The parameter tensors that a ZeRO-1/2 partition boundary cuts through, one dict per such boundary.

    The flat buffer of :func:`partition_layout` (stages 1 and 2) is split into ``world_size`` equal slices; a
    boundary between rank r-1's and rank r's slice usually falls inside a tensor. Each dict holds ``rank`` (r, the
    rank whose slice starts there), ``boundary`` (its element offset in the flat buffer), ``tensor`` (the index of
    the cut tensor in ``param_numels``), ``numel`` (its size) and ``below`` (how many of its elements lie in rank
    r-1's slice). At stage 2 both ranks accumulate that tensor's gradient whole: rank r-1 holds ``numel - below``
    elements beyond its slice, rank r holds ``below``. Introduced in notebook 10.
    """
    numels = [_int("param numel", n, 1) for n in param_numels]
    if not numels:
        raise ValueError("param_numels is empty")
    ws = _world(world_size)
    part = partition_layout(numels, ws, 1)[0]["partition"]
    out, start = [], 0
    for i, n in enumerate(numels):
        for r in range(1, ws):
            if start < r * part < start + n:
                out.append({"rank": r, "boundary": r * part, "tensor": i, "numel": n, "below": r * part - start})
        start += n
    return out


# ---------------------------------------------------------------------------------------------------
# Counting the bytes a live engine holds
# ---------------------------------------------------------------------------------------------------

_MASTER_ATTRS = ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat", "fp32_groups_flat_partition",
                 "fp32_groups_flat")
_GRAD_ATTRS = ("averaged_gradients", "all_grad_tensors", "grad_partitions_flat_buffer",
               "_DeepSpeedZeroOptimizer_Stage3__param_id_to_grad_partition", "fp32_groups_gradients",
               "fp32_groups_gradients_flat", "fp32_groups_flat_grads", "grads_in_partition")


def _tensors(obj: Any, depth: int = 0, seen: set[int] | None = None) -> Iterable[Any]:
    """Yield every torch.Tensor reachable from obj through dicts, lists, tuples and DeepSpeed objects."""
    import torch

    seen = set() if seen is None else seen
    if depth > 6:
        return
    if isinstance(obj, torch.Tensor):
        yield obj
        return
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, dict):
        for v in list(obj.values()):
            yield from _tensors(v, depth + 1, seen)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v, depth + 1, seen)
    elif (hasattr(obj, "__dict__") and not isinstance(obj, (type, torch.nn.Module))
          and type(obj).__module__.startswith(("deepspeed", "torch.optim"))):
        for v in list(vars(obj).values()):
            yield from _tensors(v, depth + 1, seen)


def count_model_states(engine: Any) -> dict[str, Any]:
    """Count the exact bytes of the tensors a DeepSpeed engine holds on this rank, by category.

    Every tensor is attributed to its storage (so views of one flat buffer count once, and a view of a
    bigger buffer counts the whole buffer: that is the memory really held). Storages on the ``meta``
    device hold no memory and are skipped. Categories, first claim wins:

    - ``params``: the module's parameters (stage 3: their ``ds_tensor`` partitions, plus any gathered
      full copies still alive);
    - ``master``: the tensors the wrapped torch optimizer updates (fp32 master weights; none in fp32
      stage 0, where they are the params);
    - ``optimizer``: the torch optimizer's per-parameter state (Adam's ``exp_avg``/``exp_avg_sq``); its
      ``step`` counters go to ``other``;
    - ``grads``: ``param.grad``, master ``.grad`` and DeepSpeed's gradient partitions/accumulators;
    - ``buffers``: any other tensor the DeepSpeed optimizer holds (communication buckets …);
    - ``other``: one-element tensors (step counters, norms, overflow flags).

    Returns ``{"bytes": {category: n}, "by_device": {device: {category: n}}, "model_states": n}`` where
    ``model_states`` sums params, grads, master and optimizer.

    Introduced in notebook 10.
    """
    import torch

    module = getattr(engine, "module", None)
    opt = getattr(engine, "optimizer", None)
    basic = getattr(engine, "basic_optimizer", None) or getattr(opt, "optimizer", None)
    if not isinstance(module, torch.nn.Module) or opt is None or basic is None:
        raise TypeError("engine must be a DeepSpeed engine (from deepspeed.initialize) with an optimizer")
    claimed: set[tuple[str, int]] = set()
    totals = {c: 0 for c in CATEGORIES}
    by_device: dict[str, dict[str, int]] = {}

    def add(t: Any, cat: str) -> None:
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            return
        st = t.untyped_storage()
        n = st.nbytes()
        if n == 0:
            return
        key = (str(t.device), st.data_ptr())
        if key in claimed:
            return
        claimed.add(key)
        if cat not in ("other",) and t.numel() <= 1 and n <= 8:
            cat = "other"
        totals[cat] += n
        dev = by_device.setdefault(t.device.type, {c: 0 for c in CATEGORIES})
        dev[cat] += n

    params = list(module.parameters())
    for p in params:
        if hasattr(p, "ds_tensor"):
            add(p.ds_tensor, "params")
        add(p.data, "params")
    for g in basic.param_groups:
        for p in g["params"]:
            add(p, "master")
    for name in _MASTER_ATTRS:  # stage 3 empties the torch optimizer's param_groups between steps
        for t in _tensors(getattr(opt, name, None)):
            add(t, "master")
    for p in basic.state:
        add(p, "master")
    for st in basic.state.values():
        for k, v in st.items():
            add(v, "other" if k == "step" else "optimizer")
    for p in params:
        add(p.grad, "grads")
        if hasattr(p, "ds_tensor"):
            add(getattr(p.ds_tensor, "grad", None), "grads")
    for g in basic.param_groups:
        for p in g["params"]:
            add(p.grad, "grads")
    for name in _GRAD_ATTRS:
        for t in _tensors(getattr(opt, name, None)):
            add(t, "grads")
    for t in _tensors(opt):
        add(t, "buffers")
    return {"bytes": totals, "by_device": by_device, "model_states": sum(totals[c] for c in _MODEL_STATES)}
