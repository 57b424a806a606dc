"""Activation memory: what autograd saves for backward, estimated by formula and measured with hooks.

- :func:`gpt_activation_bytes` / :func:`mlp_activation_bytes` count the bytes that autograd saves for the
  backward pass of :class:`labkit.models.TinyGPT` / :class:`labkit.models.MLP`, with and without gradient
  checkpointing (:func:`checkpointed`).
- :func:`measure_saved_tensors` counts what autograd really saves, with saved-tensor hooks;
  :func:`graph_saved_bytes` what a kept tensor's graph still holds.

:mod:`labkit.memory` (model states) re-exports these names, so notebook 06 reaches both through ``mem``.

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

from labkit import precision
from labkit._validate import check_dense, safe_repr

__all__ = [
    "ActivationEstimate",
    "SavedTensors",
    "check_count",
    "checkpointed",
    "gpt_activation_bytes",
    "graph_saved_bytes",
    "measure_saved_tensors",
    "mlp_activation_bytes",
]


def check_count(name: str, value: object, minimum: int, maximum: int | None = None) -> int:
    """Return ``value`` as an int >= ``minimum`` (and <= ``maximum`` if given; a whole float is accepted);
    ``TypeError``/``ValueError`` else, saying the allowed range.

    The argument check shared by the memory and activation models. Introduced in notebook 06.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    if isinstance(minimum, bool) or not isinstance(minimum, int):
        raise TypeError(f"minimum must be an int, got {type(minimum).__name__}")
    if maximum is not None and (isinstance(maximum, bool) or not isinstance(maximum, int)):
        raise TypeError(f"maximum must be None or an int, got {type(maximum).__name__}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise ValueError(f"{name} must be a whole number, got {safe_repr(value)}")
        value = int(value)
    if value < minimum or (maximum is not None and value > maximum):
        want = f">= {minimum}" if maximum is None else f"between {minimum:,} and {maximum:,}"
        raise ValueError(f"{name} must be {want}, got {safe_repr(value, 40)}")
    return int(value)


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
    if isinstance(params, torch.Tensor) or not isinstance(params, Iterable):
        raise TypeError(f"params must be an iterable of tensors (model.parameters()), got {type(params).__name__}")
    plist = list(params)
    if not all(isinstance(p, torch.Tensor) for p in plist):
        raise TypeError("params must hold tensors (model.parameters())")
    param_ptrs = {check_dense("params' tensors", p).untyped_storage().data_ptr() for p in plist}
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
    if isinstance(exclude, torch.Tensor):
        exclude = [exclude]
    if isinstance(exclude, (str, bytes)) or not isinstance(exclude, Iterable):
        raise TypeError(f"exclude must be an iterable of tensors, got {type(exclude).__name__}")
    exclude = list(exclude)
    if not all(isinstance(p, torch.Tensor) for p in exclude):
        raise TypeError("exclude must hold tensors (e.g. model.parameters())")
    skip = {check_dense("exclude's tensors", p).untyped_storage().data_ptr() for p in exclude}
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
    try:
        name = precision.dtype_name(autocast)
    except (TypeError, ValueError):
        name = None
    if name not in ("bf16", "fp16"):
        raise ValueError(f"autocast must be None, 'bf16' or 'fp16', got {safe_repr(autocast)}")
    return precision.dtype(name).itemsize


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
    B = check_count("batch", batch, 1)
    T = cfg.seq_len if seq_len is None else check_count("seq_len", seq_len, 1)
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
    B = check_count("batch", batch, 1)
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
