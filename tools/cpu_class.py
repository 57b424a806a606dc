"""Say whether a capped test run would test anything the native run does not (used by the Makefile).

    python tools/cpu_class.py                  # prints this machine's uncapped CPU class
    python tools/cpu_class.py --above avx2     # exit 0 if the uncapped class is above avx2, else 1

A cap can only lower the CPU class torch and oneDNN use. On a machine whose own class is at or below the cap's,
the capped run would repeat the native run exactly, so `make test` runs a capped pass only where this says the
machine is above the cap's class. The class is asked of labkit.device in a fresh process with every cap removed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from typing import NoReturn

from labkit.device import CPU_CLASSES as ORDER

CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")


def native_class() -> str:
    """The CPU class labkit.device reports for this machine with no cap in force."""
    env = {k: v for k, v in os.environ.items() if k not in CAPS}
    out = subprocess.run([sys.executable, "-c", "from labkit import device; print(device.cpu_class())"],
                         env=env, capture_output=True, text=True, timeout=300, check=True)
    return out.stdout.strip().splitlines()[-1]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line on stderr, exit status 2 (labkit._cli's convention)
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def main(argv: list[str] | None = None) -> int:
    ap = _Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--above", choices=ORDER, default=None, help="exit 0 only if the native class is above this")
    a = ap.parse_args(argv)
    have = native_class()
    if a.above is None:
        print(have)
        return 0
    above = ORDER.index(have) > ORDER.index(a.above)
    print(f"this CPU's class is {have}: {'above' if above else 'not above'} {a.above}")
    return 0 if above else 1


if __name__ == "__main__":
    raise SystemExit(main())
