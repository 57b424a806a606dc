"""The environment report behind ``python -m labkit doctor`` and notebook 00.

``report()`` gathers versions, device capabilities, thread counts, the environment variables that
matter for distributed and cluster work, and the seeds in use; ``format_report()`` prints it.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import sys
import unicodedata
from typing import Any

from labkit.i18n import N_
from labkit.i18n import gettext as _

__all__ = ["ENV_PREFIXES", "ENV_VARS", "format_report", "report", "seed_everything"]

#: Variables reported when set: exact names, and prefixes (NCCL_*, SLURM_* …).
ENV_VARS = ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "LABKIT_DEVICE", "LABKIT_SEED",
            "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "DS_ACCELERATOR",
            "TORCH_EXTENSIONS_DIR", "TORCHINDUCTOR_COMPILE_THREADS", "TORCHINDUCTOR_CACHE_DIR", "PYTHONHASHSEED",
            "CUBLAS_WORKSPACE_CONFIG", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MPLBACKEND")
ENV_PREFIXES = ("NCCL_", "SLURM_", "TORCH_DISTRIBUTED_", "JUPYTER_")

_PACKAGES = ("torch", "numpy", "ml_dtypes", "matplotlib", "ipywidgets", "jupyterlab", "tqdm", "deepspeed",
             "nbval", "labkit")


def _yes_fast(computes: bool, fast: bool) -> str:
    return _("no") if not computes else (_("yes (native)") if fast else _("yes (emulated, slow)"))


def _version(pkg: str) -> str | None:
    try:
        return md.version(pkg.replace("_", "-"))
    except md.PackageNotFoundError:
        try:
            return md.version(pkg)
        except md.PackageNotFoundError:
            return None


def seed_everything(seed: int = 0) -> int:
    """Seed Python's, numpy's and torch's generators (all devices) and return the seed.

    Introduced in notebook 00.
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if not 0 <= seed < 2**32:
        raise ValueError(f"seed must be in [0, 2**32), got {seed}")
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # seeds CUDA generators too
    return seed


def report() -> dict[str, Any]:
    """Gather versions, device capabilities, threads, relevant env vars and seeds into a dict.

    Works on a CPU-only machine; DeepSpeed is reported as None when absent (it is an optional extra).
    Introduced in notebook 00.
    """
    import torch

    from labkit import device as dev_gate

    caps = dev_gate.capabilities()
    cuda = torch.version.cuda
    nccl = dev_gate.nccl_version()
    env = {k: os.environ[k] for k in ENV_VARS if k in os.environ}
    env.update({k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES) and "TOKEN" not in k})
    return {
        "python": platform.python_version(),
        "executable": sys.executable,
        "platform": platform.platform(),
        "versions": {p: _version(p) for p in _PACKAGES},
        "torch_cuda": cuda,
        "nccl": nccl,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "device": caps.as_dict(),
        "threads": {"torch_intraop": torch.get_num_threads(), "torch_interop": torch.get_num_interop_threads(),
                    "os_cpu_count": os.cpu_count(),
                    "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None},
        "env": dict(sorted(env.items())),
        "seeds": {"torch_initial_seed": torch.initial_seed(), "LABKIT_SEED": os.environ.get("LABKIT_SEED"),
                  "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED")},
    }


_REPORT_KEYS = ("python", "executable", "platform", "versions", "torch_cuda", "nccl", "cudnn", "device", "threads",
                "env", "seeds")
_DEVICE_KEYS = ("device", "device_name", "tier", "gpu_count", "bf16", "bf16_fast", "fp16", "fp16_fast",
                "autocast_dtype", "tf32_matmul", "tf32_cudnn", "float32_matmul_precision", "fp8_dtypes",
                "fp8_matmul", "cpu_isa", "cpu_capability", "cpu_class")


def _row(label: str, value: str, width: int = 14) -> str:
    """One line of the report: the label in the learner's language, padded to ``width`` columns (a CJK character
    takes two), then the value."""
    shown = _(label)
    cols = sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in shown)
    return shown + " " * max(width - cols, 1) + value


def format_report(r: dict[str, Any] | None = None) -> str:
    """Return the report as aligned text (the same text ``python -m labkit doctor`` prints).

    Introduced in notebook 00.
    """
    r = report() if r is None else r
    if not isinstance(r, dict):
        raise TypeError(f"expected the dict from report(), got {type(r).__name__}")
    missing_keys = [k for k in _REPORT_KEYS if k not in r]
    if missing_keys or not all(isinstance(r[k], dict) for k in ("device", "versions", "threads", "env", "seeds")):
        raise ValueError(f"expected the dict from report(), with {', '.join(_REPORT_KEYS)}; "
                         f"missing or not dicts: {missing_keys or 'device/versions/threads/env/seeds'}")
    d = r["device"]
    if not all(k in d for k in _DEVICE_KEYS):
        raise ValueError(f"r['device'] must be Capabilities.as_dict() (with {', '.join(_DEVICE_KEYS)})")
    yes, no = _("yes"), _("no")
    lines = ["labkit doctor", "=" * 13, _row(N_("python"), f"{r['python']}  ({r['executable']})"),
             _row(N_("platform"), r["platform"])]
    lines.append(_row(N_("packages"), ", ".join(f"{k} {v}" for k, v in r["versions"].items() if v)))
    missing = [k for k, v in r["versions"].items() if not v]
    if missing:
        lines.append(_row(N_("not installed"), ", ".join(missing)))
    lines += [_row(N_("torch CUDA"), f"{r['torch_cuda'] or _('none (CPU build)')}   NCCL {r['nccl'] or '-'}   "
                   f"cuDNN {r['cudnn'] or '-'}"),
              _row(N_("device"), _("{device} ({name}), tier {tier}, GPUs {gpus}").format(
                  device=d["device"], name=d["device_name"], tier=d["tier"], gpus=d["gpu_count"])),
              _row(N_("autocast"), _("bf16 {bf16}, fp16 {fp16}, default {default}").format(
                  bf16=_yes_fast(d["bf16"], d["bf16_fast"]), fp16=_yes_fast(d["fp16"], d["fp16_fast"]),
                  default=d["autocast_dtype"])),
              _row(N_("TF32"), f"matmul {d['tf32_matmul']}, cudnn {d['tf32_cudnn']}, "
                   f"float32_matmul_precision {d['float32_matmul_precision']!r}"),
              _row(N_("fp8"), _("dtypes {dtypes}, matmul {matmul}").format(
                  dtypes=yes if d["fp8_dtypes"] else no,
                  matmul=yes if d["fp8_matmul"] else _("no (needs CUDA capability >= 8.9)"))),
              _row(N_("CPU ISA"), _("{isa} (torch kernels: {capability}; class {cls})").format(
                  isa=" ".join(d["cpu_isa"]) or "-", capability=d["cpu_capability"], cls=d["cpu_class"])),
              _row(N_("threads"), ", ".join(f"{k} {v}" for k, v in r["threads"].items())),
              _row(N_("seeds"), ", ".join(f"{k} {v}" for k, v in r["seeds"].items()))]
    if r["env"]:
        lines.append(_("environment"))
        lines += [f"  {k}={v}" for k, v in r["env"].items()]
    else:
        lines.append(_row(N_("environment"), _("(no NCCL_*/SLURM_*/CUDA_VISIBLE_DEVICES/OMP_NUM_THREADS set)")))
    return "\n".join(lines)
