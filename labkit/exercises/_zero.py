"""The grader shared by the per-GPU ZeRO memory exercises of notebooks 06 and 10.

Not an exercise module (its name does not start with ``nb``), so the registry does not load it.
Introduced in notebook 06.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

__all__ = ["stage2_shards_params", "zero_bytes_grader"]

Fn = Callable[[int, int, int], float]


def stage2_shards_params(reference: Fn) -> Fn:
    """Return the typical mistake for ``reference``: stage 2 sharding the 16-bit weights too (that is stage 3).

    Introduced in notebook 06.
    """
    def wrong(n_params: int, stage: int, world_size: int) -> float:
        return reference(n_params, 3 if stage == 2 else stage, world_size)
    return wrong


def zero_bytes_grader(fn_name: str, seed: int, fixed: list[tuple[int, int, int]],
                      success: str = "") -> Callable[[Any], tuple[bool, str] | None]:
    """Grade a learner's ``fn_name(n_params, stage, world_size)`` against labkit.memory on fresh inputs.

    Mixed precision with Adam (2 + 2 + 12 bytes per parameter); ``fixed`` cases first, then 20 random
    ones from ``seed``. A tolerance of 16 bytes (or 1e-6 relative) accepts both Ψ/N and ceil(Ψ/N)
    sharding. A function that still returns ``None``/``...`` is "not attempted yet".
    Introduced in notebook 06.
    """
    def grade(fn: Any) -> tuple[bool, str] | None:
        from labkit import memory

        if not callable(fn):
            return False, f"Define a function {fn_name}(n_params, stage, world_size) and pass the function."
        rng = random.Random(seed)
        cases = list(fixed) + [(rng.randrange(10**6, 10**11), rng.randrange(4), rng.choice([1, 2, 4, 8, 64, 512]))
                               for _ in range(20)]
        for n, stage, ws in cases:
            want = memory.model_state_bytes(n, "bf16-master", "adam", stage=stage, world_size=ws).device_total
            got = fn(n, stage, ws)
            if got is None or got is Ellipsis:
                return None
            if isinstance(got, bool) or not isinstance(got, (int, float)) or not (
                    abs(got - want) <= max(16.0, 1e-6 * want)):
                hint = ""
                if isinstance(got, (int, float)) and stage == 2 and math.isclose(float(got), 16 * n / ws, rel_tol=1e-6):
                    hint = " At stage 2 the 16-bit parameters are still whole on every rank."
                return False, f"{fn_name}({n}, {stage}, {ws}) returned {got!r}; expected {want:.6g}.{hint}"
        return True, success
    return grade
