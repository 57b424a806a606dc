"""What every clinic case script shares: its settings from ``--config``, and the one result line it prints.

A case script is an ordinary training script with a dict of settings at the top (``CONFIG``), the way many real
scripts keep theirs. The clinic's runner passes the learner's change as JSON (``--config '{"lr": 0.1}'``);
:func:`merge_config` applies it with the same checks on both sides (an unknown setting or a value of the wrong
type is refused before anything runs). :func:`finish` prints the evidence on rank 0 as the one
``LABKIT_RESULT {json}`` line that :func:`labkit.dist.launch` (and the runner) read back.

Not in ``labkit.clinic.__all__``: the scripts' own plumbing. Introduced in notebook 13.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from labkit._validate import safe_repr

__all__ = ["deepspeed_ranks", "finish", "gloo_ranks", "merge_config", "read_config"]


def _same_kind(default: Any, value: Any) -> bool:
    """Whether ``value`` may replace ``default``: same JSON kind (a bool is not a number, an int may be a float)."""
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(default, bool) and isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float)) and math.isfinite(value)
    if isinstance(default, int):
        return isinstance(value, int)
    if isinstance(default, str):
        return isinstance(value, str)
    if default is None:
        return value is None or isinstance(value, (int, float, str))
    return False


def merge_config(defaults: Mapping[str, Any], changes: Mapping[str, Any] | None,
                 choices: Mapping[str, Sequence[str]] | None = None) -> dict[str, Any]:
    """Return ``defaults`` with ``changes`` applied; ``ValueError``/``TypeError`` for an unknown key or a wrong type.

    A setting whose default is a bool takes a bool, an int an int, a float any finite number, a str a str;
    one whose default is ``None`` takes ``None``, a number or a str. A setting named in ``choices`` (a script's
    ``CHOICES``) takes only one of its listed values. Introduced in notebook 13.
    """
    if not isinstance(defaults, Mapping):
        raise TypeError(f"defaults must be a dict of settings, got {type(defaults).__name__}")
    if changes is None:
        return dict(defaults)
    if not isinstance(changes, Mapping):
        raise TypeError(f"a fix is a dict of settings such as {{'lr': 0.1}}, got {type(changes).__name__}")
    out = dict(defaults)
    for key, value in changes.items():
        if not isinstance(key, str) or key not in defaults:
            raise ValueError(f"unknown setting {safe_repr(key)}; this script's settings are: {', '.join(defaults)}.")
        if not _same_kind(defaults[key], value):
            want = "None, a number or a str" if defaults[key] is None else type(defaults[key]).__name__
            raise TypeError(f"setting {safe_repr(key)} takes a {want} (its default is {defaults[key]!r}), got {safe_repr(value)}.")
        allowed = (choices or {}).get(key)
        if allowed is not None and value not in allowed:
            raise ValueError(f"setting {safe_repr(key)} takes one of: {'; '.join(repr(a) for a in allowed)}; got "
                             f"{safe_repr(value)}.")
        out[key] = float(value) if isinstance(defaults[key], float) else value
    return out


def read_config(defaults: Mapping[str, Any], argv: Sequence[str] | None = None,
                choices: Mapping[str, Sequence[str]] | None = None) -> dict[str, Any]:
    """Parse ``--config JSON`` from the command line and return the merged settings. Introduced in notebook 13."""
    ap = argparse.ArgumentParser(description="a troubleshooting-clinic case (labkit.clinic)")
    ap.add_argument("--config", default="{}", help="JSON object of settings to change, e.g. '{\"lr\": 0.1}'")
    args = ap.parse_args(argv)
    try:
        changes = json.loads(args.config)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--config is not valid JSON: {exc}") from None
    return merge_config(defaults, changes, choices)


def finish(evidence: dict[str, Any]) -> None:
    """Print ``evidence`` as the run's one result line, on rank 0 only. Introduced in notebook 13."""
    from labkit.dist import emit_result

    if int(os.environ.get("RANK", "0")) == 0:
        emit_result(evidence)


@contextlib.contextmanager
def gloo_ranks(timeout_s: float) -> Iterator[Any]:
    """Join the gloo process group with one thread per rank (the ranks share a small machine), yield
    :func:`labkit.dist.init_process_group`'s environment (``.rank``, ``.world_size``), and leave the group however
    the case ends. Introduced in notebook 13.
    """
    import torch
    import torch.distributed as dist

    from labkit import dist as ldist

    if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    torch.set_num_threads(1)
    env = ldist.init_process_group("gloo", timeout_s=float(timeout_s))
    try:
        yield env
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def deepspeed_ranks() -> Iterator[Any]:
    """Start DeepSpeed's distributed layer on its CPU accelerator (unless ``DS_ACCELERATOR`` says otherwise), every
    collective through gloo, one thread per rank; yield the ``deepspeed`` module and leave the group however the
    case ends. Introduced in notebook 13.
    """
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # say it, rather than let DeepSpeed guess
    import deepspeed
    import deepspeed.ops
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    # DeepSpeed's CPU accelerator would JIT-compile its shared-memory all-reduce op first (about a minute, cold);
    # marking it unavailable makes every collective go through gloo (see labkit.recipes.zero).
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    if "LOCAL_SIZE" not in os.environ and "LOCAL_WORLD_SIZE" in os.environ:
        os.environ["LOCAL_SIZE"] = os.environ["LOCAL_WORLD_SIZE"]
    accelerator = deepspeed.accelerator.get_accelerator().device_name()
    deepspeed.init_distributed(dist_backend="gloo" if accelerator == "cpu" else None)
    try:
        yield deepspeed
    finally:
        dist.destroy_process_group()
