"""The exercise registry: one module per notebook (``nb01``, ``nb02`` …), each with an ``EXERCISES`` list.

The exercise modules build on :class:`Exercise` and the graders of :mod:`labkit.exercises._core`,
re-exported here. Nothing in this package imports :mod:`labkit.check`; ``check`` imports the registry.

Introduced in notebook 01.
"""

from __future__ import annotations

import importlib
import pkgutil

from labkit.exercises._core import NOT_GIVEN, Exercise, number_grader

__all__ = ["NOT_GIVEN", "Exercise", "all_exercises", "get_exercise", "number_grader"]

_REGISTRY: dict[str, Exercise] | None = None


def _load() -> dict[str, Exercise]:
    global _REGISTRY
    if _REGISTRY is None:
        reg: dict[str, Exercise] = {}
        for mod in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
            if not mod.name.startswith("nb"):
                continue
            for ex in importlib.import_module(f"{__name__}.{mod.name}").EXERCISES:
                if ex.id in reg:
                    raise RuntimeError(f"duplicate exercise id {ex.id!r}")
                reg[ex.id] = ex
        _REGISTRY = reg
    return _REGISTRY


def get_exercise(exercise_id: str) -> Exercise:
    """Return the exercise with this id; raise ``ValueError`` naming the known ids if there is none.

    Introduced in notebook 01.
    """
    if not isinstance(exercise_id, str):
        raise TypeError(f"exercise id must be a str such as '01.fp16-max', got {type(exercise_id).__name__}")
    reg = _load()
    if exercise_id not in reg:
        prefix = exercise_id.split(".")[0]
        near = sorted(k for k in reg if k.startswith(prefix + ".")) or sorted(reg)
        raise ValueError(f"unknown exercise id {exercise_id!r}; known ids include: {', '.join(near)}")
    return reg[exercise_id]


def all_exercises() -> dict[str, Exercise]:
    """Return every registered exercise, by id. Introduced in notebook 01."""
    return dict(_load())
