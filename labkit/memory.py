"""Where training memory goes: a model of model-state bytes (ZeRO, offload, optimizers), checked by measurement.

- **Prediction** (pure arithmetic): :func:`model_state_bytes` gives the bytes one rank holds for the
  parameters, gradients, fp32 master weights and optimizer states, for a precision policy
  (:data:`labkit.precision.POLICIES`: the table notebook 04 trains), an optimizer (:data:`OPTIMIZERS`), a ZeRO
  stage, a world size and CPU offload.
- **Measurement** (exact, from tensor storages): :func:`measure_model_state` counts every byte that a
  model and an optimizer hold; :func:`predict_torch_state` predicts it for a real model, tensor by tensor.

Activation memory lives in :mod:`labkit.activations` (re-exported here, so ``mem.gpt_activation_bytes`` works);
the interactive calculator in :mod:`labkit.widgets`.

The literature quotes 16, 18 or 20 bytes per parameter for mixed-precision Adam. They are all right;
they count different things (:func:`conventions_table` prints which is which):

==========================  =====================================================  =====
policy                      what it keeps per parameter (Adam)                     bytes
==========================  =====================================================  =====
``bf16-master``             ZeRO paper: 2 (16-bit params) + 2 (16-bit grads) + K=12  16
``bf16-master-fp32-grads``  HF: 2 + 4 (fp32 master) + 4 (fp32 grads) + 8 (Adam)      18
``bf16-master-fp32-accum``  DeepSpeed: 2 + 2 + 4 (fp32 grads) + 4 + 8                20
==========================  =====================================================  =====

The autocast policies of notebook 04 (``fp32``, ``bf16``, ``fp16``) keep fp32 weights, grads and states: 16 bytes
with Adam as well, plus the 16-bit weight copies autocast keeps for backward (a temporary, not model state).

``GB`` here is 10**9 bytes (the ZeRO paper's unit); DeepSpeed's estimators print GiB (2**30).

Introduced in notebook 06.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from labkit import zero
from labkit._validate import MAX_PREDICTED_PARAMS, MAX_WORLD_SIZE, check_dense, safe_repr
from labkit.activations import (
    ActivationEstimate,
    SavedTensors,
    check_count,
    checkpointed,
    gpt_activation_bytes,
    graph_saved_bytes,
    measure_saved_tensors,
    mlp_activation_bytes,
)
from labkit.i18n import gettext as _
from labkit.precision import POLICIES, Policy, get_policy

__all__ = [
    "GB",
    "MODEL_PRESETS",
    "OPTIMIZERS",
    "POLICIES",
    "ActivationEstimate",
    "GiB",
    "MasterWeightOptimizer",
    "ModelState",
    "OptimizerSpec",
    "Policy",
    "SavedTensors",
    "bytes_per_param",
    "check_count",
    "checkpointed",
    "conventions_table",
    "fmt_bytes",
    "get_optimizer",
    "get_policy",
    "gpt_activation_bytes",
    "graph_saved_bytes",
    "k_factor",
    "measure_model_state",
    "measure_saved_tensors",
    "mlp_activation_bytes",
    "model_state_bytes",
    "predict_torch_state",
    "process_rss",
    "setup_training",
    "smallest_fitting_stage",
    "tensor_bytes",
    "zero_table",
]

GB = 10**9
GiB = 2**30

#: Parameter counts of the calculator's presets.
MODEL_PRESETS: dict[str, int] = {"1B": 10**9, "7B": 7 * 10**9, "13B": 13 * 10**9, "70B": 70 * 10**9}

#: The categories of a model-state breakdown, in display order.
#: Bytes of an fp32 element: the width of DeepSpeed's offloaded gradient partition.
_FP32 = 4

CATEGORIES = ("params", "grads", "fp32_grads", "master", "optimizer", "weight_copies", "gathered")


# ----------------------------------------------------------------------------------------------------
# Precision policies and optimizers
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OptimizerSpec:
    """An optimizer's state: ``n_states`` tensors the size of the parameters, each element ``state_bytes``
    wide (``None``: the policy's width), plus ``step_tensor`` (torch keeps a 4-byte ``step`` per tensor).

    ``factored`` marks Adafactor-style second moments (a row and a column vector per matrix instead of a
    full tensor): about 0 bytes per parameter for a large matrix; :func:`predict_torch_state` counts them
    exactly from the shapes.

    Introduced in notebook 06.
    """

    name: str
    n_states: int
    state_bytes: int | None
    step_tensor: bool
    factored: bool
    description: str


#: The optimizers :func:`model_state_bytes` knows, by name.
OPTIMIZERS: dict[str, OptimizerSpec] = {
    o.name: o
    for o in (
        OptimizerSpec("sgd", 0, None, False, False, "plain SGD: no state"),
        OptimizerSpec("sgd-momentum", 1, None, False, False, "SGD with momentum: one buffer"),
        OptimizerSpec("adam", 2, None, True, False, "Adam: exp_avg and exp_avg_sq"),
        OptimizerSpec("adamw", 2, None, True, False, "AdamW: exp_avg and exp_avg_sq"),
        OptimizerSpec("adam-8bit", 2, 1, True, False,
                      "8-bit Adam (bitsandbytes-style): both states in 1 byte (+ small block scales, ignored)"),
        OptimizerSpec("adafactor", 0, None, True, True,
                      "Adafactor-style: factored second moment (rows + cols per matrix), no momentum"),
    )
}


def get_optimizer(optimizer: str | OptimizerSpec) -> OptimizerSpec:
    """Return the :class:`OptimizerSpec` for a name such as ``"adamw"``; ``ValueError`` if unknown.

    Introduced in notebook 06.
    """
    if isinstance(optimizer, OptimizerSpec):
        return optimizer
    if not isinstance(optimizer, str):
        raise TypeError(f"optimizer must be a str such as 'adam', got {type(optimizer).__name__}")
    name = optimizer.lower().replace("_", "-")
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {safe_repr(optimizer)}; choose one of {sorted(OPTIMIZERS)}")
    return OPTIMIZERS[name]


def _state_width(pol: Policy, opt: OptimizerSpec) -> int:
    return opt.state_bytes if opt.state_bytes is not None else pol.state_bytes


def bytes_per_param(policy: str | Policy = "bf16-master", optimizer: str | OptimizerSpec = "adam") -> int:
    """Return the model-state bytes per parameter without ZeRO: params + grads + master + optimizer states.

    ``bytes_per_param("bf16-master", "adam") == 16`` (ZeRO paper), ``"bf16-master-fp32-grads"`` gives 18 (HF),
    ``"bf16-master-fp32-accum"`` 20 (DeepSpeed), ``"fp32"`` 16 as well. Autocast weight copies (a temporary)
    are not included. Introduced in notebook 06.
    """
    pol, opt = get_policy(policy), get_optimizer(optimizer)
    return (pol.param_bytes + pol.grad_bytes + pol.fp32_grad_bytes + pol.master_bytes
            + opt.n_states * _state_width(pol, opt))


def k_factor(policy: str | Policy = "bf16-master", optimizer: str | OptimizerSpec = "adam") -> int:
    """Return the ZeRO paper's K: the optimizer-side bytes per parameter (master weights + states).

    Introduced in notebook 06.
    """
    pol, opt = get_policy(policy), get_optimizer(optimizer)
    return pol.master_bytes + opt.n_states * _state_width(pol, opt)


def conventions_table(optimizer: str = "adam") -> str:
    """Return a text table of the bytes/param each precision policy gives with ``optimizer``, and whose
    convention it is (16: ZeRO paper, 18: Hugging Face, 20: DeepSpeed's estimators).

    Introduced in notebook 06.
    """
    opt = get_optimizer(optimizer)
    rows = [(f"{'policy':<23} {'params':>6} {'grads':>5} {'fp32 g':>6} {'master':>6} {'states':>6} "
             f"{'total':>5}  convention")]
    for pol in POLICIES.values():
        states = opt.n_states * _state_width(pol, opt)
        rows.append(f"{pol.name:<23} {pol.param_bytes:>6} {pol.grad_bytes:>5} {pol.fp32_grad_bytes:>6} "
                    f"{pol.master_bytes:>6} {states:>6} {bytes_per_param(pol, opt):>5}  {_(pol.description)}")
    return "\n".join(rows)


# ----------------------------------------------------------------------------------------------------
# The model-state model: ZeRO stages, world size, offload
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelState:
    """Bytes of model state one rank holds: ``device`` (GPU) and ``host`` (CPU, offloaded) breakdowns.

    Keys are from ``params, grads, fp32_grads, master, optimizer, weight_copies, gathered``; only
    non-zero entries are present. ``host_per_node(gpus_per_node)`` scales the host side to a node.

    Introduced in notebook 06.
    """

    n_params: int
    policy: str
    optimizer: str
    stage: int
    world_size: int
    device: dict[str, int]
    host: dict[str, int]

    @property
    def device_total(self) -> int:
        """Bytes on one GPU (model states only; activations come on top)."""
        return sum(self.device.values())

    @property
    def host_total(self) -> int:
        """Bytes of CPU memory this rank's offloaded states take."""
        return sum(self.host.values())

    def host_per_node(self, gpus_per_node: int) -> int:
        """Bytes of CPU memory a node needs for the offloaded states of its ``gpus_per_node`` ranks."""
        return self.host_total * check_count("gpus_per_node", gpus_per_node, 1)

    @property
    def bytes_per_param(self) -> float:
        """Bytes per parameter this rank holds (device + host), relative to the full parameter count."""
        return (self.device_total + self.host_total) / self.n_params

    def table(self, unit: str = "GB") -> str:
        """Return a small text table of the breakdown in ``unit`` ("GB", "GiB", "MB", "B")."""
        lines = [(f"{self.policy} + {self.optimizer}, ZeRO-{self.stage}, {self.world_size} rank(s), "
                  f"{self.n_params:,} params")]
        for where, d in (("GPU", self.device), ("CPU", self.host)):
            for k in CATEGORIES:
                if k in d:
                    lines.append(f"  {where} {k:<13} {fmt_bytes(d[k], unit):>12}")
        lines.append(f"  GPU total     {fmt_bytes(self.device_total, unit):>14}")
        if self.host:
            lines.append(f"  CPU total     {fmt_bytes(self.host_total, unit):>14}")
        return "\n".join(lines)


def model_state_bytes(
    n_params: int,
    policy: str | Policy = "bf16-master",
    optimizer: str | OptimizerSpec = "adam",
    stage: int = 0,
    world_size: int = 1,
    offload_optimizer: bool = False,
    offload_params: bool = False,
    largest_layer_params: int = 0,
) -> ModelState:
    """Predict the model-state bytes per rank for ``n_params`` parameters, by category, GPU and CPU side.

    ZeRO stage 1 shards the optimizer side (master weights, states and the fp32 gradient copy) over
    ``world_size`` ranks, stage 2 also the 16-bit gradients, stage 3 also the parameters. A shard is what
    :func:`labkit.zero.partition_layout` gives one rank: ``n_params`` padded to a multiple of ``2 x world_size``
    (stages 1-2) or of ``world_size`` (stage 3), divided by ``world_size``. At stage 3 a rank also holds the gathered working params
    and their full gradient for the largest layer while it runs (``gathered``: 2 x ``param_bytes`` x
    ``largest_layer_params``). ``offload_optimizer`` (ZeRO-Offload, stage >= 1) moves the optimizer side to
    CPU, as DeepSpeed lays it out: fp32 master, optimizer states and an fp32 gradient partition (Adam in
    bf16-master: 4 + 8 + 4 = 16 B per shard element, what notebook 10 measures); at stage >= 2 no gradient
    stays on the GPU. DeepSpeed's pinned staging buffers and the load-time fp32 copies are not counted.
    ``offload_params`` (stage 3 only, with ``offload_optimizer``) moves the parameter shard to CPU.
    Autocast's 16-bit weight copies (policy ``"bf16"``) count as ``weight_copies`` on the GPU.

    Limits (``ValueError`` saying the range): ``n_params`` at most 10**15 (a thousand times the largest models
    trained so far), ``world_size`` at most 2**20 = 1,048,576 ranks (ten times the largest GPU clusters).

    Introduced in notebook 06.
    """
    n = check_count("n_params", n_params, 1, MAX_PREDICTED_PARAMS)
    pol, opt = get_policy(policy), get_optimizer(optimizer)
    if isinstance(stage, bool) or not isinstance(stage, int) or stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, got {safe_repr(stage)}")
    ws = check_count("world_size", world_size, 1, MAX_WORLD_SIZE)
    largest = check_count("largest_layer_params", largest_layer_params, 0)
    if largest > n:
        raise ValueError(f"largest_layer_params ({largest}) exceeds n_params ({n})")
    if not isinstance(offload_optimizer, bool) or not isinstance(offload_params, bool):
        raise TypeError("offload_optimizer and offload_params must be bools")
    if offload_optimizer and stage == 0:
        raise ValueError("optimizer offload (ZeRO-Offload) needs ZeRO stage >= 1")
    if offload_params and (stage != 3 or not offload_optimizer):
        raise ValueError("parameter offload needs ZeRO stage 3 and offload_optimizer=True")
    # the partition DeepSpeed gives each rank: one rule, labkit.zero.partition_layout's (stages 1-2 pad the flat
    # buffer to a multiple of 2 x world_size; stage 3 pads each parameter, here the model as one flat tensor)
    shard = zero.partition_layout([n], ws, stage)[0]["partition"] if stage else n
    width = _state_width(pol, opt)

    # Elements each category holds on this rank, before deciding GPU or CPU.
    p_elems = shard if stage >= 3 else n
    g_elems = shard if stage >= 2 else n
    o_elems = shard if stage >= 1 else n
    dev: dict[str, int] = {}
    host: dict[str, int] = {}
    dev["params"] = pol.param_bytes * p_elems
    if opt.factored:
        opt_bytes = 0  # a factored second moment is ~(rows + cols) per matrix: negligible per parameter
    else:
        opt_bytes = opt.n_states * width * o_elems
    side = {"master": pol.master_bytes * o_elems, "optimizer": opt_bytes,
            "fp32_grads": pol.fp32_grad_bytes * o_elems}
    if offload_optimizer:
        host.update(side)
        # DeepSpeed (0.19.8, stage_1_and_2.py and stage3.py) gives the fp32 master partition on the host its own
        # fp32 .grad: the reduced gradients are copied into it and the CPU Adam steps from it. So the host keeps an
        # fp32 gradient partition whatever the training precision (measured in notebook 10: 4 + 8 + 4 B per shard
        # element), and at stage >= 2 no gradient stays on the GPU between steps (only the reduce buckets).
        host["fp32_grads"] = max(pol.fp32_grad_bytes, _FP32) * o_elems
        if stage < 2:
            dev["grads"] = pol.grad_bytes * g_elems
    else:
        dev["grads"] = pol.grad_bytes * g_elems
        dev.update(side)
    if offload_params:
        host["params"] = dev.pop("params")
    if pol.autocast_copy_bytes:
        dev["weight_copies"] = pol.autocast_copy_bytes * (largest if stage >= 3 else n)
    if stage >= 3:
        dev["gathered"] = 2 * pol.param_bytes * largest
    return ModelState(
        n_params=n, policy=pol.name, optimizer=opt.name, stage=stage, world_size=ws,
        device={k: dev[k] for k in CATEGORIES if dev.get(k)},
        host={k: host[k] for k in CATEGORIES if host.get(k)},
    )


def zero_table(n_params: int, world_size: int, policy: str | Policy = "bf16-master",
               optimizer: str | OptimizerSpec = "adam", **kwargs: Any) -> dict[int, ModelState]:
    """Return :func:`model_state_bytes` for ZeRO stages 0-3, keyed by stage.

    Its limits apply: ``n_params`` up to 10**15, ``world_size`` up to 2**20 ranks. Introduced in notebook 06.
    """
    return {s: model_state_bytes(n_params, policy, optimizer, stage=s, world_size=world_size, **kwargs)
            for s in (0, 1, 2, 3)}


def smallest_fitting_stage(n_params: int, gpu_bytes: float, world_size: int,
                           policy: str | Policy = "bf16-master", optimizer: str | OptimizerSpec = "adam",
                           reserve_bytes: float = 0, **kwargs: Any) -> int | None:
    """Return the smallest ZeRO stage whose model states plus ``reserve_bytes`` fit in ``gpu_bytes``.

    Returns ``None`` if even stage 3 does not fit. Introduced in notebook 06.
    """
    if not (isinstance(gpu_bytes, (int, float)) and gpu_bytes > 0):
        raise ValueError(f"gpu_bytes must be a positive number, got {safe_repr(gpu_bytes)}")
    if not (isinstance(reserve_bytes, (int, float)) and reserve_bytes >= 0):
        raise ValueError(f"reserve_bytes must be >= 0, got {safe_repr(reserve_bytes)}")
    for s, est in zero_table(n_params, world_size, policy, optimizer, **kwargs).items():
        if est.device_total + reserve_bytes <= gpu_bytes:
            return s
    return None


def fmt_bytes(n: float, unit: str = "GB") -> str:
    """Format a byte count in ``unit``: ``"GB"``/``"MB"``/``"kB"`` (powers of 10), ``"GiB"``/``"MiB"``, ``"B"``.

    Introduced in notebook 06.
    """
    units = {"B": 1, "kB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KiB": 2**10, "MiB": 2**20,
             "GiB": 2**30}
    if unit not in units:
        raise ValueError(f"unknown unit {safe_repr(unit)}; choose one of {sorted(units)}")
    try:
        if unit == "B":
            return f"{int(n):,} B"
        return f"{n / units[unit]:,.2f} {unit}"
    except OverflowError:  # 10**400 bytes, or an infinite float as whole bytes
        raise ValueError(f"n must be a byte count a float can hold, got {safe_repr(n)}") from None


# ----------------------------------------------------------------------------------------------------
# Measurement: exact bytes from tensor storages
# ----------------------------------------------------------------------------------------------------


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Return the bytes of the distinct storages behind ``tensors`` (views of one storage count once).

    Introduced in notebook 06.
    """
    seen: dict[int, int] = {}
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"expected tensors, got {type(t).__name__}")
        s = check_dense("each tensor", t).untyped_storage()  # sparse and meta tensors have no one storage
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def _optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    for st in optimizer.state.values():
        for v in st.values():
            if isinstance(v, torch.Tensor):
                yield v


def measure_model_state(model: nn.Module, optimizer: Any) -> dict[str, int]:
    """Count the exact bytes a model and its optimizer hold, by category, from tensor storages.

    ``params``/``grads``: the model's parameters and their ``.grad``. If the optimizer updates tensors
    that are not the model's parameters (fp32 master copies, as :class:`MasterWeightOptimizer` keeps),
    they count as ``master`` and their gradients as ``fp32_grads``. ``optimizer``: every tensor in the
    optimizer's state (moments, momentum buffers, ``step`` counters). Only non-zero entries are returned.

    Introduced in notebook 06.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    inner = optimizer.optimizers if isinstance(optimizer, MasterWeightOptimizer) else [optimizer]
    for o in inner:
        if not isinstance(o, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(o).__name__}")
    params = list(model.parameters())
    own = {p.untyped_storage().data_ptr() for p in params}
    opt_params = [p for o in inner for g in o.param_groups for p in g["params"]]
    master = [p for p in opt_params if p.untyped_storage().data_ptr() not in own]
    out = {
        "params": tensor_bytes(params),
        "grads": tensor_bytes(p.grad for p in params if p.grad is not None),
        "fp32_grads": tensor_bytes(p.grad for p in master if p.grad is not None),
        "master": tensor_bytes(master),
        "optimizer": tensor_bytes(t for o in inner for t in _optimizer_state_tensors(o)),
    }
    return {k: v for k, v in out.items() if v}


def _factored_elements(shape: tuple[int, ...]) -> int:
    if len(shape) >= 2:
        return math.prod(shape[:-2]) * (shape[-2] + shape[-1])
    return math.prod(shape)


def predict_torch_state(
    model: nn.Module,
    policy: str | Policy = "fp32",
    optimizer: str | OptimizerSpec = "adamw",
    with_grads: bool = True,
) -> dict[str, int]:
    """Predict, tensor by tensor, what :func:`measure_model_state` will count after an optimizer step.

    Uses the model's parameter shapes and the policy's widths; adds torch's 4-byte ``step`` tensor per
    parameter for Adam/AdamW/Adafactor and Adafactor's factored moments (rows + cols per matrix).
    The ``-master`` policies describe :class:`MasterWeightOptimizer`; the autocast ones are fp32 model state.
    ``8-bit`` Adam has no torch implementation to measure and raises ``ValueError``.

    Introduced in notebook 06.
    """
    if not isinstance(with_grads, bool):
        raise TypeError(f"with_grads must be True or False, got {type(with_grads).__name__}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    pol, opt = get_policy(policy), get_optimizer(optimizer)
    if opt.name == "adam-8bit":
        raise ValueError("8-bit Adam is not in torch; predict it with model_state_bytes() instead")
    shapes = [tuple(p.shape) for p in model.parameters()]
    n = sum(math.prod(s) for s in shapes)
    width = _state_width(pol, opt)
    if opt.factored:
        states = sum(_factored_elements(s) for s in shapes) * width
    else:
        states = opt.n_states * n * width
    states += 4 * len(shapes) if opt.step_tensor else 0
    out = {
        "params": pol.param_bytes * n,
        "grads": pol.grad_bytes * n if with_grads else 0,
        "fp32_grads": pol.fp32_grad_bytes * n if with_grads else 0,
        "master": pol.master_bytes * n,
        "optimizer": states,
    }
    return {k: v for k, v in out.items() if v}


class MasterWeightOptimizer:
    """Mixed precision by hand: 16-bit model weights, fp32 master copies, an fp32 optimizer on the masters.

    ``policy`` (a ``-master`` policy of :mod:`labkit.precision`) picks which gradients persist after
    :meth:`step` (until :meth:`zero_grad`), one of the three conventions:

    - ``"bf16-master"`` (16 B/param with Adam): the 16-bit grads stay; each fp32 gradient exists only while
      its own tensor is updated (one torch optimizer per tensor), as the ZeRO paper counts.
    - ``"bf16-master-fp32-grads"`` (18): the grads are converted to fp32 on the masters and the 16-bit ones freed.
    - ``"bf16-master-fp32-accum"`` (20): both the 16-bit grads and the fp32 copies stay.

    After each update the 16-bit weights are refreshed from the masters (``p.copy_(master)``).

    Introduced in notebook 06.
    """

    def __init__(self, params: Iterable[torch.Tensor], optimizer: str = "adamw",
                 policy: str = "bf16-master", **kwargs: Any) -> None:
        pol = get_policy(policy)
        if not pol.master:
            raise ValueError(f"MasterWeightOptimizer takes a -master policy "
                             f"({[n for n, p in POLICIES.items() if p.master]}), not {safe_repr(policy)}")
        self.policy = pol.name
        self._transient_fp32 = not pol.fp32_grads      # fp32 grads exist only during their tensor's update
        self._free_16bit_grads = pol.grads is None     # the 16-bit grads are dropped once copied
        classes: dict[str, Callable[..., torch.optim.Optimizer]] = {
            "sgd": torch.optim.SGD, "sgd-momentum": torch.optim.SGD,
            "adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "adafactor": torch.optim.Adafactor,
        }
        name = get_optimizer(optimizer).name
        if name not in classes:
            raise ValueError(f"no torch optimizer for {safe_repr(optimizer)}; choose one of {sorted(classes)}")
        if name == "sgd-momentum":
            kwargs.setdefault("momentum", 0.9)
        if isinstance(params, (str, bytes, torch.Tensor)) or not isinstance(params, Iterable):
            raise TypeError(f"params must be an iterable of tensors (model.parameters()), got {type(params).__name__}")
        self.params = list(params)
        if not all(isinstance(p, torch.Tensor) for p in self.params):
            raise TypeError("params must hold tensors (model.parameters())")
        if not self.params:
            raise ValueError("MasterWeightOptimizer got no parameters")
        for p in self.params:
            if p.dtype not in (torch.float16, torch.bfloat16):
                raise ValueError(f"model parameters must be fp16 or bf16, got {p.dtype}")
        self.masters = [p.detach().float().clone().requires_grad_(True) for p in self.params]
        cls = classes[name]
        if self._transient_fp32:  # one optimizer per tensor: only one fp32 gradient exists at a time
            self.optimizers = [cls([m], **kwargs) for m in self.masters]
        else:
            self.optimizers = [cls(self.masters, **kwargs)]

    def step(self) -> None:
        """Copy gradients to the fp32 masters, update them, and refresh the 16-bit weights."""
        with torch.no_grad():
            if self._transient_fp32:
                for p, m, o in zip(self.params, self.masters, self.optimizers):
                    if p.grad is None:
                        continue
                    m.grad = p.grad.float()
                    o.step()
                    m.grad = None
                    p.copy_(m)
                return
            for p, m in zip(self.params, self.masters):
                if p.grad is not None:
                    m.grad = p.grad.float()
                    if self._free_16bit_grads:
                        p.grad = None
            self.optimizers[0].step()
            for p, m in zip(self.params, self.masters):
                p.copy_(m)

    def zero_grad(self) -> None:
        """Drop every gradient (16-bit and fp32), like ``zero_grad(set_to_none=True)``."""
        for t in (*self.params, *self.masters):
            t.grad = None


def setup_training(model: nn.Module, policy: str = "fp32", optimizer: str = "adamw",
                   lr: float = 1e-3) -> tuple[nn.Module, Any]:
    """Prepare ``model`` and an optimizer for a precision policy; return ``(model, optimizer)``.

    The autocast policies (``"fp32"``, ``"bf16"``, ``"fp16"`` …): the model stays fp32 (run the forward under
    ``labkit.precision.autocast``). ``"bf16-pure"``/``"fp16-pure"``: the model is cast and a torch optimizer
    updates it directly. The ``-master`` policies: the model is cast to 16 bits and a
    :class:`MasterWeightOptimizer` keeps the fp32 masters. Optimizers: ``sgd``, ``sgd-momentum`` (0.9),
    ``adam``, ``adamw``, ``adafactor``. Introduced in notebook 06.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not (isinstance(lr, (int, float)) and lr > 0):
        raise ValueError(f"lr must be a positive number, got {safe_repr(lr)}")
    pol, opt = get_policy(policy), get_optimizer(optimizer)
    model = model.to(pol.param_dtype)
    if pol.master:
        return model, MasterWeightOptimizer(model.parameters(), opt.name, pol.name, lr=lr)
    makers: dict[str, Callable[..., torch.optim.Optimizer]] = {
        "sgd": lambda ps: torch.optim.SGD(ps, lr=lr),
        "sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=lr, momentum=0.9),
        "adam": lambda ps: torch.optim.Adam(ps, lr=lr),
        "adamw": lambda ps: torch.optim.AdamW(ps, lr=lr),
        "adafactor": lambda ps: torch.optim.Adafactor(ps, lr=lr),
    }
    if opt.name not in makers:
        raise ValueError(f"no torch optimizer for {safe_repr(opt.name)}; choose one of {sorted(makers)}")
    return model, makers[opt.name](model.parameters())


def process_rss() -> int | None:
    """Return this process's resident set size in bytes (Linux ``/proc``), or ``None`` where unknown.

    A rough cross-check only: the allocator keeps freed memory and shares pages. Introduced in notebook 06.
    """
    import os

    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
