"""Exercises of notebook 00 (environment check). Introduced in notebook 00."""

from __future__ import annotations

from collections.abc import Callable

from labkit.exercises._core import Exercise

__all__ = ["EXERCISES"]


def _grade_device(answer: object) -> tuple[bool, str]:
    from labkit.device import pick_device

    want = pick_device().type
    got = str(answer).strip().lower()
    return got == want, "" if got == want else f"pick_device() returned something else than {got!r}."


def _grade_dtype(answer: object) -> bool:
    import torch

    from labkit.device import autocast_dtype

    want = autocast_dtype()
    if isinstance(answer, torch.dtype):
        return answer == want
    return str(answer).strip().lower().replace("torch.", "") == str(want).replace("torch.", "")


class _AtGradeTime:
    """An answer computed when it is graded, not on import: the right (or a wrong) value on this machine."""

    def __init__(self, fn: Callable[[], str], what: str) -> None:
        self._fn, self._what = fn, what

    def __str__(self) -> str:
        return self._fn()

    def __repr__(self) -> str:
        return f"<{self._what}>"


def _picked() -> str:
    from labkit.device import pick_device

    return pick_device().type


def _not_picked() -> str:
    return "cuda" if _picked() != "cuda" else "cpu"


def _autocast_name() -> str:
    from labkit.device import autocast_dtype

    return str(autocast_dtype()).replace("torch.", "")


def _other_dtype() -> str:
    # the typical mistake: the other half-precision dtype
    return "float16" if _autocast_name() != "float16" else "bfloat16"


_BOTTLENECKS = {"compute", "memory bandwidth", "communication"}
_SCENARIOS = {
    "a 8192x8192 bf16 matmul": "compute",
    "adding a bias to a 1 GB activation tensor": "memory bandwidth",
    "all-reducing 1 GB of gradients between two nodes": "communication",
}


def _grade_bottlenecks(answer: object) -> tuple[bool, str]:
    if not isinstance(answer, dict):
        return False, "Give a dict {scenario: bottleneck}."
    norm = {str(k): str(v).strip().lower() for k, v in answer.items()}
    unknown = set(norm.values()) - _BOTTLENECKS
    if unknown:
        return False, f"Bottlenecks are named {sorted(_BOTTLENECKS)}, not {sorted(unknown)}."
    wrong = [k for k, v in _SCENARIOS.items() if norm.get(k) != v]
    return not wrong, "" if not wrong else f"{len(wrong)} of {len(_SCENARIOS)} scenarios are off."


EXERCISES = [
    Exercise("00.device", "Which device type does labkit.device.pick_device() choose on this machine?",
             _grade_device, "Run labkit.device.pick_device() and read its .type: 'cpu', 'cuda' or 'mps'.",
             reference=_AtGradeTime(_picked, "pick_device().type"),
             wrong=_AtGradeTime(_not_picked, "a device type that pick_device() does not choose")),
    Exercise("00.autocast-dtype", "Which dtype does autocast use here by default?", _grade_dtype,
             "labkit.device.autocast_dtype() answers it; bf16 where the hardware computes it, else fp16.",
             reference=_AtGradeTime(_autocast_name, "autocast_dtype()"),
             wrong=_AtGradeTime(_other_dtype, "the other half-precision dtype")),
    Exercise("00.bottlenecks", "Name the bottleneck of each scenario.", _grade_bottlenecks,
             "A big matmul does ~n FLOPs per byte; an elementwise add does < 1; moving data between "
             "machines waits on the network.",
             reference=dict(_SCENARIOS),
             wrong={**_SCENARIOS, "adding a bias to a 1 GB activation tensor": "compute"}),
]
