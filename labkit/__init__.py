"""labkit: the helper package behind the workbook's notebooks.

Importing ``labkit`` has no side effects: submodules load on first attribute access
(``labkit.formats``), so ``import labkit`` stays cheap and never touches a GPU.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

#: Submodules, one per concern. Later notebooks add theirs here.
__all__ = [
    "activations",
    "bench",
    "catalog",
    "check",
    "clinic",
    "data",
    "debug",
    "device",
    "dist",
    "env",
    "exercises",
    "formats",
    "fp8",
    "fusion",
    "handpar",
    "i18n",
    "inference",
    "kernelbench",
    "kernels",
    "lifecycle",
    "memory",
    "microscaling",
    "models",
    "plots",
    "precision",
    "profiling",
    "recipes",
    "roofline",
    "scaling",
    "sizing",
    "slurm",
    "student",
    "tf32",
    "toolchain",
    "traffic",
    "train",
    "widgets",
    "workspace",
    "zero",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'labkit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*__all__, "__version__"])
