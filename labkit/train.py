"""One small training loop with precision policies, metrics, atomic checkpoints and exact resume.

A *policy* says how a step computes and what it stores. The policies live in :mod:`labkit.precision` (one
table, one meaning per name); :data:`POLICIES` here are the six that :func:`train` runs:

============  =====================  ==============  ===========  ===========================================
name          autocast dtype         weights stored  GradScaler   what it shows
============  =====================  ==============  ===========  ===========================================
fp32          none                   fp32            no           the reference
fp16          fp16                   fp32            yes          the AMP recipe: autocast + loss scaling
fp16-noscale  fp16                   fp32            no           small gradients underflow to zero
bf16          bf16                   fp32            no           bf16 has fp32's range: no scaler needed
fp16-pure     none (model in fp16)   fp16            no           no fp32 master copy: lost/broken updates
bf16-pure     none (model in bf16)   bf16            no           no fp32 master copy: lost updates
============  =====================  ==============  ===========  ===========================================

Each step is :func:`labkit.precision.backward` then :func:`labkit.precision.update`: the AMP step, written once.

:func:`train` runs ``steps`` optimizer steps of ``model`` on ``batches(step)`` and returns a
:class:`TrainResult` with per-step loss, gradient norm, loss scale, skipped flags and step times, plus a
peak-memory figure (CUDA's allocator peak on a GPU; on other devices a measured tensor-byte count, and
``memory_source`` says which). With ``checkpoint_dir`` it saves model, optimizer, scaler, RNG state and
the history every ``checkpoint_every`` steps (temp file + ``os.replace``, so a crash never leaves a torn
file); ``resume=True`` continues from the last checkpoint exactly where the interrupted run left off::

    from labkit import data, models, train
    task = data.make_token_task("reverse")
    batches = data.Batches(task.inputs, task.targets, batch_size=64, seed=0)
    model = models.TinyGPT(vocab_size=task.vocab_size, seq_len=task.seq_len, seed=0)
    result = train.train(model, batches, policy="fp16", steps=60, lr=3e-3, device="cpu")
    result.loss[-1], result.n_skipped, result.scale[-1]

Introduced in notebook 04.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import re
import tempfile
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from labkit import device as dev_gate
from labkit import precision
from labkit._validate import as_float, check_dense, safe_repr
from labkit.i18n import gettext as _
from labkit.precision import Policy, grad_norm

__all__ = [
    "AUTOCAST_OPS",
    "CHECKPOINT_FORMAT",
    "CHECKPOINT_NAME",
    "CUDA_AUTOCAST_REFERENCE",
    "CheckpointError",
    "POLICIES",
    "Policy",
    "TrainResult",
    "autocast_op_dtypes",
    "default_loss",
    "get_policy",
    "grad_norm",
    "load_checkpoint",
    "make_optimizer",
    "save_checkpoint",
    "train",
]

#: File name of the latest checkpoint inside ``checkpoint_dir``.
CHECKPOINT_NAME = "last.pt"


#: The policies :func:`train` runs, by name: :data:`labkit.precision.POLICIES` without the ``-master`` layouts
#: (16-bit weights + an fp32 master copy, which DeepSpeed implements; notebook 06 measures them).
POLICIES: dict[str, Policy] = {n: p for n, p in precision.POLICIES.items() if not p.master}


def get_policy(policy: str | Policy) -> Policy:
    """Return the :class:`~labkit.precision.Policy` for a name :func:`train` runs (a Policy passes through).

    Raises ``ValueError`` for an unknown name or a ``-master`` policy. Introduced in notebook 04.
    """
    pol = precision.get_policy(policy)
    if pol.master:
        raise ValueError(f"train() runs {list(POLICIES)}; {safe_repr(pol.name)} keeps an fp32 master copy of 16-bit "
                         "weights (DeepSpeed's layout: see labkit.memory.setup_training and notebook 10)")
    return pol


def _op_inputs(dev: torch.device, low: bool, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    a = torch.randn(4, 8, generator=g).to(dev)
    return {"a": a.to(dtype) if low else a, "w": torch.randn(8, 8, generator=g).to(dev),
            "t": torch.randint(8, (4,), generator=g).to(dev)}


#: Ops measured by :func:`autocast_op_dtypes`: name -> (feeds low-precision input?, function of inputs).
#: Matmul-like ops get fp32 inputs (autocast casts them down); the others get the autocast dtype, as
#: they do in a network where they follow a matmul.
AUTOCAST_OPS: dict[str, tuple[bool, Callable[[dict[str, torch.Tensor]], torch.Tensor]]] = {
    "matmul": (False, lambda d: d["a"] @ d["w"]),
    "linear": (False, lambda d: F.linear(d["a"], d["w"])),
    "bmm": (False, lambda d: torch.bmm(d["a"][None], d["w"][None])),
    "relu": (True, lambda d: torch.relu(d["a"])),
    "gelu": (True, lambda d: F.gelu(d["a"])),
    "add": (True, lambda d: d["a"] + d["a"]),
    "mean": (True, lambda d: d["a"].mean()),
    "sum": (True, lambda d: d["a"].sum()),
    "exp": (True, lambda d: torch.exp(d["a"])),
    "pow": (True, lambda d: torch.pow(d["a"], 2)),
    "softmax": (True, lambda d: torch.softmax(d["a"], -1)),
    "log_softmax": (True, lambda d: torch.log_softmax(d["a"], -1)),
    "layer_norm": (True, lambda d: F.layer_norm(d["a"], (8,))),
    "cross_entropy": (True, lambda d: F.cross_entropy(d["a"], d["t"])),
    "mse_loss": (True, lambda d: F.mse_loss(d["a"], d["a"] * 0.5)),
}

#: What CUDA autocast does with those ops, from the PyTorch AMP docs ("autocast op reference"):
#: "low" = runs in the autocast dtype (fp16/bf16), "fp32" = autocast runs it in float32, "input" = not in
#: any list, runs in its input's dtype. Reference data for machines without a GPU.
CUDA_AUTOCAST_REFERENCE: dict[str, str] = {
    "matmul": "low", "linear": "low", "bmm": "low",
    "relu": "input", "gelu": "input", "add": "input", "mean": "input",
    "sum": "fp32", "exp": "fp32", "pow": "fp32", "softmax": "fp32", "log_softmax": "fp32",
    "layer_norm": "fp32", "cross_entropy": "fp32", "mse_loss": "fp32",
}


def autocast_op_dtypes(
    device: torch.device | str | None = None, dtype: torch.dtype = torch.bfloat16
) -> dict[str, tuple[torch.dtype, torch.dtype]]:
    """Run each op of :data:`AUTOCAST_OPS` under ``torch.autocast(device, dtype)``: ``{op: (input, output dtype)}``.

    This is a measurement on ``device``, not a lookup: CPU and CUDA autocast keep different op lists.
    Introduced in notebook 04.
    """
    if dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"autocast dtype must be torch.float16 or torch.bfloat16, got {safe_repr(dtype)}")
    dev = dev_gate.resolve(device)
    out: dict[str, tuple[torch.dtype, torch.dtype]] = {}
    for name, (low, fn) in AUTOCAST_OPS.items():
        inputs = _op_inputs(dev, low, dtype)
        with torch.no_grad(), torch.autocast(device_type=dev.type, dtype=dtype):
            out[name] = (inputs["a"].dtype, fn(inputs).dtype)
    return out


def default_loss(model: nn.Module, batch: Sequence[torch.Tensor]) -> torch.Tensor:
    """Compute the loss for a ``(x, y)`` batch: next-token CE, class CE or MSE, chosen from the shapes.

    3-D outputs with int64 targets use ``labkit.models.lm_loss`` (ignoring ``-100``), 2-D outputs with
    int64 targets use cross-entropy, float targets use MSE (computed in fp32). Introduced in notebook 04.
    """
    if len(batch) != 2:
        raise ValueError(f"default_loss expects an (x, y) batch, got {len(batch)} tensors; pass loss_fn")
    x, y = batch
    check_dense("the batch's y", y)
    if isinstance(x, torch.Tensor):
        check_dense("the batch's x", x)
    out = model(x)
    if y.dtype == torch.long:
        if out.dim() == 3:
            from labkit.models import lm_loss

            return lm_loss(out, y)
        return F.cross_entropy(out, y)
    return F.mse_loss(out.float(), y.float())


def make_optimizer(
    params: Any, name: str = "adamw", lr: float = 1e-3, weight_decay: float = 0.0, momentum: float = 0.9,
    eps: float = 1e-8,
) -> torch.optim.Optimizer:
    """Build an optimizer by name: ``"adamw"``, ``"adam"`` or ``"sgd"`` (with ``momentum``).

    Introduced in notebook 04.
    """
    for what, v in (("lr", lr), ("weight_decay", weight_decay), ("momentum", momentum), ("eps", eps)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(as_float(what, v)) or v < 0:
            raise ValueError(f"{what} must be a finite number >= 0, got {safe_repr(v)}")
    if not lr > 0:
        raise ValueError(f"lr must be a positive number, got {safe_repr(lr)}")
    params = list(params)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, eps=eps)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay, eps=eps)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer {safe_repr(name)}; choose 'adamw', 'adam' or 'sgd', or pass a callable")


#: The per-step lists of a :class:`TrainResult`: what its ``history()`` holds, and all that a checkpoint's
#: history may set on resume (other keys are ignored, so a file can never set ``model``, ``policy``...).
_HISTORY_KEYS = ("steps", "loss", "grad_norm", "scale", "skipped", "step_time")


@dataclass
class TrainResult:
    """What :func:`train` measured, one list entry per completed step (``steps[i]`` is the step number).

    ``loss`` is the unscaled, unweighted loss, ``grad_norm`` the global norm of the back-propagated
    gradients after unscaling and before clipping (``loss_weight`` included), ``scale`` the loss scale used for that step (1.0 without a scaler), ``skipped`` whether the
    optimizer step was skipped because the scaler found inf/NaN gradients, ``step_time`` seconds per step
    (device synchronised). ``peak_memory`` is bytes, and ``memory_source`` says what was measured: on
    CUDA the allocator's peak during the run above what was allocated before it; on other devices the
    bytes of weights, gradients, optimizer state and tensors saved for backward, counted once.
    After a resume the lists hold the whole run, the part before the checkpoint included.

    Introduced in notebook 04.
    """

    policy: str
    device: str
    steps: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    grad_norm: list[float] = field(default_factory=list)
    scale: list[float] = field(default_factory=list)
    skipped: list[bool] = field(default_factory=list)
    step_time: list[float] = field(default_factory=list)
    peak_memory: int | None = None
    memory_source: str = ""
    resumed_from: int | None = None
    checkpoint: str | None = None
    model: nn.Module | None = field(default=None, repr=False)
    optimizer: torch.optim.Optimizer | None = field(default=None, repr=False)
    scaler: torch.amp.GradScaler | None = field(default=None, repr=False)

    @property
    def n_skipped(self) -> int:
        """How many optimizer steps the scaler skipped. Introduced in notebook 04."""
        return int(sum(self.skipped))

    def final_loss(self, last: int = 5) -> float:
        """Return the mean loss over the last ``last`` steps (NaN if any of them is NaN). Introduced in notebook 04."""
        if not self.loss:
            raise ValueError("no steps were run")
        tail = self.loss[-last:]
        return float(sum(tail) / len(tail))

    def median_step_time(self, skip_first: int = 2) -> float:
        """Return the median step time in seconds, ignoring the first ``skip_first`` (warm-up) steps.

        Introduced in notebook 04.
        """
        times = sorted(self.step_time[skip_first:] or self.step_time)
        if not times:
            raise ValueError("no steps were run")
        mid = len(times) // 2
        return times[mid] if len(times) % 2 else 0.5 * (times[mid - 1] + times[mid])

    def history(self) -> dict[str, list]:
        """Return the per-step lists as a plain dict (what a checkpoint stores). Introduced in notebook 04."""
        return {k: list(getattr(self, k)) for k in _HISTORY_KEYS}

    def summary(self) -> dict[str, Any]:
        """Return final loss, skipped steps, median step time and peak memory as a dict. Introduced in notebook 04."""
        return {
            "policy": self.policy,
            "final_loss": self.final_loss(),
            "skipped": self.n_skipped,
            "step_time_s": self.median_step_time(),
            "peak_memory_bytes": self.peak_memory,
            "memory_source": self.memory_source,
        }


class CheckpointError(ValueError):
    """A checkpoint file cannot be used: empty, truncated, corrupted, not a labkit checkpoint, or unsafe.

    ``path`` is the file and ``reason`` what is wrong with it; the message names both and says what to do.
    :func:`load_checkpoint` raises it for every bad file, never ``EOFError``/``UnpicklingError``/``KeyError``.

    Introduced in notebook 04.
    """

    def __init__(self, path: str | os.PathLike, reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        shown = reason if isinstance(reason, str) else safe_repr(reason)
        super().__init__(
            f"checkpoint {self.path} cannot be used: {shown}. Delete it (or move it aside), then resume "
            "from an earlier checkpoint or start fresh without resume.")


#: Version of the checkpoint file layout written by :func:`save_checkpoint`.
CHECKPOINT_FORMAT = 1
_CKPT_MAGIC = b"LABKIT-CHECKPOINT "
_CKPT_HEADER_RE = re.compile(rb"LABKIT-CHECKPOINT v(\d{1,4}) sha256=([0-9a-f]{64}) bytes=(\d{1,15})\n")
_CKPT_HEADER_MAX = 128
_CKPT_KEYS = ("step", "policy", "model", "optimizer", "scaler", "rng_cpu", "rng_device", "history")
# what torch.load(weights_only=True) rebuilds; save_checkpoint refuses anything else up front
_PLAIN_LEAVES = (type(None), bool, int, float, complex, str, bytes, bytearray, torch.dtype, torch.device,
                 torch.Size)
_PLAIN_CONTAINERS = (dict, OrderedDict, Counter, list, tuple, set)


def _check_loadable(obj: Any, where: str) -> None:
    """Raise TypeError if ``obj`` holds anything ``torch.load(weights_only=True)`` would refuse."""
    if type(obj) in (torch.Tensor, nn.Parameter):
        return
    if isinstance(obj, _PLAIN_LEAVES) and type(obj) in _PLAIN_LEAVES:
        return
    if type(obj) in _PLAIN_CONTAINERS:
        items = obj.items() if isinstance(obj, dict) else enumerate(obj)
        for k, v in items:
            if isinstance(obj, dict):
                _check_loadable(k, f"{where} (a key)")
            _check_loadable(v, f"{where}[{k!r}]")
        return
    raise TypeError(f"cannot checkpoint {where}: it is a {type(obj).__module__}.{type(obj).__qualname__}, "
                    "and a checkpoint holds only tensors and plain values (numbers, strings, lists, dicts), "
                    "so that it loads with torch.load(weights_only=True)")


def _plain_history(history: Any) -> dict[str, list]:
    """Return ``history`` as ``{str: [int | float | bool | None, ...]}`` (numpy/0-d tensor scalars converted)."""
    if history is None:
        return {}
    if not isinstance(history, dict):
        raise TypeError(f"history must be a dict of lists, got {type(history).__name__}")
    out: dict[str, list] = {}
    for key, values in history.items():
        if not isinstance(key, str):
            raise TypeError(f"history keys must be str, got {safe_repr(key)}")
        if not isinstance(values, (list, tuple)):
            raise TypeError(f"history[{safe_repr(key)}] must be a list, got {type(values).__name__}")
        row: list = []
        for v in values:
            if v is not None and not isinstance(v, (bool, int, float)):
                if isinstance(v, torch.Tensor) and v.numel() == 1:
                    v = v.item()
                elif type(v).__module__ == "numpy" and hasattr(v, "item") and getattr(v, "ndim", 1) == 0:
                    v = v.item()
                else:
                    raise TypeError(f"history[{safe_repr(key)}] must hold numbers, bools or None, got {safe_repr(v)}")
            row.append(v)
        out[key] = row
    return out


def _atomic_save(data: bytes, path: Path) -> None:
    """Write ``data`` to ``path`` atomically: a temp file in the same folder, fsync, ``os.replace``, fsync."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    try:  # make the rename itself durable (best effort: some file systems refuse to fsync a folder)
        dir_fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def save_checkpoint(
    path: str | os.PathLike,
    *,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
    policy: str,
    history: dict[str, list] | None = None,
    device: torch.device | str | None = None,
) -> Path:
    """Save model, optimizer, scaler, RNG states and history to ``path`` atomically (temp file + rename).

    ``step`` is the number of completed steps. The file is one header line
    ``LABKIT-CHECKPOINT v1 sha256=<hex> bytes=<n>`` followed by the ``torch.save`` payload it describes, so
    :func:`load_checkpoint` detects a truncated or altered file. Everything saved is a tensor or a plain
    value, so the payload loads with ``torch.load(weights_only=True)``; anything else raises ``TypeError``
    here, before a file is touched.

    Introduced in notebook 04.
    """
    path = Path(path)
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0 (the completed steps), got {safe_repr(step)}")
    if not isinstance(policy, str) or not policy:
        raise TypeError(f"policy must be a non-empty str such as 'fp16', got {safe_repr(policy)}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if scaler is not None and not isinstance(scaler, torch.amp.GradScaler):
        raise TypeError(f"scaler must be a torch.amp.GradScaler or None, got {type(scaler).__name__}")
    state = {
        "step": step,
        "policy": policy,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict() if scaler is not None else None,
        "rng_cpu": torch.random.get_rng_state(),
        "rng_device": dev_gate.get_rng_state(device) if device is not None else None,
        "history": _plain_history(history),
    }
    for key in ("model", "optimizer", "scaler", "rng_device"):
        _check_loadable(state[key], key)
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    header = (f"LABKIT-CHECKPOINT v{CHECKPOINT_FORMAT} sha256={hashlib.sha256(payload).hexdigest()} "
              f"bytes={len(payload)}\n").encode("ascii")
    _atomic_save(header + payload, path)
    return path


def _checkpoint_payload(path: Path) -> bytes:
    """Check a checkpoint file's header, length and sha256; return the payload or raise CheckpointError.

    The header is checked before the rest is read, so a large file that is no checkpoint is not read whole.
    """
    with open(path, "rb") as fh:
        head = fh.read(_CKPT_HEADER_MAX)
        total = os.fstat(fh.fileno()).st_size
        if not head:
            raise CheckpointError(path, "the file is empty (0 bytes)")
        if not head.startswith(_CKPT_MAGIC):
            raise CheckpointError(path, "it is not a labkit checkpoint: it does not start with the "
                                        "'LABKIT-CHECKPOINT' header that save_checkpoint writes (random bytes, "
                                        "a file from another tool, or one from a labkit without checksums)")
        m = _CKPT_HEADER_RE.match(head)
        if m is None:
            raise CheckpointError(path, f"its header line is damaged or cut short ({head[:80]!r})")
        version, digest, size = int(m.group(1)), m.group(2).decode("ascii"), int(m.group(3))
        if version != CHECKPOINT_FORMAT:
            raise CheckpointError(path, f"it is in checkpoint format v{version}, and this labkit reads "
                                        f"v{CHECKPOINT_FORMAT}")
        held = total - m.end()
        if held < size:
            raise CheckpointError(path, f"it is truncated: the header promises {size} payload bytes and the "
                                        f"file holds {held} (an interrupted copy, or a full disk)")
        if held > size:
            raise CheckpointError(path, f"it has {held - size} unexpected byte(s) after the payload")
        fh.seek(m.end())
        payload = fh.read(size + 1)
    if len(payload) != size:  # the file changed while it was read
        raise CheckpointError(path, f"it holds {len(payload)} payload bytes, not the {size} its header says")
    got = hashlib.sha256(payload).hexdigest()
    if got != digest:
        raise CheckpointError(path, f"its sha256 checksum does not match (header {digest[:16]}…, contents "
                                    f"{got[:16]}…): the file was altered or corrupted after it was written")
    return payload


def _cpu_rng_ok(value: Any) -> bool:
    """Whether ``value`` is a state torch's CPU generator can take: a 1-D uint8 CPU tensor of exactly the
    length ``torch.random.get_rng_state()`` has (5056 bytes, the Mersenne Twister's state)."""
    return (type(value) is torch.Tensor and value.dtype == torch.uint8 and value.dim() == 1
            and value.device.type == "cpu" and value.numel() == torch.random.get_rng_state().numel())


def _type_problem(state: Any) -> str | None:
    """Return what is wrong with a loaded checkpoint's keys or value types, or None if nothing is."""
    if not isinstance(state, dict):
        return f"it holds a {type(state).__name__}, not a dict of checkpoint entries"
    missing = [k for k in _CKPT_KEYS if k not in state]
    if missing:
        return f"it lacks the key(s) {missing}"
    checks = {
        "step": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
        "policy": lambda v: isinstance(v, str) and bool(v),
        "model": lambda v: isinstance(v, dict)
        and all(isinstance(k, str) and isinstance(t, torch.Tensor) for k, t in v.items()),
        "optimizer": lambda v: isinstance(v, dict) and isinstance(v.get("state"), dict)
        and isinstance(v.get("param_groups"), list) and all(isinstance(g, dict) for g in v["param_groups"]),
        "scaler": lambda v: v is None or isinstance(v, dict),
        "rng_cpu": _cpu_rng_ok,
        "rng_device": lambda v: v is None or (isinstance(v, torch.Tensor) and v.dtype == torch.uint8
                                              and v.dim() == 1 and v.numel() > 0),
        "history": lambda v: isinstance(v, dict) and all(
            isinstance(k, str) and isinstance(row, list)
            and all(x is None or isinstance(x, (bool, int, float)) for x in row) for k, row in v.items()),
    }
    for key, ok in checks.items():
        if not ok(state[key]):
            return f"its {key!r} entry has the wrong type or value ({type(state[key]).__name__})"
    return None


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint` onto the CPU, safely, and check it.

    The header's length and sha256 are verified before anything is unpickled, the payload is read with
    ``torch.load(weights_only=True)`` (a file that would run code is refused, not run), and the keys
    and value types are checked. Every bad file (empty, truncated, corrupted, altered, not a labkit
    checkpoint, unsafe, or with missing or mistyped entries) raises :class:`CheckpointError` naming the
    file; a missing file raises ``FileNotFoundError``.

    Introduced in notebook 04.
    """
    if isinstance(path, bool) or not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    payload = _checkpoint_payload(path)
    try:
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as exc:  # UnpicklingError, RuntimeError (zip), EOFError …: one error for all
        # name what was refused, but not torch's advice to retry with weights_only=False (so: from None)
        detail = next((ln.strip() for ln in str(exc).splitlines() if "GLOBAL" in ln or "Unsupported" in ln),
                      str(exc).strip().splitlines()[0][:200] if str(exc).strip() else "")
        raise CheckpointError(path, "torch.load(weights_only=True) refused its payload ("
                                    f"{type(exc).__name__}{': ' + detail if detail else ''}); a labkit "
                                    "checkpoint holds only tensors and plain values, so this file was "
                                    "crafted or written by something else, and nothing in it was run") from None
    problem = _type_problem(state)
    if problem is not None:
        raise CheckpointError(path, problem)
    return state


def _restore_history(result: TrainResult, history: dict[str, list]) -> None:
    """Set ``result``'s per-step lists from a checkpoint's ``history``: only those named in ``_HISTORY_KEYS``;
    any other key (``model``, ``policy``, ``device``...) is ignored, never set."""
    for key in _HISTORY_KEYS:
        if key in history:
            setattr(result, key, list(history[key]))


class _SavedTensorBytes:
    """Count the bytes of distinct tensors autograd saves for backward (activations), excluding ``skip``."""

    def __init__(self, skip: set[int]) -> None:
        self.skip = skip
        self.seen: set[int] = set()
        self.bytes = 0

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        try:
            ptr = t.untyped_storage().data_ptr()
            nbytes = t.untyped_storage().nbytes()
        except (RuntimeError, NotImplementedError):
            return t
        if ptr not in self.skip and ptr not in self.seen:
            self.seen.add(ptr)
            self.bytes += nbytes
        return t


def _state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    from labkit.memory import tensor_bytes  # distinct storages: views and shared tensors count once

    params = list(model.parameters())
    state = (v for st in optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor))
    return tensor_bytes([*params, *(p.grad for p in params if p.grad is not None), *state, *model.buffers()])


def train(
    model: nn.Module,
    batches: Callable[[int], Sequence[torch.Tensor]],
    *,
    policy: str | Policy = "fp32",
    steps: int = 100,
    lr: float = 3e-3,
    optimizer: str | Callable[[Any], torch.optim.Optimizer] = "adamw",
    weight_decay: float = 0.0,
    adam_eps: float = 1e-8,
    loss_fn: Callable[[nn.Module, Sequence[torch.Tensor]], torch.Tensor] | None = None,
    clip_grad_norm: float | None = None,
    loss_weight: float = 1.0,
    scaler_kwargs: dict[str, Any] | None = None,
    device: torch.device | str | None = None,
    seed: int = 0,
    checkpoint_dir: str | os.PathLike | None = None,
    checkpoint_every: int = 0,
    resume: bool = False,
    progress: bool = True,
    desc: str | None = None,
    callback: Callable[[int, dict[str, Any]], None] | None = None,
) -> TrainResult:
    """Train ``model`` for ``steps`` optimizer steps under a precision ``policy`` and return the metrics.

    - ``batches(step)`` returns the batch for a step (a tuple of tensors, e.g. ``labkit.data.Batches``);
      ``loss_fn(model, batch)`` returns the scalar loss (default :func:`default_loss`).
    - The model is moved to ``device`` (default: ``labkit.device.pick_device()``) and, for the ``-pure``
      policies, converted in place to fp16/bf16 (float inputs are cast to match).
    - ``optimizer`` is ``"adamw"``/``"adam"``/``"sgd"`` or a callable ``params -> Optimizer``.
    - ``loss_weight`` multiplies the loss before backward (the recorded loss is unweighted). A weight
      of ``2**-10`` gives every gradient the size it would have if the mean ran over 1024 times more
      tokens, as in a real LLM step of ~10^5-10^6 tokens: the regime where fp16 gradients underflow.
    - ``clip_grad_norm`` clips the global gradient norm *after* ``scaler.unscale_``, so the threshold
      applies to the true gradients, not to the scaled ones. ``scaler_kwargs`` go to
      ``torch.amp.GradScaler`` (``init_scale``, ``growth_interval`` …).
    - The global torch RNG is seeded with ``seed`` at the start of a fresh run; on CPU two runs with the
      same arguments give bitwise identical results.
    - With ``checkpoint_dir`` and ``checkpoint_every > 0`` a checkpoint is written atomically every
      ``checkpoint_every`` steps and after the last step. ``resume=True`` loads
      ``checkpoint_dir/last.pt`` if it exists (model, optimizer, scaler, RNG, history) and runs the
      remaining steps up to ``steps``; the result then equals an uninterrupted run. The history sets only
      the per-step lists (``steps``, ``loss``, ``grad_norm``, ``scale``, ``skipped``, ``step_time``).
    - ``progress`` shows a ``tqdm.auto`` bar; ``callback(step, record)`` is called after every step.

    Introduced in notebook 04.
    """
    pol = get_policy(policy)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be an int >= 0, got {safe_repr(steps)}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not callable(batches):
        raise TypeError("batches must be callable as batches(step) -> tuple of tensors")
    if clip_grad_norm is not None and not clip_grad_norm > 0:
        raise ValueError(f"clip_grad_norm must be positive or None, got {safe_repr(clip_grad_norm)}")
    if not (isinstance(loss_weight, (int, float)) and loss_weight > 0):
        raise ValueError(f"loss_weight must be a positive number, got {safe_repr(loss_weight)}")
    if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int) or checkpoint_every < 0:
        raise ValueError(f"checkpoint_every must be an int >= 0, got {safe_repr(checkpoint_every)}")
    if (checkpoint_every or resume) and checkpoint_dir is None:
        raise ValueError("checkpoint_every/resume need a checkpoint_dir")
    dev = dev_gate.pick_device() if device is None else torch.device(device)
    for dt in (pol.autocast_dtype, pol.param_dtype):
        if dt is not None and dt != torch.float32 and not dev_gate.computes(dt, dev):
            raise ValueError(f"policy {safe_repr(pol.name)} needs {dt} compute, which does not work on {dev}")
    loss_fn = default_loss if loss_fn is None else loss_fn

    cuda = dev_gate.is_cuda(dev)
    if cuda:  # the peak is measured above what was allocated before this run (earlier runs' tensors)
        dev_gate.synchronize(dev)
        dev_gate.reset_peak_memory_stats(dev)
        mem_before = dev_gate.memory_allocated(dev) or 0
    model.to(device=dev, dtype=pol.param_dtype)
    params = [p for p in model.parameters() if p.requires_grad]
    if callable(optimizer) and not isinstance(optimizer, str):
        opt = optimizer(params)
    else:
        opt = make_optimizer(params, optimizer, lr=lr, weight_decay=weight_decay, eps=adam_eps)
    scaler = torch.amp.GradScaler(dev.type, **(scaler_kwargs or {})) if pol.scaler else None

    result = TrainResult(policy=pol.name, device=str(dev), model=model, optimizer=opt, scaler=scaler)
    start = 0
    ckpt_path = Path(checkpoint_dir) / CHECKPOINT_NAME if checkpoint_dir is not None else None
    torch.manual_seed(seed)
    if resume and ckpt_path is not None and ckpt_path.is_file():
        state = load_checkpoint(ckpt_path)
        if state["policy"] != pol.name:
            raise ValueError(f"checkpoint {ckpt_path} was written by policy {state['policy']!r}, not {safe_repr(pol.name)}")
        if state["step"] > steps:
            raise ValueError(f"checkpoint is at step {state['step']}, beyond steps={steps}")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        if scaler is not None:
            scaler.load_state_dict(state["scaler"])
        torch.random.set_rng_state(state["rng_cpu"])
        if state.get("rng_device") is not None:
            dev_gate.set_rng_state(state["rng_device"], dev)
        _restore_history(result, state["history"])
        start = result.resumed_from = int(state["step"])

    activation_bytes = 0
    param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}

    from tqdm.auto import tqdm

    bar = tqdm(range(start, steps), desc=desc or pol.name, disable=not progress, leave=False)
    for step in bar:
        batch = tuple(
            t.to(dev, dtype=pol.param_dtype) if t.is_floating_point() else t.to(dev) for t in batches(step)
        )
        dev_gate.synchronize(dev)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        counter = _SavedTensorBytes(param_ptrs) if (not cuda and step == start) else None
        with precision.autocast(pol, dev.type):
            if counter is not None:
                with torch.autograd.graph.saved_tensors_hooks(counter.pack, lambda t: t):
                    loss = loss_fn(model, batch)
            else:
                loss = loss_fn(model, batch)
        precision.backward(loss, scaler, weight=loss_weight)
        info = precision.update(opt, scaler, params, clip_grad_norm=clip_grad_norm)
        gnorm, skipped, scale = info.grad_norm, info.skipped, info.scale
        dev_gate.synchronize(dev)
        dt = time.perf_counter() - t0
        if counter is not None:
            activation_bytes = counter.bytes
        loss_value = float(loss.detach().float())
        record = {"step": step, "loss": loss_value, "grad_norm": gnorm, "scale": scale, "skipped": skipped,
                  "step_time": dt}
        for k, key in (("steps", "step"), ("loss", "loss"), ("grad_norm", "grad_norm"), ("scale", "scale"),
                       ("skipped", "skipped"), ("step_time", "step_time")):
            getattr(result, k).append(record[key])
        if progress:
            bar.set_postfix(loss=f"{loss_value:.4f}", refresh=False)
        if callback is not None:
            callback(step, record)
        done = step + 1
        if ckpt_path is not None and checkpoint_every and (done % checkpoint_every == 0 or done == steps):
            save_checkpoint(ckpt_path, step=done, model=model, optimizer=opt, scaler=scaler, policy=pol.name,
                            history=result.history(), device=dev if cuda else None)
            result.checkpoint = str(ckpt_path)
    bar.close()

    if cuda:
        result.peak_memory = (dev_gate.max_memory_allocated(dev) or 0) - mem_before
        result.memory_source = _("torch.cuda.max_memory_allocated during the run, minus what was allocated "
                                 "before it (a model already on the GPU counts as 'before')")
    elif start < steps:
        result.peak_memory = _state_bytes(model, opt) + activation_bytes
        result.memory_source = _("tensor bytes counted on the CPU: weights + gradients + optimizer state + "
                                 "tensors saved for backward (not an allocator peak; temporaries not counted)")
    else:
        result.memory_source = _("not measured (no steps run)")
    return result
