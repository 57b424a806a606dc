"""Finding the first NaN: forward hooks for the forward pass, anomaly mode for the backward pass.

A NaN or inf spreads: one bad value in one layer turns every later activation, the loss and every
gradient into NaN, so the loss tells you *that* something broke, never *where*. Two tools find the origin:

- **Forward:** :func:`first_nonfinite` runs a function with a forward hook on every submodule and
  returns the first module (in execution order) whose output holds a NaN or inf, and whether its
  inputs were still finite (if they were not, the bad value came from code between modules, such as
  ``x / 0`` in the parent's ``forward``).
- **Backward:** :func:`backward_anomaly` runs ``loss.backward()`` under ``torch.autograd.detect_anomaly``,
  which checks every backward function's output and raises at the first one that returns NaN. It
  returns the name of that backward function and the source line of the forward call that created it.

Anomaly mode slows backward several times over: turn it on to hunt a bug, never in production runs.

Introduced in notebook 03.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from labkit.i18n import gettext as _

__all__ = ["BackwardAnomaly", "NonFinite", "backward_anomaly", "first_nonfinite", "nonfinite_count"]


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    """The tensors in ``value`` (tensors, tuples, lists, dicts, nested): walked with a stack, not recursion, so
    any depth is fine, and each container once, so one that holds itself ends too."""
    stack, seen = [value], set()
    while stack:
        v = stack.pop()
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (tuple, list, dict)) and id(v) not in seen:
            seen.add(id(v))
            stack.extend(reversed(list(v.values() if isinstance(v, dict) else v)))


def _nonfinite(t: torch.Tensor) -> int:
    if not (t.is_floating_point() or t.is_complex()):
        return 0
    if t.is_meta:
        raise ValueError("a meta tensor has a shape but no values: there is nothing to count")
    if t.layout == torch.sparse_coo:  # a sparse gradient (nn.Embedding(sparse=True)): its stored values count
        t = t.coalesce().values()
    elif t.layout != torch.strided:
        t = t.values()
    return int((~torch.isfinite(t)).sum())


def nonfinite_count(value: Any) -> int:
    """Return how many NaN/inf elements the floating-point tensors in ``value`` hold (tensors, tuples, lists, dicts).

    A sparse tensor counts its stored values; a meta tensor (no values) raises ``ValueError``.
    Introduced in notebook 03.
    """
    return sum(_nonfinite(t) for t in _tensors(value))


@dataclass(frozen=True)
class NonFinite:
    """The first module whose output held NaN/inf: its qualified name, its class, how many bad elements
    its output held out of how many, and whether its inputs were all finite (``True``: it made them).

    Introduced in notebook 03.
    """

    module: str
    kind: str
    bad: int
    numel: int
    inputs_finite: bool

    def describe(self) -> str:
        """Say in one line where the first non-finite value appeared. Introduced in notebook 03."""
        if self.inputs_finite:
            text = _("first non-finite output: {module} ({kind}), {bad} of {numel} elements; its inputs were finite: "
                     "it produced them")
        else:
            text = _("first non-finite output: {module} ({kind}), {bad} of {numel} elements; its inputs were already "
                     "non-finite: look at the code that runs before it")
        return text.format(module=self.module, kind=self.kind, bad=self.bad, numel=self.numel)


def _numel(value: Any) -> int:
    return sum(t.numel() for t in _tensors(value))


def first_nonfinite(model: nn.Module, fn: Callable[[], Any]) -> NonFinite | None:
    """Run ``fn()`` with a forward hook on every submodule of ``model``; return the first module whose
    output held a NaN or inf, or ``None`` if every output was finite.

    Hooks fire when a module's ``forward`` returns, so children report before their parent and the first
    report is the innermost, earliest module. The hooks are removed afterwards, also when ``fn`` raises.
    Introduced in notebook 03.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    found: list[NonFinite] = []

    def hook_for(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, inputs: Any, output: Any) -> None:
            if not found:
                bad = nonfinite_count(output)
                if bad:
                    found.append(NonFinite(name or "(model)", type(module).__name__, bad, _numel(output),
                                           nonfinite_count(inputs) == 0))
        return hook

    handles = [m.register_forward_hook(hook_for(name)) for name, m in model.named_modules()]
    try:
        fn()
    finally:
        for h in handles:
            h.remove()
    return found[0] if found else None


@dataclass(frozen=True)
class BackwardAnomaly:
    """What anomaly mode reported: the backward function that returned NaN, and the forward source line
    (``file:line: code``) that created the node, when the traceback names one.

    Introduced in notebook 03.
    """

    function: str
    forward_line: str | None
    message: str


_TORCH_DIR = os.path.dirname(torch.__file__)
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in [^\n]*\n\s*(\S[^\n]*)')


def backward_anomaly(loss_fn: Callable[[], torch.Tensor], source_hint: str | None = None) -> BackwardAnomaly | None:
    """Run ``loss_fn()`` and its ``backward()`` under ``torch.autograd.detect_anomaly()``; return what it caught.

    Returns ``None`` when backward finishes with finite gradients. Otherwise anomaly mode raises at the
    first backward function that returned NaN; this returns its name and the last frame of the forward
    traceback that anomaly mode recorded for that node (only recorded when the *forward* ran in anomaly
    mode too, hence ``loss_fn``) outside torch's own files, and whose file name contains ``source_hint``
    when one is given.
    Introduced in notebook 03.
    """
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be a callable returning the loss, got {type(loss_fn).__name__}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with torch.autograd.detect_anomaly():
                loss = loss_fn()
                if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
                    raise TypeError("loss_fn must return a tensor that requires grad")
                loss.backward()
        except RuntimeError as e:
            msg = str(e)
            m = re.search(r"Function '(\w+)' returned nan", msg)
            if m is None:
                raise
            trace = "\n".join(str(w.message) for w in caught if "Traceback of forward call" in str(w.message))
            frames = [f for f in _FRAME.findall(trace) if not f[0].startswith(_TORCH_DIR)
                      and (source_hint is None or source_hint in f[0])]
            line = f"line {frames[-1][1]}: {frames[-1][2].strip()}" if frames else None
            return BackwardAnomaly(m.group(1), line, msg.splitlines()[0])
    return None
