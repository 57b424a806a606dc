"""labkit: the helper package behind the workbook's notebooks.

Importing ``labkit`` has no side effects: submodules load on first attribute access
(``labkit.formats``), so ``import labkit`` stays cheap and never touches a GPU.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

#: Submodules, one per concern. Later notebooks add theirs here.
_SUBMODULES = [
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
    "printed",
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
__all__ = [*_SUBMODULES, "load_ipython_extension"]


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext labkit``, in every notebook's imports cell: in an edition other than English (a notebook under
    ``notebooks/zh``, a workspace made with ``LAB_LANG=zh``, or ``LABKIT_LANG``), the lines the notebook's code
    prints appear in that language (see :mod:`labkit.printed`); in English it does nothing. Introduced in
    notebook 00."""
    from labkit import printed

    printed.load(ipython)


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'labkit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*__all__, "__version__"])
