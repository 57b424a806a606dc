"""Resolve the install a CUDA machine gets, from this (CPU-only) machine, and say what would go wrong.

    python tools/cuda_install.py [--report out.json]     # exit 0: it resolves; 1: it does not (why on stderr)

`make lab` and `make gpu-check` on a GPU machine install the pinned torch from the package index, whose Linux wheel
is the CUDA build, and then labkit with ``LAB_EXTRAS`` and the dev extra. On this machine pip is pointed at a local
CPU wheel, so a plain install would never see the CUDA wheel's requirements (it pins Triton, for one). This asks
pip for a dry run against the index alone (no local wheels, no pip config), with ``fast-deps``: wheels' metadata
is read through HTTP range requests, so only DeepSpeed's 2 MB source archive is downloaded. :func:`problems` reads
pip's report and its output and lists every reason the install would fail or differ from the CPU one.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, NoReturn

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
#: What points pip at this machine's local CPU wheels or caps it; certificates, timeouts and an index stay.
LOCAL_ONLY = ("PIP_FIND_LINKS", "PIP_CONSTRAINT", "PIP_CONFIG_FILE", "PIP_NO_INDEX")


def makefile_var(name: str) -> str:
    """The value of a ``NAME := value`` (or ``?=``) line in the Makefile (also read by tests/lab_env.py)."""
    text = (ROOT / "Makefile").read_text()
    m = re.search(rf"^{re.escape(name)}\s*[:?]?=\s*(.*)$", text, re.M)
    if not m:
        raise ValueError(f"the Makefile defines no {name}")
    return m.group(1).strip()


def command(report: Path) -> list[str]:
    """The dry run: the Makefile's torch pin, and labkit with every extra `make lab` and `make gpu-check` install."""
    extras = ",".join(["dev", *[e.strip() for e in makefile_var("LAB_EXTRAS").split(",") if e.strip()]])
    return [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-build-isolation",
            "--no-cache-dir", "--use-feature=fast-deps", "--report", str(report),
            "--disable-pip-version-check", makefile_var("TORCH"), f"{ROOT}[{extras}]"]


def environment() -> dict[str, str]:
    """This process's environment without what points pip at local wheels, a config file or a version cap."""
    env = {k: v for k, v in os.environ.items() if k not in LOCAL_ONLY}
    env.update({"PIP_CONFIG_FILE": os.devnull, "DS_BUILD_OPS": "0"})
    return env


def problems(returncode: int, output: str, report: dict[str, Any] | None) -> list[str]:
    """Every reason the CUDA machine's install fails or is not what the workbook expects; [] when it is fine."""
    found = []
    if returncode != 0 or report is None:
        tail = " ".join(output.strip().splitlines()[-6:])[-800:]
        kind = "ResolutionImpossible (conflicting pins)" if "ResolutionImpossible" in output else "pip failed"
        return [f"{kind}: {tail}"]
    installs = {canonicalize_name(i["metadata"]["name"]): i["metadata"] for i in report.get("install", [])}
    torch_md = installs.get("torch")
    if torch_md is None:
        return ["torch is not in the resolved install"]
    want = Requirement(makefile_var("TORCH"))
    if not want.specifier.contains(torch_md["version"]):
        found.append(f"torch {torch_md['version']} resolved, the Makefile pins {want}")
    if not any(n.startswith("nvidia-") for n in installs):
        found.append("the resolved torch pulls no nvidia-* packages: this is not the CUDA build a GPU machine gets")
    for line in torch_md.get("requires_dist", []):
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        got = installs.get(canonicalize_name(req.name))
        if got is not None and not req.specifier.contains(got["version"], prereleases=True):
            found.append(f"torch {torch_md['version']} requires {req}, the install would get {req.name} "
                         f"{got['version']}")
    return found


def resolve(timeout_s: float = 600) -> tuple[int, str, dict[str, Any] | None]:
    """Run the dry run; return pip's exit status, its output and its report (None when it wrote none)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        out = subprocess.run(command(report), env=environment(), capture_output=True, text=True, timeout=timeout_s,
                             cwd=tmp)
        data = json.loads(report.read_text()) if report.exists() else None
    return out.returncode, out.stdout + out.stderr, data


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line on stderr, exit status 2 (labkit._cli's convention)
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def main(argv: list[str] | None = None) -> int:
    ap = _Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--report", type=Path, default=None, help="also write pip's report here")
    a = ap.parse_args(argv)
    rc, output, report = resolve()
    if a.report is not None and report is not None:
        a.report.write_text(json.dumps(report, indent=1))
    found = problems(rc, output, report)
    for p in found:
        print(f"cuda-install: {p}", file=sys.stderr)
    if not found:
        n = len(report["install"]) if report else 0
        print(f"cuda-install: resolves ({n} packages, torch {makefile_var('TORCH')} CUDA build, "
              f"extras dev,{makefile_var('LAB_EXTRAS')})")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
