"""A run's life beyond training: what writing checkpoints costs, how often to write them, and a verifiable archive.

- :func:`time_checkpoint_writes` writes checkpoints of several sizes with ``torch.save`` (flushed to the disk
  with ``fsync``) in a private temporary folder and returns size, file size and seconds for each.
- :func:`young_interval` is Young's rule for the checkpoint interval, ``sqrt(2 × write time × MTBF)``;
  :func:`checkpoint_overhead` the share of the run spent writing them.
- :func:`fingerprint` names a data set by the sha256 of its tensors (data versioning);
  :func:`write_manifest` / :func:`verify_manifest` record and re-check the sha256 of every file of a run.

Introduced in notebook 14.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from labkit._validate import as_float, check_dense

__all__ = [
    "WritePoint",
    "checkpoint_overhead",
    "fingerprint",
    "time_checkpoint_writes",
    "verify_manifest",
    "write_manifest",
    "young_interval",
]


@dataclass(frozen=True)
class WritePoint:
    """One checkpoint write: payload bytes, bytes on disk, and the best of the timed writes in seconds.

    Introduced in notebook 14.
    """

    payload_bytes: int
    file_bytes: int
    seconds: float

    @property
    def bytes_per_s(self) -> float:
        """Write throughput (file bytes per second). Introduced in notebook 14."""
        return self.file_bytes / self.seconds


def _check_dir(directory: object) -> Path:
    if not isinstance(directory, Path):
        raise TypeError(f"directory must be a pathlib.Path of an existing folder, got {type(directory).__name__}")
    if not directory.is_dir():
        raise ValueError(f"{str(directory)!r} is not an existing folder")
    return directory


def _int(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
    return value


def time_checkpoint_writes(sizes: Sequence[int], directory: Path, *, repeats: int = 3,
                           fsync: bool = True) -> list[WritePoint]:
    """Write a checkpoint of each size in ``sizes`` (bytes of fp32 weights) under ``directory``; time each.

    Each write is ``torch.save`` of ``{"weights": tensor}`` to a new file, then ``fsync`` (without it the
    kernel only copies the bytes into its page cache, and the time says nothing about the disk). The best of
    ``repeats`` writes is kept. Everything happens in a fresh temporary folder inside ``directory``, removed
    at the end; nothing else is touched. Sizes up to 1 GiB. Introduced in notebook 14.
    """
    root = _check_dir(directory)
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, (list, tuple)) or not sizes:
        raise TypeError("sizes must be a non-empty list of byte counts")
    checked = [_int("size", s, 4, 2**30) for s in sizes]
    _int("repeats", repeats, 1, 20)
    if not isinstance(fsync, bool):
        raise TypeError("fsync must be a bool")
    tmp = Path(tempfile.mkdtemp(prefix="labkit-ckpt-", dir=root))
    try:
        out = []
        for i, size in enumerate(checked):
            state = {"weights": torch.ones(size // 4)}
            best = math.inf
            for r in range(repeats):
                path = tmp / f"ckpt_{i}_{r}.pt"
                t0 = time.perf_counter()
                with open(path, "wb") as f:
                    torch.save(state, f)
                    f.flush()
                    if fsync:
                        os.fsync(f.fileno())
                best = min(best, time.perf_counter() - t0)
                file_bytes = path.stat().st_size
                path.unlink()
            out.append(WritePoint(size // 4 * 4, file_bytes, best))
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__}")
    if not (0 < value < math.inf):
        raise ValueError(f"{name} must be a positive, finite number of seconds, got {value}")
    return as_float(name, value)


def young_interval(checkpoint_s: float, mtbf_s: float) -> float:
    """Return Young's checkpoint interval in seconds: ``sqrt(2 × checkpoint_s × mtbf_s)``.

    ``checkpoint_s`` is the time one checkpoint write stalls training, ``mtbf_s`` the mean time between failures
    of the whole job (a job on N nodes fails N times as often as one node). Writing more often wastes time
    writing; less often wastes the work lost at each failure (half an interval on average). Introduced in
    notebook 14.
    """
    return math.sqrt(2 * _positive("checkpoint_s", checkpoint_s) * _positive("mtbf_s", mtbf_s))


def checkpoint_overhead(checkpoint_s: float, interval_s: float) -> float:
    """Return the share of wall time spent writing checkpoints: ``checkpoint_s / (interval_s + checkpoint_s)``.

    ``interval_s`` is the training time between two checkpoints. Introduced in notebook 14.
    """
    c, t = _positive("checkpoint_s", checkpoint_s), _positive("interval_s", interval_s)
    return c / (t + c)


def fingerprint(*tensors: torch.Tensor) -> str:
    """Return a sha256 hex digest of the tensors' dtypes, shapes and bytes: a version name for a data set.

    Equal data gives an equal fingerprint on any machine; one changed element changes it. Introduced in
    notebook 14.
    """
    if not tensors:
        raise ValueError("give at least one tensor")
    h = hashlib.sha256()
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"fingerprint takes tensors, got {type(t).__name__}")
        c = check_dense("each tensor", t).detach().cpu().contiguous()
        h.update(f"{c.dtype}{tuple(c.shape)};".encode())
        h.update(c.reshape(-1).view(torch.uint8).numpy().tobytes() if c.numel() else b"")
    return h.hexdigest()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_manifest(run_dir: Path, meta: dict[str, Any]) -> Path:
    """Write ``run_dir/manifest.json``: ``meta`` plus the sha256 and size of every other file under ``run_dir``.

    ``meta`` holds what the files cannot say (code version, data fingerprint, config, metrics) and must be
    JSON-serialisable. Returns the manifest's path. Introduced in notebook 14.
    """
    root = _check_dir(run_dir)
    if not isinstance(meta, dict) or not all(isinstance(k, str) for k in meta):
        raise TypeError("meta must be a dict with str keys")
    try:
        json.dumps(meta)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"meta must be JSON-serialisable: {exc}") from None
    files = {p.relative_to(root).as_posix(): {"sha256": _sha256(p), "bytes": p.stat().st_size}
             for p in sorted(root.rglob("*")) if p.is_file() and p.name != "manifest.json"}
    path = root / "manifest.json"
    path.write_text(json.dumps({"meta": meta, "files": files}, indent=1, sort_keys=True) + "\n")
    return path


def verify_manifest(run_dir: Path) -> list[str]:
    """Re-hash every file listed in ``run_dir/manifest.json``; return the problems (empty: all intact).

    Introduced in notebook 14.
    """
    root = _check_dir(run_dir)
    path = root / "manifest.json"
    if not path.is_file():
        raise ValueError(f"no manifest.json in {str(root)!r}")
    try:
        files = json.loads(path.read_text())["files"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is not a manifest: {exc}") from None
    problems = []
    for name, want in sorted(files.items()):
        p = root / name
        if Path(name).is_absolute() or ".." in Path(name).parts:
            problems.append(f"{name}: outside the run folder")
        elif not p.is_file():
            problems.append(f"{name}: missing")
        elif _sha256(p) != want["sha256"]:
            problems.append(f"{name}: changed (sha256 differs)")
    return problems
