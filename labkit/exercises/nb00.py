"""Exercises of notebook 00 (environment check). Introduced in notebook 00."""

from __future__ import annotations

from labkit.check import Exercise

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
             _grade_device, "Run labkit.device.pick_device() and read its .type: 'cpu', 'cuda' or 'mps'."),
    Exercise("00.autocast-dtype", "Which dtype does autocast use here by default?", _grade_dtype,
             "labkit.device.autocast_dtype() answers it; bf16 where the hardware computes it, else fp16."),
    Exercise("00.bottlenecks", "Name the bottleneck of each scenario.", _grade_bottlenecks,
             "A big matmul does ~n FLOPs per byte; an elementwise add does < 1; moving data between "
             "machines waits on the network."),
]
