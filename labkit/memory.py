"""Where training memory goes: a model of model-state bytes (ZeRO, offload, optimizers) and activations.

Two halves, both checked against the real thing:

- **Prediction** (pure arithmetic): :func:`model_state_bytes` gives the bytes one rank holds for the
  parameters, gradients, fp32 master weights and optimizer states, for a precision policy
  (:data:`POLICIES`), an optimizer (:data:`OPTIMIZERS`), a ZeRO stage, a world size and CPU offload.
  :func:`gpt_activation_bytes` / :func:`mlp_activation_bytes` count the bytes that autograd saves for
  the backward pass of :class:`labkit.models.TinyGPT` / :class:`labkit.models.MLP`, with and without
  gradient checkpointing.
- **Measurement** (exact, from tensor storages): :func:`measure_model_state` counts every byte that a
  model and an optimizer hold; :func:`measure_saved_tensors` counts what autograd saves, with
  saved-tensor hooks. :func:`predict_torch_state` predicts the former for a real model, tensor by tensor.

The literature quotes 16, 18 or 20 bytes per parameter for mixed-precision Adam. They are all right;
they count different things (:func:`conventions_table` prints which is which):

====================  =====================================================  ==========
policy                what it keeps per parameter (Adam)                       bytes
====================  =====================================================  ==========
``mixed``             ZeRO paper: 2 (16-bit params) + 2 (16-bit grads) + K=12   16
``mixed-fp32-grads``  HF: 2 + 4 (fp32 master) + 4 (fp32 grads) + 8 (Adam)       18
``mixed-fp32-accum``  DeepSpeed: 2 + 2 + 4 (fp32 grads) + 4 + 8                 20
====================  =====================================================  ==========

``GB`` here is 10**9 bytes (the ZeRO paper's unit); DeepSpeed's estimators print GiB (2**30).

Introduced in notebook 06.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

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
    "calculator",
    "calculator_report",
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
CATEGORIES = ("params", "grads", "fp32_grads", "master", "optimizer", "weight_copies", "gathered")


# ----------------------------------------------------------------------------------------------------
# Precision policies and optimizers
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Policy:
    """A precision policy: how many bytes per parameter each copy of the weights and gradients takes.

    ``param_bytes``: the working weights used in forward/backward. ``grad_bytes``: gradients in the
    working precision (0 if they are not kept). ``fp32_grad_bytes``: an fp32 gradient copy (0 if none).
    ``master_bytes``: fp32 master weights (0 if the working weights are the master). ``state_bytes``:
    width of one optimizer-state element. ``autocast_copy_bytes``: 16-bit weight copies that autocast
    makes and autograd keeps from forward to backward (a temporary, not a model state).

    Introduced in notebook 06.
    """

    name: str
    param_bytes: int
    grad_bytes: int
    fp32_grad_bytes: int
    master_bytes: int
    state_bytes: int
    autocast_copy_bytes: int
    description: str


#: The precision policies :func:`model_state_bytes` knows, by name (see :func:`get_policy` for aliases).
POLICIES: dict[str, Policy] = {
    p.name: p
    for p in (
        Policy("fp32", 4, 4, 0, 0, 4, 0, "plain fp32: fp32 params and grads, fp32 optimizer states"),
        Policy("amp", 4, 4, 0, 0, 4, 2,
               "torch.autocast: fp32 params/grads/states + 16-bit weight copies kept for backward"),
        Policy("mixed", 2, 2, 0, 4, 4, 0,
               "ZeRO paper (2+2+K)Ψ: 16-bit params and grads, fp32 master + states (K)"),
        Policy("mixed-fp32-grads", 2, 0, 4, 4, 4, 0,
               "HF 'model memory anatomy': 16-bit params, fp32 grads, fp32 master + states"),
        Policy("mixed-fp32-accum", 2, 2, 4, 4, 4, 0,
               "DeepSpeed's estimators: 16-bit params and grads, plus fp32 grads, master + states"),
        Policy("bf16-pure", 2, 2, 0, 0, 2, 0,
               "pure bf16: no master weights, optimizer states in bf16 (torch Adam on bf16 params)"),
    )
}

_POLICY_ALIASES = {
    "fp16": "mixed", "bf16": "mixed", "mixed-fp16": "mixed", "mixed-bf16": "mixed", "zero": "mixed",
    "hf": "mixed-fp32-grads", "deepspeed": "mixed-fp32-accum", "autocast": "amp",
}


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


def get_policy(policy: str | Policy) -> Policy:
    """Return the :class:`Policy` for a name (or an alias such as ``"bf16"`` or ``"hf"``).

    Raises ``ValueError`` naming the known policies. Introduced in notebook 06.
    """
    if isinstance(policy, Policy):
        return policy
    if not isinstance(policy, str):
        raise TypeError(f"policy must be a str such as 'mixed' or a Policy, got {type(policy).__name__}")
    name = _POLICY_ALIASES.get(policy.lower(), policy.lower())
    if name not in POLICIES:
        raise ValueError(f"unknown precision policy {policy!r}; choose one of {sorted(POLICIES)} "
                         f"(aliases: {sorted(_POLICY_ALIASES)})")
    return POLICIES[name]


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
        raise ValueError(f"unknown optimizer {optimizer!r}; choose one of {sorted(OPTIMIZERS)}")
    return OPTIMIZERS[name]


def _state_width(pol: Policy, opt: OptimizerSpec) -> int:
    return opt.state_bytes if opt.state_bytes is not None else pol.state_bytes


def bytes_per_param(policy: str | Policy = "mixed", optimizer: str | OptimizerSpec = "adam") -> int:
    """Return the model-state bytes per parameter without ZeRO: params + grads + master + optimizer states.

    ``bytes_per_param("mixed", "adam") == 16`` (ZeRO paper), ``"mixed-fp32-grads"`` gives 18 (HF),
    ``"mixed-fp32-accum"`` 20 (DeepSpeed), ``"fp32"`` 16 as well. Autocast weight copies (a temporary)
    are not included. Introduced in notebook 06.
    """
    pol, opt = get_policy(policy), get_optimizer(optimizer)
    return (pol.param_bytes + pol.grad_bytes + pol.fp32_grad_bytes + pol.master_bytes
            + opt.n_states * _state_width(pol, opt))


def k_factor(policy: str | Policy = "mixed", optimizer: str | OptimizerSpec = "adam") -> int:
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
    rows = [(f"{'policy':<17} {'params':>6} {'grads':>5} {'fp32 g':>6} {'master':>6} {'states':>6} "
             f"{'total':>5}  convention")]
    for pol in POLICIES.values():
        states = opt.n_states * _state_width(pol, opt)
        rows.append(f"{pol.name:<17} {pol.param_bytes:>6} {pol.grad_bytes:>5} {pol.fp32_grad_bytes:>6} "
                    f"{pol.master_bytes:>6} {states:>6} {bytes_per_param(pol, opt):>5}  {pol.description}")
    return "\n".join(rows)


# ----------------------------------------------------------------------------------------------------
# The model-state model: ZeRO stages, world size, offload
# ----------------------------------------------------------------------------------------------------


def _check_count(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise ValueError(f"{name} must be a whole number, got {value!r}")
        value = int(value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


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
        return self.host_total * _check_count("gpus_per_node", gpus_per_node, 1)

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
    policy: str | Policy = "mixed",
    optimizer: str | OptimizerSpec = "adam",
    stage: int = 0,
    world_size: int = 1,
    offload_optimizer: bool = False,
    offload_params: bool = False,
    largest_layer_params: int = 0,
) -> ModelState:
    """Predict the model-state bytes per rank for ``n_params`` parameters, by category, GPU and CPU side.

    ZeRO stage 1 shards the optimizer side (master weights, states and the fp32 gradient copy) over
    ``world_size`` ranks, stage 2 also the 16-bit gradients, stage 3 also the parameters. A shard is
    ``ceil(n_params / world_size)`` elements. At stage 3 a rank also holds the gathered working params
    and their full gradient for the largest layer while it runs (``gathered``: 2 x ``param_bytes`` x
    ``largest_layer_params``). ``offload_optimizer`` (ZeRO-Offload, stage >= 1) moves the optimizer side to
    CPU; at stage >= 2 the gradient shard goes there too, stored once at its widest precision.
    ``offload_params`` (stage 3 only, with ``offload_optimizer``) moves the parameter shard to CPU.
    Autocast's 16-bit weight copies (policy ``"amp"``) count as ``weight_copies`` on the GPU.

    Introduced in notebook 06.
    """
    n = _check_count("n_params", n_params, 1)
    pol, opt = get_policy(policy), get_optimizer(optimizer)
    if isinstance(stage, bool) or not isinstance(stage, int) or stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, got {stage!r}")
    ws = _check_count("world_size", world_size, 1)
    largest = _check_count("largest_layer_params", largest_layer_params, 0)
    if largest > n:
        raise ValueError(f"largest_layer_params ({largest}) exceeds n_params ({n})")
    if not isinstance(offload_optimizer, bool) or not isinstance(offload_params, bool):
        raise TypeError("offload_optimizer and offload_params must be bools")
    if offload_optimizer and stage == 0:
        raise ValueError("optimizer offload (ZeRO-Offload) needs ZeRO stage >= 1")
    if offload_params and (stage != 3 or not offload_optimizer):
        raise ValueError("parameter offload needs ZeRO stage 3 and offload_optimizer=True")
    shard = -(-n // ws)  # ceil: DeepSpeed pads the flat buffer to a multiple of the world size
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
        if stage >= 2:  # the reduced gradient shard is copied to the CPU, kept once at its widest
            if pol.fp32_grad_bytes == 0:
                host["grads"] = pol.grad_bytes * g_elems
        else:
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


def zero_table(n_params: int, world_size: int, policy: str | Policy = "mixed",
               optimizer: str | OptimizerSpec = "adam", **kwargs: Any) -> dict[int, ModelState]:
    """Return :func:`model_state_bytes` for ZeRO stages 0-3, keyed by stage. Introduced in notebook 06."""
    return {s: model_state_bytes(n_params, policy, optimizer, stage=s, world_size=world_size, **kwargs)
            for s in (0, 1, 2, 3)}


def smallest_fitting_stage(n_params: int, gpu_bytes: float, world_size: int,
                           policy: str | Policy = "mixed", optimizer: str | OptimizerSpec = "adam",
                           reserve_bytes: float = 0, **kwargs: Any) -> int | None:
    """Return the smallest ZeRO stage whose model states plus ``reserve_bytes`` fit in ``gpu_bytes``.

    Returns ``None`` if even stage 3 does not fit. Introduced in notebook 06.
    """
    if not (isinstance(gpu_bytes, (int, float)) and gpu_bytes > 0):
        raise ValueError(f"gpu_bytes must be a positive number, got {gpu_bytes!r}")
    if not (isinstance(reserve_bytes, (int, float)) and reserve_bytes >= 0):
        raise ValueError(f"reserve_bytes must be >= 0, got {reserve_bytes!r}")
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
        raise ValueError(f"unknown unit {unit!r}; choose one of {sorted(units)}")
    if unit == "B":
        return f"{int(n):,} B"
    return f"{n / units[unit]:,.2f} {unit}"


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
        s = t.untyped_storage()
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
    The ``"mixed*"`` policies describe :class:`MasterWeightOptimizer`; ``"amp"`` is fp32 model state.
    ``8-bit`` Adam has no torch implementation to measure and raises ``ValueError``.

    Introduced in notebook 06.
    """
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

    ``policy`` picks which gradients persist after :meth:`step` (until :meth:`zero_grad`), one of the
    three conventions:

    - ``"mixed"`` (16 B/param with Adam): the 16-bit grads stay; each fp32 gradient exists only while
      its own tensor is updated (one torch optimizer per tensor), as the ZeRO paper counts.
    - ``"mixed-fp32-grads"`` (18): the grads are converted to fp32 on the masters and the 16-bit ones freed.
    - ``"mixed-fp32-accum"`` (20): both the 16-bit grads and the fp32 copies stay.

    After each update the 16-bit weights are refreshed from the masters (``p.copy_(master)``).

    Introduced in notebook 06.
    """

    def __init__(self, params: Iterable[torch.Tensor], optimizer: str = "adamw",
                 policy: str = "mixed", **kwargs: Any) -> None:
        self.policy = get_policy(policy).name
        if self.policy not in ("mixed", "mixed-fp32-grads", "mixed-fp32-accum"):
            raise ValueError(f"MasterWeightOptimizer takes a mixed policy, not {policy!r}")
        classes: dict[str, Callable[..., torch.optim.Optimizer]] = {
            "sgd": torch.optim.SGD, "sgd-momentum": torch.optim.SGD,
            "adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "adafactor": torch.optim.Adafactor,
        }
        name = get_optimizer(optimizer).name
        if name not in classes:
            raise ValueError(f"no torch optimizer for {optimizer!r}; choose one of {sorted(classes)}")
        if name == "sgd-momentum":
            kwargs.setdefault("momentum", 0.9)
        self.params = [p for p in params]
        if not self.params:
            raise ValueError("MasterWeightOptimizer got no parameters")
        for p in self.params:
            if p.dtype not in (torch.float16, torch.bfloat16):
                raise ValueError(f"model parameters must be fp16 or bf16, got {p.dtype}")
        self.masters = [p.detach().float().clone().requires_grad_(True) for p in self.params]
        cls = classes[name]
        if self.policy == "mixed":  # one optimizer per tensor: only one fp32 gradient exists at a time
            self.optimizers = [cls([m], **kwargs) for m in self.masters]
        else:
            self.optimizers = [cls(self.masters, **kwargs)]

    def step(self) -> None:
        """Copy gradients to the fp32 masters, update them, and refresh the 16-bit weights."""
        with torch.no_grad():
            if self.policy == "mixed":
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
                    if self.policy == "mixed-fp32-grads":
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

    ``"fp32"``/``"amp"``: the model stays fp32 (for ``"amp"`` run the forward under ``torch.autocast``).
    ``"bf16-pure"``: the model is cast to bf16 and a torch optimizer updates it directly. ``"mixed*"``:
    the model is cast to bf16 and a :class:`MasterWeightOptimizer` keeps the fp32 masters. Optimizers:
    ``sgd``, ``sgd-momentum`` (0.9), ``adam``, ``adamw``, ``adafactor``. Introduced in notebook 06.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not (isinstance(lr, (int, float)) and lr > 0):
        raise ValueError(f"lr must be a positive number, got {lr!r}")
    pol, opt = get_policy(policy), get_optimizer(optimizer)
    if pol.name.startswith("mixed"):
        model = model.to(torch.bfloat16)
        return model, MasterWeightOptimizer(model.parameters(), opt.name, pol.name, lr=lr)
    if pol.name == "bf16-pure":
        model = model.to(torch.bfloat16)
    makers: dict[str, Callable[..., torch.optim.Optimizer]] = {
        "sgd": lambda ps: torch.optim.SGD(ps, lr=lr),
        "sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=lr, momentum=0.9),
        "adam": lambda ps: torch.optim.Adam(ps, lr=lr),
        "adamw": lambda ps: torch.optim.AdamW(ps, lr=lr),
        "adafactor": lambda ps: torch.optim.Adafactor(ps, lr=lr),
    }
    if opt.name not in makers:
        raise ValueError(f"no torch optimizer for {opt.name!r}; choose one of {sorted(makers)}")
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


# ----------------------------------------------------------------------------------------------------
# Activations: estimates and saved-tensor measurement
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SavedTensors:
    """What autograd saved for backward during a forward pass, in bytes of distinct storages.

    ``activations``: everything saved that is not a parameter nor a copy of one. ``weight_copies``:
    casts of parameters (autocast's 16-bit weights). ``params``: parameters saved as they are (these
    cost nothing extra: the model holds them anyway). ``by_dtype``: activation bytes per dtype name.

    Introduced in notebook 06.
    """

    activations: int
    weight_copies: int
    params: int
    by_dtype: dict[str, int] = field(default_factory=dict)


_VIEWISH = {"ToCopyBackward0", "TBackward0", "ViewBackward0", "TransposeBackward0", "PermuteBackward0",
            "ExpandBackward0", "UnsafeViewBackward0", "ReshapeAliasBackward0", "AliasBackward0"}


def _is_param_copy(t: torch.Tensor, param_ids: set[int]) -> bool:
    fn = t.grad_fn
    copied = False
    for _ in range(6):
        if fn is None:
            return False
        name = type(fn).__name__
        if name == "AccumulateGrad":
            return copied and id(fn.variable) in param_ids
        if name not in _VIEWISH:
            return False
        copied = copied or name == "ToCopyBackward0"
        nxt = [f for f, _ in fn.next_functions if f is not None]
        if len(nxt) != 1:
            return False
        fn = nxt[0]
    return False


def measure_saved_tensors(fn: Callable[[], Any], params: Iterable[torch.Tensor] = ()) -> tuple[Any, SavedTensors]:
    """Run ``fn()`` under saved-tensor hooks; return its result and the bytes autograd saved for backward.

    Storages are counted once (a tensor saved by two ops, or views of one buffer, count once); tensors
    that share storage with ``params`` count as ``params``; casts of ``params`` count as
    ``weight_copies``. A saved view counts its whole storage (that is what it keeps alive): slice a batch
    out of a data set with ``.clone()`` before measuring. Keep the result alive while
    you read the numbers: the graph owns the tensors.

    Introduced in notebook 06.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    plist = list(params)
    param_ptrs = {p.untyped_storage().data_ptr() for p in plist}
    param_ids = {id(p) for p in plist}
    seen: dict[int, tuple[str, int, str]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        ptr = s.data_ptr()
        if ptr not in seen:
            if ptr in param_ptrs:
                kind = "params"
            elif _is_param_copy(t, param_ids):
                kind = "weight_copies"
            else:
                kind = "activations"
            seen[ptr] = (kind, s.nbytes(), str(t.dtype).replace("torch.", ""))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    totals = {"activations": 0, "weight_copies": 0, "params": 0}
    by_dtype: dict[str, int] = {}
    for kind, nbytes, dt in seen.values():
        totals[kind] += nbytes
        if kind == "activations":
            by_dtype[dt] = by_dtype.get(dt, 0) + nbytes
    return out, SavedTensors(by_dtype=dict(sorted(by_dtype.items())), **totals)


_WRAPPED_NUMBER_DTYPES = (torch.float64, torch.int64, torch.complex128)


def graph_saved_bytes(t: torch.Tensor, exclude: Iterable[torch.Tensor] = ()) -> int:
    """Return the bytes of the tensors that the autograd graph behind ``t`` still keeps alive for backward.

    Walks ``t.grad_fn`` and every node it reaches, and counts the distinct storages of their saved
    tensors, skipping storages shared with ``exclude`` (pass the model's parameters: the model holds
    them anyway). After ``backward()`` the graph has freed its saved tensors and this returns 0, but the
    graph itself lives as long as ``t`` does: a loss kept without ``.item()`` or ``.detach()`` before
    backward keeps every activation of its step. 0-dim float64/int64 tensors are skipped: they are the
    Python numbers of ops like ``x * 0.5``, a few bytes each, which saved-tensor hooks never see either.

    Introduced in notebook 06.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"t must be a tensor, got {type(t).__name__}")
    skip = {p.untyped_storage().data_ptr() for p in exclude}
    seen: dict[int, int] = {}
    stack, visited = [t.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in visited:
            continue
        visited.add(node)
        for name in dir(node):
            if not name.startswith("_saved_"):
                continue
            try:
                value = getattr(node, name)
            except RuntimeError:  # freed by backward
                continue
            for v in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(v, torch.Tensor) and not (v.dim() == 0 and v.dtype in _WRAPPED_NUMBER_DTYPES):
                    s = v.untyped_storage()
                    if s.data_ptr() not in skip:
                        seen[s.data_ptr()] = s.nbytes()
        stack.extend(f for f, _ in node.next_functions)
    return sum(seen.values())


class _Checkpointed(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.inner, x, use_reentrant=False)


@contextlib.contextmanager
def checkpointed(model: nn.Module) -> Iterator[nn.Module]:
    """Temporarily turn on activation (gradient) checkpointing: per block for a TinyGPT, per hidden layer
    (Linear + activation) for an MLP. The model is restored on exit; the parameters are the same objects.

    Introduced in notebook 06.
    """
    from labkit.models import MLP, TinyGPT

    if isinstance(model, TinyGPT):
        old = model.blocks
        model.blocks = nn.ModuleList(_Checkpointed(b) for b in old)
        try:
            yield model
        finally:
            model.blocks = old
    elif isinstance(model, MLP):
        old_net = model.net
        layers = list(old_net)
        segs = [_Checkpointed(nn.Sequential(layers[i], layers[i + 1])) for i in range(0, len(layers) - 1, 2)]
        model.net = nn.Sequential(*segs, layers[-1])
        try:
            yield model
        finally:
            model.net = old_net
    else:
        raise TypeError(f"checkpointed() knows TinyGPT and MLP, got {type(model).__name__}")


@dataclass(frozen=True)
class ActivationEstimate:
    """Predicted bytes autograd saves in one forward pass (the model only, not the loss).

    ``per_layer``: one block (GPT) or hidden layer (MLP), without checkpointing. ``saved``: everything
    held at the end of the forward pass (``activations`` + ``weight_copies``), with or without
    checkpointing as asked. ``peak``: ``saved`` plus, with checkpointing, one layer recomputed during
    backward. ``per_token_per_layer``: ``per_layer`` / tokens in the batch.

    Introduced in notebook 06.
    """

    per_layer: int
    activations: int
    weight_copies: int
    peak: int
    tokens: int

    @property
    def saved(self) -> int:
        return self.activations + self.weight_copies

    @property
    def per_token_per_layer(self) -> float:
        return self.per_layer / self.tokens


def _widths(autocast: str | None) -> int:
    if autocast is None:
        return 4
    if autocast in ("bf16", "fp16", "bfloat16", "float16"):
        return 2
    raise ValueError(f"autocast must be None, 'bf16' or 'fp16', got {autocast!r}")


def gpt_activation_bytes(
    cfg: Any,
    batch: int,
    seq_len: int | None = None,
    autocast: str | None = None,
    checkpointing: bool = False,
) -> ActivationEstimate:
    """Predict the bytes a :class:`~labkit.models.TinyGPT` forward pass saves for backward, op by op.

    With B batch, T tokens, C = d_model, H heads, M = mlp_ratio * C and ``a`` the matmul-input width
    (4 in fp32, 2 under CPU autocast), one block saves: LayerNorm inputs and statistics in fp32
    (2 x (BTC + 2BT) x 4); the inputs of the four matmuls' operands a x (6BTC + 2BTM) (qkv input, q and
    k^T copies, v, the attention output, MLP input, GELU input and output); the causal mask (T^2 bools);
    the softmax's saved tensors (its "fp32" island: 2 x (BHT^2 + BHT) x 4); and the attention matrix for
    ``att @ v``. Autocast adds 16-bit copies of every Linear weight. With ``checkpointing`` a block
    keeps only its fp32 input (BTC x 4) and recomputes the rest during backward. This describes CPU
    autocast as measured (CUDA autocast runs softmax/LayerNorm differently).

    Introduced in notebook 06.
    """
    from labkit.models import GPTConfig

    if not isinstance(cfg, GPTConfig):
        raise TypeError(f"cfg must be a labkit.models.GPTConfig, got {type(cfg).__name__}")
    B = _check_count("batch", batch, 1)
    T = cfg.seq_len if seq_len is None else _check_count("seq_len", seq_len, 1)
    if T > cfg.seq_len:
        raise ValueError(f"seq_len {T} exceeds the model's seq_len {cfg.seq_len}")
    if not isinstance(checkpointing, bool):
        raise TypeError("checkpointing must be a bool")
    a, f = _widths(autocast), 4
    C, H, M, V, L = cfg.d_model, cfg.n_heads, cfg.mlp_ratio * cfg.d_model, cfg.vocab_size, cfg.n_layers
    BTC, BT, BTM, BHTT, BHT = B * T * C, B * T, B * T * M, B * H * T * T, B * H * T
    s = {"fp32": f, "stable": a, "naive": a, "torch": a}[cfg.softmax]
    soft = {"fp32": 2 * (BHTT + BHT), "stable": 2 * (BHTT + BHT), "naive": BHTT + BHT, "torch": BHTT}[cfg.softmax]
    att = 0 if cfg.softmax == "torch" else a * BHTT  # torch's softmax output *is* the saved attention
    block = f * (2 * BTC + 4 * BT) + a * (6 * BTC + 2 * BTM) + T * T + s * soft + att
    block_weights = (4 * C * C + 2 * M * C) * a if autocast else 0
    head_weights = V * C * a if autocast else 0
    embed = 8 * BT + 8 * T  # token ids and positions, int64
    final = f * (BTC + 2 * BT) + a * BTC  # ln_f (input, mean, rstd) and the head's input
    if checkpointing:
        acts = embed + L * f * BTC + final
        weights = head_weights  # block weights are cast again when the block is recomputed
        peak = acts + weights + block + block_weights
    else:
        acts = embed + L * block + final
        weights = L * block_weights + head_weights
        peak = acts + weights
    return ActivationEstimate(per_layer=block, activations=acts, weight_copies=weights, peak=peak, tokens=BT)


def mlp_activation_bytes(
    model_or_config: Any,
    batch: int,
    autocast: str | None = None,
    checkpointing: bool = False,
) -> ActivationEstimate:
    """Predict the bytes an :class:`~labkit.models.MLP` forward pass saves for backward.

    The first Linear saves its input (``batch x in_features``; under autocast a 16-bit copy of it). Each
    hidden layer saves ``batch x hidden`` once for ReLU/Tanh (they save their output, which is also the
    next Linear's input) and twice for GELU (it saves its input). Autocast adds 16-bit copies of the
    weights except the first layer's (autograd saves a weight only to compute the gradient of its
    layer's input, and the data needs none). With ``checkpointing`` (per hidden layer) each layer keeps only its input; for ReLU that is
    exactly what it saved anyway, so checkpointing an MLP layer by layer saves nothing; with GELU it halves.

    Introduced in notebook 06.
    """
    from labkit.models import MLP

    cfg = model_or_config.config if isinstance(model_or_config, MLP) else model_or_config
    if not isinstance(cfg, dict) or not {"in_features", "hidden", "out_features", "depth", "activation"} <= set(cfg):
        raise TypeError("pass a labkit.models.MLP or its .config dict")
    B = _check_count("batch", batch, 1)
    if not isinstance(checkpointing, bool):
        raise TypeError("checkpointing must be a bool")
    a = _widths(autocast)
    fin, hid, out, depth = cfg["in_features"], cfg["hidden"], cfg["out_features"], cfg["depth"]
    k = 2 if cfg["activation"] == "gelu" else 1
    x_bytes = a * B * fin  # fp32: the input itself; autocast: its 16-bit copy
    layer = k * a * B * hid
    # A weight is saved only if its Linear's input needs a gradient: not the first layer's (x is data).
    n_weights = (hid * hid * (depth - 1) + hid * out) if depth else 0
    weights = a * n_weights if autocast else 0
    if depth == 0:
        return ActivationEstimate(per_layer=0, activations=x_bytes, weight_copies=weights,
                                  peak=x_bytes + weights, tokens=B)
    if checkpointing:
        first_in = 4 * B * fin  # a checkpointed segment keeps its input as given (fp32)
        acts = first_in + depth * a * B * hid  # later segments' inputs + the output layer's input
        w_kept = a * hid * out if autocast else 0
        w_layer = a * max(fin, hid) * hid if autocast else 0
        peak = acts + w_kept + layer + w_layer
        return ActivationEstimate(per_layer=layer, activations=acts, weight_copies=w_kept, peak=peak, tokens=B)
    acts = x_bytes + depth * layer
    return ActivationEstimate(per_layer=layer, activations=acts, weight_copies=weights,
                              peak=acts + weights, tokens=B)


# ----------------------------------------------------------------------------------------------------
# The interactive calculator
# ----------------------------------------------------------------------------------------------------


def calculator_report(
    n_params: int,
    gpus_per_node: int = 8,
    nodes: int = 1,
    stage: int = 2,
    offload: str = "none",
    policy: str = "mixed",
    optimizer: str = "adam",
    gpu_gb: float = 80.0,
) -> str:
    """Return the calculator's answer as one line: per-GPU model states, whether they fit, CPU per node.

    ``offload`` is ``"none"``, ``"optimizer"`` or ``"optimizer+params"``. Activations come on top of the
    model states; the line says how much of the GPU is left for them. Introduced in notebook 06.
    """
    if offload not in ("none", "optimizer", "optimizer+params"):
        raise ValueError(f"offload must be 'none', 'optimizer' or 'optimizer+params', got {offload!r}")
    gpn = _check_count("gpus_per_node", gpus_per_node, 1)
    nn_ = _check_count("nodes", nodes, 1)
    if not (isinstance(gpu_gb, (int, float)) and gpu_gb > 0):
        raise ValueError(f"gpu_gb must be a positive number, got {gpu_gb!r}")
    est = model_state_bytes(n_params, policy, optimizer, stage=stage, world_size=gpn * nn_,
                            offload_optimizer=offload != "none", offload_params=offload == "optimizer+params")
    per_gpu = est.device_total
    cap = gpu_gb * GB
    verdict = (f"fits, {fmt_bytes(cap - per_gpu)} left for activations" if per_gpu <= cap
               else f"does NOT fit ({fmt_bytes(per_gpu - cap)} over)")
    line = f"per GPU: {fmt_bytes(per_gpu)} of model states on a {gpu_gb:g} GB GPU: {verdict}"
    if est.host:
        line += f"; CPU per node: {fmt_bytes(est.host_per_node(gpn))}"
    return line


def calculator(n_params: int | str = "13B", gpus_per_node: int = 8, nodes: int = 1, stage: int = 2,
               offload: str = "optimizer", policy: str = "mixed", optimizer: str = "adam",
               gpu_gb: float = 80.0) -> Any:
    """Return an ipywidgets memory calculator (a VBox); its ``.result`` Label shows the per-GPU figure.

    Inputs: model size (preset or a number of billions), GPUs per node, nodes, ZeRO stage, offload,
    precision policy, optimizer and GPU memory. ``.controls`` holds the input widgets by name. CSS
    classes for browser tests: the box ``lk-memcalc``, the result ``lk-mem-result``, each control
    ``lk-mem-<name>`` (``lk-mem-stage``, ``lk-mem-gpus-per-node`` ...). Introduced in notebook 06.
    """
    import ipywidgets as widgets

    if isinstance(n_params, str):
        if n_params not in MODEL_PRESETS:
            raise ValueError(f"unknown preset {n_params!r}; choose one of {list(MODEL_PRESETS)} or pass a number")
        preset, billions = n_params, MODEL_PRESETS[n_params] / 1e9
    else:
        billions = _check_count("n_params", n_params, 1) / 1e9
        preset = next((k for k, v in MODEL_PRESETS.items() if v == n_params), "custom")

    class MemoryCalculator(widgets.VBox):
        def __repr__(self) -> str:
            return "MemoryCalculator()"

    c = {
        "preset": widgets.Dropdown(options=[*MODEL_PRESETS, "custom"], value=preset, description="model"),
        "billions": widgets.BoundedFloatText(value=billions, min=0.001, max=10000, step=0.5,
                                             description="params (B)"),
        "gpus_per_node": widgets.BoundedIntText(value=gpus_per_node, min=1, max=64, description="GPUs/node"),
        "nodes": widgets.BoundedIntText(value=nodes, min=1, max=4096, description="nodes"),
        "stage": widgets.Dropdown(options=[0, 1, 2, 3], value=stage, description="ZeRO stage"),
        "offload": widgets.Dropdown(options=["none", "optimizer", "optimizer+params"], value=offload,
                                    description="offload"),
        "policy": widgets.Dropdown(options=list(POLICIES), value=get_policy(policy).name, description="precision"),
        "optimizer": widgets.Dropdown(options=list(OPTIMIZERS), value=get_optimizer(optimizer).name,
                                      description="optimizer"),
        "gpu_gb": widgets.BoundedFloatText(value=gpu_gb, min=1, max=1000, description="GPU GB"),
    }
    result = widgets.Label(value="")
    result.add_class("lk-mem-result")
    for name, w in c.items():  # stable hooks for browser tests: .lk-mem-stage select, .lk-mem-result
        w.add_class(f"lk-mem-{name.replace('_', '-')}")

    def on_preset(change: dict) -> None:
        if change["new"] != "custom":
            c["billions"].value = MODEL_PRESETS[change["new"]] / 1e9  # triggers update()
        update()

    def on_billions(change: dict) -> None:
        p = c["preset"].value
        if p != "custom" and MODEL_PRESETS[p] != round(change["new"] * 1e9):
            c["preset"].value = "custom"
        update()

    def update(*_: Any) -> None:
        try:
            result.value = calculator_report(
                round(c["billions"].value * 1e9), c["gpus_per_node"].value, c["nodes"].value,
                c["stage"].value, c["offload"].value, c["policy"].value, c["optimizer"].value,
                c["gpu_gb"].value)
        except (ValueError, TypeError) as exc:
            result.value = f"invalid setup: {exc}"

    c["preset"].observe(on_preset, names="value")
    c["billions"].observe(on_billions, names="value")
    for k, w in c.items():
        if k not in ("preset", "billions"):
            w.observe(update, names="value")
    update()
    box = MemoryCalculator([*c.values(), result])
    box.add_class("lk-memcalc")
    box.controls = c  # type: ignore[attr-defined]
    box.result = result  # type: ignore[attr-defined]
    return box
