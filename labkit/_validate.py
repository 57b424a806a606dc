"""Argument checks labkit's modules share: bounded whole numbers, dense tensors, and a repr safe for messages.

- :func:`check_int` takes a whole number in ``[low, high]`` and says the allowed range otherwise. It only
  compares, so ``10**400`` is refused with a ``ValueError`` rather than an ``OverflowError`` from a conversion
  (or an allocation that never ends).
- :func:`safe_repr` shows a value in an error message: at most ``limit`` characters, never raising. A list
  nested 100,000 deep, an ``int`` of 10,000 digits or an object whose ``__repr__`` fails would otherwise turn
  the message itself into a ``RecursionError`` or a ``ValueError`` about something else.
- :func:`as_float` converts a number already checked to be an int or a float, refusing an int beyond a float's
  range (``10**400``) with a ``ValueError`` instead of the ``OverflowError`` of ``float()`` or ``math.isfinite``.
- :func:`check_dense` refuses tensors that dense code cannot read: sparse layouts (``TypeError``) and meta
  tensors, which have a shape but no values (``ValueError``).
- :data:`MAX_MODEL_PARAMS`, :data:`MAX_DEPTH`: how large a model labkit builds in one process, and
  :func:`mlp_param_count` to check an MLP's size before building it; :data:`MAX_PREDICTED_PARAMS` and
  :data:`MAX_WORLD_SIZE`: how many parameters and ranks the memory and partition models take.

Not a public module (not in ``labkit.__all__``); torch is imported only by :func:`check_dense`, so the
command lines can use the rest before torch loads. Introduced in notebook 03.
"""

from __future__ import annotations

import reprlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["MAX_DEPTH", "MAX_MODEL_PARAMS", "MAX_PREDICTED_PARAMS", "MAX_WORLD_SIZE", "as_float", "check_dense",
           "check_int", "mlp_param_count", "safe_repr"]

#: The most parameters a model labkit builds may have: 20 billion, 80 GB of fp32 weights, the whole memory
#: of one 80 GB GPU (A100/H100; in bf16 it is 40 GB). A larger model cannot live on one device in fp32, and
#: labkit builds every model in one process, so more is a typo (or ``2**40``), refused before any allocation.
MAX_MODEL_PARAMS = 20 * 10**9

#: The most parameters labkit's memory arithmetic (:func:`labkit.memory.model_state_bytes`) predicts for: 10**15,
#: a thousand times the largest models trained so far (about 2 trillion). A prediction builds nothing, so the
#: bound is loose; it keeps byte counts within what a float (and so a formatted "GB" figure) can show.
MAX_PREDICTED_PARAMS = 10**15

#: The most ranks labkit's memory and partition models take: 2**20 = 1,048,576, ten times the largest GPU clusters
#: built (about 100,000 GPUs). :func:`labkit.zero.partition_layout` lists every rank, so ``2**40`` would not end.
MAX_WORLD_SIZE = 2**20

#: The most layers a labkit model stacks: 10,000, ten times ResNet-1001's depth (and as deep as the deepest
#: networks trained in research). Building that many small layers takes a second; ``depth=2**40`` never ends.
MAX_DEPTH = 10_000


def _repr_settings() -> reprlib.Repr:
    r = reprlib.Repr()
    r.maxlevel, r.maxstring, r.maxother, r.maxlong = 3, 150, 80, 40
    r.maxlist = r.maxtuple = r.maxset = r.maxfrozenset = r.maxdeque = r.maxarray = 6
    r.maxdict = 4
    return r


_REPR = _repr_settings()


def safe_repr(value: object, limit: int = 160) -> str:
    """Return a short ``repr`` of ``value`` for an error message: at most ``limit`` characters, never raising.

    Strings (a path, a name) are shown whole up to 150 characters; containers to three levels (``[[[[...]]]]``)
    and six items; a huge int by its size; an object whose ``repr`` fails (or recurses too deep) by its type.
    Introduced in notebook 03.
    """
    try:
        if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
            text = f"<an int of {value.bit_length()} bits>"  # repr() of 10**5000 raises ValueError
        else:
            text = _REPR.repr(value)
    except Exception:  # a failing __repr__, a RecursionError from an object's own repr
        text = f"<{type(value).__name__} object>"
    return text if len(text) <= limit else text[: max(limit - 3, 0)] + "..."


def check_int(name: str, value: object, low: int, high: int | None = None) -> int:
    """Return ``value`` if it is an ``int`` (not a bool) in ``[low, high]``; else TypeError or ValueError.

    The message names ``name`` and the allowed range. Introduced in notebook 03.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low or (high is not None and value > high):
        bounds = f"between {low:,} and {high:,}" if high is not None else f">= {low:,}"
        raise ValueError(f"{name} must be {bounds}, got {safe_repr(value, 40)}")
    return value


def as_float(name: str, value: int | float) -> float:
    """Return ``float(value)`` for a number already checked to be an int or a float.

    An int beyond a float's range (``10**400``) raises ``ValueError`` saying so, not ``OverflowError``.
    Introduced in notebook 03.
    """
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{name} must be a number a float can hold (at most about 1.8e308), got "
                         f"{safe_repr(value, 40)}") from None


def check_dense(name: str, value: object) -> torch.Tensor:
    """Return ``value`` if it is a dense (strided) tensor with data.

    Raises ``TypeError`` for anything else than a tensor and for sparse layouts (``.to_dense()`` first), and
    ``ValueError`` for a meta tensor (a shape without values: make it on cpu or cuda). Introduced in notebook 03.
    """
    import torch

    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.layout != torch.strided:
        raise TypeError(f"{name} must be a dense tensor, got a {str(value.layout).removeprefix('torch.')} one "
                        "(call .to_dense() first)")
    if value.is_meta:
        raise ValueError(f"{name} is a meta tensor: it has a shape but no values (create it on cpu or cuda)")
    return value


def mlp_param_count(in_features: int, hidden: int, out_features: int, depth: int) -> int:
    """Return the parameters of ``labkit.models.MLP(in_features, hidden, out_features, depth=depth)``.

    Weights and biases of ``depth`` hidden layers and the output layer; plain arithmetic, so a size can be
    refused before torch is imported or anything allocated. Introduced in notebook 03.
    """
    if depth == 0:
        return in_features * out_features + out_features
    return ((in_features + 1) * hidden + (depth - 1) * (hidden + 1) * hidden
            + (hidden + 1) * out_features)
