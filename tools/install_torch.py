"""Install torch first, pinned, so that a CPU-only machine never pulls a multi-GB CUDA build by accident.

    python tools/install_torch.py                       # TORCH_INDEX=auto
    python tools/install_torch.py --index cpu           # the CPU wheel index
    python tools/install_torch.py --index cu128         # a CUDA 12.8 build
    python tools/install_torch.py --index pypi          # whatever pip's configured index gives

"auto" keeps pip's own index when it resolves the pin to a CPU build (a mirror with the CPU wheel, macOS)
or when an NVIDIA GPU is present; otherwise it uses PyTorch's CPU index.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import platform
import shutil
import subprocess
import sys
from typing import NoReturn

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
WHEEL_INDEX = "https://download.pytorch.org/whl/{}"


def choose_index(index: str, has_gpu: bool, resolved_version: str | None, system: str) -> str | None:
    """Return the index URL to install from, or None for pip's configured index."""
    if index == "pypi":
        return None
    if index == "cpu":
        return CPU_INDEX
    if index.startswith(("http://", "https://", "file:")):
        return index
    if index.startswith(("cu", "rocm")):
        return WHEEL_INDEX.format(index)
    if index != "auto":
        raise ValueError(f"TORCH_INDEX must be auto, pypi, cpu, cuNNN, rocmX.Y or a URL; got {index!r}")
    if has_gpu or system == "Darwin" or (resolved_version or "").endswith("+cpu"):
        return None
    return CPU_INDEX


def resolve(spec: str) -> str | None:
    """Ask pip which torch version its configured index would install (metadata only, no download)."""
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "-q", "--report", "-",
                          spec], capture_output=True, text=True)
    if out.returncode != 0:
        return None
    try:
        return json.loads(out.stdout)["install"][0]["metadata"]["version"]
    except (ValueError, KeyError, IndexError):
        return None


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line on stderr, exit status 2 (labkit._cli's convention)
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def main(argv: list[str] | None = None) -> int:
    ap = _Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default="torch==2.13.0")
    ap.add_argument("--index", default="auto")
    a = ap.parse_args(argv)
    want = a.spec.split("==", 1)[1] if "==" in a.spec else None
    try:
        have = md.version("torch")
    except md.PackageNotFoundError:
        have = None
    if have and want and have.split("+")[0] == want:
        print(f"torch {have} already installed")
        return 0
    has_gpu = shutil.which("nvidia-smi") is not None
    resolved = resolve(a.spec) if a.index == "auto" else None
    url = choose_index(a.index, has_gpu, resolved, platform.system())
    cmd = [sys.executable, "-m", "pip", "install", a.spec] + (["--index-url", url] if url else [])
    print("installing:", " ".join(cmd[3:]), f"(GPU: {'yes' if has_gpu else 'no'}, pip's index offers {resolved})")
    return subprocess.call(cmd)


if __name__ == "__main__":
    raise SystemExit(main())
