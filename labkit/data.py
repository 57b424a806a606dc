"""Seeded synthetic data sets: no downloads, the same tensors on every machine.

Three tasks, all generated on the CPU from a seed:

- :func:`make_regression` — a smooth teacher function of ``in_features`` inputs (for the MLP).
- :func:`make_classification` — labelled Gaussian-ish points from a random linear teacher.
- :func:`make_token_task` — short integer sequences (``reverse``, ``copy``, ``modsum``, ``bigram``)
  for the tiny GPT; a next-token task with the prompt masked out of the loss (``-100``).

:class:`Batches` hands out mini-batches as a pure function of the step number (and, for data-parallel
runs, of ``rank``/``world_size``), so a resumed run sees exactly the batches an uninterrupted run sees::

    task = make_token_task("reverse", n=4096, n_digits=6, vocab_size=12, seed=0)
    batches = Batches(task.inputs, task.targets, batch_size=64, seed=0)
    x, y = batches(step)                      # the same (x, y) for the same step, always
    x0, y0 = batches(step, rank=0, world_size=2)   # rank 0's half of that same global batch

The data path (notebook 14): :func:`pack_records` writes many small records into one file and returns an index
of (offset, length), the way packed formats (WebDataset shards, TFRecord, HDF5, LMDB) avoid one file per sample;
:func:`count_opens` counts the files a block of code opens, from Python's own audit events.

Introduced in notebook 03.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from labkit._validate import as_float, safe_repr

__all__ = [
    "IGNORE_INDEX",
    "TOKEN_TASKS",
    "Batches",
    "OpenCount",
    "TokenTask",
    "count_opens",
    "make_classification",
    "make_regression",
    "make_token_task",
    "pack_records",
]

#: Target value that ``torch.nn.functional.cross_entropy`` ignores (the prompt part of a sequence).
IGNORE_INDEX = -100

#: The token tasks :func:`make_token_task` knows, with what the model must learn.
TOKEN_TASKS: dict[str, str] = {
    "reverse": "after SEP, write the prompt digits in reverse order",
    "copy": "after SEP, write the prompt digits again in the same order",
    "modsum": "after SEP, write the running sums of the prompt digits modulo (vocab_size - 1)",
    "bigram": "every next token is a fixed random function of the current one (no SEP, no attention)",
}


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _generator(seed: int) -> torch.Generator:
    _check_int("seed", seed, 0)
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    return g


def make_regression(
    n: int = 1024,
    in_features: int = 16,
    out_features: int = 1,
    noise: float = 0.01,
    target_scale: float = 1.0,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(X, y)`` float32 tensors: ``X ~ N(0, 1)`` of shape (n, in_features), ``y`` a smooth teacher.

    The teacher is ``y = target_scale * (tanh(X @ W1) @ W2) + noise * N(0, 1)`` with fixed random
    ``W1``/``W2`` drawn from the same seed, so an MLP can fit it well. ``target_scale`` shrinks or grows
    the targets (and with them the loss and the gradients), which notebook 03 uses to push gradients
    below fp16's range.

    Introduced in notebook 03.
    """
    _check_int("n", n, 1)
    _check_int("in_features", in_features, 1)
    _check_int("out_features", out_features, 1)
    for name, v in (("noise", noise), ("target_scale", target_scale)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(as_float(name, v)):
            raise TypeError(f"{name} must be a finite number, got {safe_repr(v)}")
    noise, target_scale = float(noise), float(target_scale)  # a 2**64 would not fit torch's int64 scalars
    if not (noise >= 0):
        raise ValueError(f"noise must be >= 0, got {noise}")
    if not (target_scale > 0):
        raise ValueError(f"target_scale must be > 0, got {target_scale}")
    g = _generator(seed)
    hidden = max(8, 2 * in_features)
    w1 = torch.randn(in_features, hidden, generator=g) / in_features**0.5
    w2 = torch.randn(hidden, out_features, generator=g) / hidden**0.5
    x = torch.randn(n, in_features, generator=g)
    y = torch.tanh(x @ w1) @ w2
    y = target_scale * (y + noise * torch.randn(n, out_features, generator=g))
    return x, y


def make_classification(
    n: int = 1024,
    in_features: int = 16,
    n_classes: int = 4,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(X, y)``: float32 points of shape (n, in_features) and int64 labels in ``[0, n_classes)``.

    Labels come from a random linear teacher (``argmax(X @ W)``), so the task is learnable to high
    accuracy by the MLP; every class occurs for any reasonable ``n``.

    Introduced in notebook 03.
    """
    _check_int("n", n, 1)
    _check_int("in_features", in_features, 1)
    _check_int("n_classes", n_classes, 2)
    g = _generator(seed)
    w = torch.randn(in_features, n_classes, generator=g)
    x = torch.randn(n, in_features, generator=g)
    y = (x @ w).argmax(dim=1)
    return x, y


@dataclass(frozen=True)
class TokenTask:
    """A synthetic next-token task: ``inputs``/``targets`` are int64 tensors of shape (n, seq_len).

    ``targets[i, t]`` is the token that should follow ``inputs[i, :t+1]``, or :data:`IGNORE_INDEX` where
    the loss should not look (the prompt). ``vocab_size`` counts every token id, including ``sep``
    (``sep`` is ``None`` for the ``bigram`` task). ``n_digits`` is the prompt length.

    Introduced in notebook 04.
    """

    task: str
    inputs: torch.Tensor
    targets: torch.Tensor
    vocab_size: int
    seq_len: int
    n_digits: int
    sep: int | None

    def answer_accuracy(self, logits: torch.Tensor, targets: torch.Tensor | None = None) -> float:
        """Return the fraction of supervised positions where ``logits.argmax(-1)`` equals the target.

        Introduced in notebook 04.
        """
        t = self.targets if targets is None else targets
        if logits.shape[:-1] != t.shape:
            raise ValueError(f"logits shape {tuple(logits.shape)} does not match targets {tuple(t.shape)}")
        mask = t != IGNORE_INDEX
        return float((logits.argmax(-1)[mask] == t[mask]).float().mean())


def make_token_task(
    task: str = "reverse",
    n: int = 4096,
    n_digits: int = 6,
    vocab_size: int = 12,
    seed: int = 0,
) -> TokenTask:
    """Generate a seeded synthetic token task for the tiny GPT; see :data:`TOKEN_TASKS` for the choices.

    For ``reverse``/``copy``/``modsum`` a full sequence is ``d_1 … d_k SEP a_1 … a_k`` with
    ``k = n_digits`` digits in ``[0, vocab_size - 1)`` and ``SEP = vocab_size - 1``; the model sees the
    sequence without its last token and is scored only on the answer tokens ``a_i`` (``seq_len = 2k``).
    ``bigram`` sequences of length ``2k`` follow ``next = perm[current]`` for a fixed random permutation;
    every position is scored. A tiny GPT learns ``reverse`` with ``k = 6`` in about a hundred steps.

    Introduced in notebook 04.
    """
    if task not in TOKEN_TASKS:
        raise ValueError(f"unknown token task {safe_repr(task)}; choose one of {sorted(TOKEN_TASKS)}")
    _check_int("n", n, 1)
    _check_int("n_digits", n_digits, 1)
    _check_int("vocab_size", vocab_size, 3)
    g = _generator(seed)
    k = n_digits
    if task == "bigram":
        perm = torch.randperm(vocab_size, generator=g)
        seq = torch.empty(n, 2 * k + 1, dtype=torch.long)
        seq[:, 0] = torch.randint(vocab_size, (n,), generator=g)
        for t in range(1, 2 * k + 1):
            seq[:, t] = perm[seq[:, t - 1]]
        inputs, targets = seq[:, :-1].clone(), seq[:, 1:].clone()
        return TokenTask(task, inputs, targets, vocab_size, 2 * k, k, None)
    n_sym = vocab_size - 1
    sep = n_sym
    digits = torch.randint(n_sym, (n, k), generator=g)
    if task == "reverse":
        answer = digits.flip(1)
    elif task == "copy":
        answer = digits.clone()
    else:  # modsum
        answer = digits.cumsum(1) % n_sym
    seq = torch.cat([digits, torch.full((n, 1), sep, dtype=torch.long), answer], dim=1)
    inputs = seq[:, :-1].clone()
    targets = seq[:, 1:].clone()
    targets[:, : k - 1] = IGNORE_INDEX  # predicting the prompt (and SEP) is not the task
    targets[:, k - 1] = IGNORE_INDEX
    return TokenTask(task, inputs, targets, vocab_size, 2 * k, k, sep)


class Batches:
    """Mini-batches as a pure function of the step: ``batches(step, rank=0, world_size=1) -> tuple``.

    ``tensors`` share their first dimension (the examples). Step ``s`` draws ``batch_size`` example
    indices with a generator seeded from ``(seed, s)`` (sampling with replacement), so batches do not
    depend on what ran before: resuming at step ``s`` reproduces the uninterrupted run. With
    ``world_size > 1`` each rank gets its contiguous ``batch_size // world_size`` slice of the same
    global batch, so data-parallel ranks together see exactly the single-process batch.

    Introduced in notebook 03.
    """

    def __init__(self, *tensors: torch.Tensor, batch_size: int, seed: int = 0) -> None:
        if not tensors:
            raise ValueError("Batches needs at least one tensor")
        for t in tensors:
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"Batches takes tensors, got {type(t).__name__}")
            if t.dim() == 0:
                raise ValueError("Batches takes tensors of examples (at least 1-D), got a 0-d tensor")
        n = tensors[0].shape[0]
        if any(t.shape[0] != n for t in tensors):
            raise ValueError(f"tensors disagree on the number of examples: {[t.shape[0] for t in tensors]}")
        self.tensors = tensors
        self.n = int(n)
        self.batch_size = _check_int("batch_size", batch_size, 1)
        self.seed = _check_int("seed", seed, 0)

    def indices(self, step: int) -> torch.Tensor:
        """Return the global batch's example indices for ``step``. Introduced in notebook 03."""
        _check_int("step", step, 0)
        g = _generator((self.seed * 1_000_003 + step) % (2**63 - 1))
        return torch.randint(self.n, (self.batch_size,), generator=g)

    def __call__(self, step: int, rank: int = 0, world_size: int = 1) -> tuple[torch.Tensor, ...]:
        _check_int("world_size", world_size, 1)
        _check_int("rank", rank, 0)
        if rank >= world_size:
            raise ValueError(f"rank must be < world_size ({world_size}), got {rank}")
        if self.batch_size % world_size:
            raise ValueError(f"batch_size {self.batch_size} is not divisible by world_size {world_size}")
        idx = self.indices(step)
        per = self.batch_size // world_size
        idx = idx[rank * per : (rank + 1) * per]
        return tuple(t[idx] for t in self.tensors)

    def __repr__(self) -> str:
        return f"Batches(n={self.n}, batch_size={self.batch_size}, seed={self.seed})"


# ---------------------------------------------------------------------------------------------------------
# The data path: many small files against one packed file (notebook 14)
# ---------------------------------------------------------------------------------------------------------

#: The most records :func:`pack_records` takes, and the most bytes in all (1 GiB).
_MAX_RECORDS = 10_000_000
_MAX_PACK_BYTES = 1 << 30


def pack_records(records: Sequence[bytes], path: Path) -> list[tuple[int, int]]:
    """Write ``records`` back to back into the new file ``path``; return the index, ``(offset, length)`` per record.

    One file and one ``open`` replace one file per record: a reader seeks to ``offset`` and reads ``length``
    bytes. ``path`` must be a ``pathlib.Path`` in an existing folder and must not exist yet (nothing is
    overwritten). Introduced in notebook 14.
    """
    if isinstance(records, (str, bytes, bytearray)) or not isinstance(records, (list, tuple)):
        raise TypeError(f"records must be a list of bytes objects, got {type(records).__name__}")
    if len(records) > _MAX_RECORDS or not all(isinstance(r, bytes) for r in records):
        raise TypeError(f"records must be a list of at most {_MAX_RECORDS:,} bytes objects")
    if sum(len(r) for r in records) > _MAX_PACK_BYTES:
        raise ValueError(f"records hold more than {_MAX_PACK_BYTES:,} bytes in all")
    if not isinstance(path, Path):
        raise TypeError(f"path must be a pathlib.Path, got {type(path).__name__}")
    if not path.parent.is_dir() or path.exists():
        raise ValueError(f"path must be a new file in an existing folder, got {str(path)!r}")
    index, offset = [], 0
    with open(path, "xb") as f:
        for rec in records:
            f.write(rec)
            index.append((offset, len(rec)))
            offset += len(rec)
    return index


@dataclass(eq=False)  # compared by identity: two blocks with equal counts are still two counters
class OpenCount:
    """How many files were opened inside a :func:`count_opens` block (``count``). Introduced in notebook 14."""

    count: int = 0


_ACTIVE_COUNTS: list[OpenCount] = []
_HOOKED = False


def _audit(event: str, _args: tuple) -> None:
    """The audit hook: one more open for every active counter (and nothing when none is active)."""
    if event == "open" and _ACTIVE_COUNTS:
        for c in _ACTIVE_COUNTS:
            c.count += 1


@contextlib.contextmanager
def count_opens() -> Iterator[OpenCount]:
    """Count the files this process opens inside the ``with`` block: ``with count_opens() as n: ...; n.count``.

    Every ``open()``, ``io.open``, ``os.open`` and ``pathlib.Path.open``/``read_bytes`` raises Python's audit
    event ``"open"`` (PEP 578), which a hook counts: the opens made through Python, seen from inside the process
    (threads of this process included; worker processes not). ``strace -e trace=openat`` shows more: files that C
    code opens by itself (an extension's own ``fopen``, the loader's shared libraries). Python cannot remove an audit
    hook, so the hook installed by the first call stays for the life of the process and does nothing outside a
    block. Introduced in notebook 14.
    """
    global _HOOKED
    if not _HOOKED:
        sys.addaudithook(_audit)
        _HOOKED = True
    counter = OpenCount()
    _ACTIVE_COUNTS.append(counter)
    try:
        yield counter
    finally:
        _ACTIVE_COUNTS.remove(counter)
