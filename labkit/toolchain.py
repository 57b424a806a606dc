"""The toolchain under a training job: compilers and their flags, shared libraries, containers, energy.

- :data:`KERNEL_C` is one small C kernel (a polynomial per element); :func:`time_builds` compiles it once per
  set of flags (``-O0``, ``-O2``, ``-O3 -march=native`` ...) and runs each binary, which times itself.
- :func:`undefined_symbol_demo` reproduces, with two versions of a tiny shared library, the loader error that
  a mismatched cuBLAS/cuDNN gives: ``undefined symbol: ...``.
- :func:`find_compilers`, :func:`container_runtime`, :func:`library_versions` say what this machine has;
  :func:`read_energy_uj` reads the CPU's energy counter (Intel RAPL) where the kernel lets us.
- :func:`ib_timeout_seconds` turns ``NCCL_IB_TIMEOUT`` into seconds; :func:`amdahl` is the arithmetic of
  speed-up claims.

Everything that compiles works in a private temporary folder under the ``workdir`` you pass (a
:class:`pathlib.Path`), and removes only that folder. Introduced in notebook 14.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from labkit._validate import as_float, safe_repr

__all__ = [
    "COMPILERS",
    "KERNEL_C",
    "Build",
    "SymbolDemo",
    "amdahl",
    "compiler_version",
    "container_runtime",
    "find_compilers",
    "ib_timeout_seconds",
    "kernel_source",
    "library_versions",
    "read_energy_uj",
    "time_builds",
    "undefined_symbol_demo",
    "vector_widths",
    "vectorization_report",
]

#: The compilers the notebook looks for: GCC, LLVM's clang, Intel's oneAPI icx, NVIDIA's nvcc.
COMPILERS = ("gcc", "clang", "icx", "nvcc")

#: The benchmark kernel: y = ((0.5 x + 0.25) x - 1) x + 2 per element, repeated; the program times itself.
KERNEL_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* One element's work is independent of the others': a loop the compiler may vectorise. */
__attribute__((noinline)) static void poly(int n, const float *x, float *y) {
    for (int i = 0; i < n; i++)
        y[i] = ((0.5f * x[i] + 0.25f) * x[i] - 1.0f) * x[i] + 2.0f;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

int main(int argc, char **argv) {
    int n = atoi(argv[1]), reps = atoi(argv[2]), rounds = atoi(argv[3]);
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    for (int i = 0; i < n; i++) x[i] = (float)(i % 1000) / 1000.0f;
    double best = 1e30;
    for (int r = 0; r < rounds; r++) {          /* the best of a few rounds: the least disturbed one */
        double t0 = now();
        for (int k = 0; k < reps; k++) {
            poly(n, x, y);
            __asm__ volatile("" ::: "memory");  /* the compiler may not drop or merge the repeats */
        }
        double dt = now() - t0;
        if (dt < best) best = dt;
    }
    double sum = 0.0;                           /* a checksum of the result, in a fixed order */
    for (int i = 0; i < n; i++) sum += y[i];
    printf("%.17g %.9f\n", sum, best);
    free(x); free(y);
    return 0;
}
"""

_RUN_LIMIT_S = 120
_LOOP = "__attribute__((noinline)) static void poly(int n, const float *x, float *y) {\n    for (int i = 0; i < n; i++)"


def kernel_source(*, restrict: bool = False, fixed_n: int | None = None) -> str:
    """Return :data:`KERNEL_C`, optionally with ``restrict`` pointers in ``poly`` and its trip count fixed at compile time.

    ``restrict=True`` promises the compiler that ``x`` and ``y`` do not overlap (no runtime alias check needed);
    ``fixed_n`` replaces the loop's runtime ``n`` by a constant (no scalar epilogue needed when it is a multiple of
    the vector width). The variants are for :func:`vectorization_report`; :func:`time_builds` times the original.
    Raises ``TypeError``/``ValueError`` for a ``fixed_n`` that is not an int from 1 to 2**22. Introduced in notebook 14.
    """
    if not isinstance(restrict, bool):
        raise TypeError(f"restrict must be True or False, got {safe_repr(restrict)}")
    if fixed_n is not None:
        _positive("fixed_n", fixed_n, 1 << 22)
    ptr = "*restrict " if restrict else "*"
    loop = _LOOP.replace("const float *x, float *y", f"const float {ptr}x, float {ptr}y")
    if fixed_n is not None:
        loop = loop.replace("i < n;", f"i < {fixed_n};")
    assert _LOOP in KERNEL_C
    return KERNEL_C.replace(_LOOP, loop)


def vector_widths(report: str) -> list[int]:
    """The vector widths in bytes that a :func:`vectorization_report` names, widest first (16: SSE, 32: AVX2,
    64: AVX-512); empty when nothing was vectorised. Introduced in notebook 14."""
    if not isinstance(report, str):
        raise TypeError(f"report must be the str vectorization_report returned, got {type(report).__name__}")
    return sorted({int(w) for w in re.findall(r"using (\d+) byte vectors", report)}, reverse=True)


@dataclass(frozen=True)
class Build:
    """One build of :data:`KERNEL_C`: its flags, the checksum its binary printed, and its best time in seconds.

    Introduced in notebook 14.
    """

    name: str
    flags: tuple[str, ...]
    checksum: str
    seconds: float


@dataclass(frozen=True)
class SymbolDemo:
    """What :func:`undefined_symbol_demo` saw: the output with the right library, the error with the old one.

    ``symbols_v1``/``symbols_v2`` are the functions each library version exports (from ``nm -D``, or None when
    binutils is missing); ``resolved_v1``/``resolved_v2`` the line of ``ldd`` that names the library found.
    Introduced in notebook 14.
    """

    output_v2: str
    error_v1: str
    symbols_v1: tuple[str, ...] | None
    symbols_v2: tuple[str, ...] | None
    resolved_v1: str | None
    resolved_v2: str | None


def _check_workdir(workdir: object) -> Path:
    if not isinstance(workdir, Path):
        raise TypeError(f"workdir must be a pathlib.Path of an existing folder, got {type(workdir).__name__}")
    if not workdir.is_dir():
        raise ValueError(f"workdir {str(workdir)!r} is not an existing folder")
    return workdir


def _check_cc(cc: object) -> str:
    if not isinstance(cc, str) or not cc:
        raise TypeError(f"cc must be a compiler name such as 'gcc', got {safe_repr(cc)}")
    path = shutil.which(cc)
    if path is None:
        raise ValueError(f"no compiler {safe_repr(cc)} on PATH (find_compilers() says which exist)")
    return path


def find_compilers(names: Sequence[str] = COMPILERS) -> dict[str, str | None]:
    """Return ``{name: path or None}`` for each compiler in ``names`` found on PATH. Introduced in notebook 14."""
    if isinstance(names, str) or not isinstance(names, Sequence) or not all(isinstance(n, str) for n in names):
        raise TypeError("names must be a list of compiler names such as ['gcc', 'nvcc']")
    return {n: shutil.which(n) for n in names}


def compiler_version(cc: str = "gcc") -> str:
    """Return the first line of ``cc --version`` (raises ValueError if ``cc`` is not on PATH).

    Introduced in notebook 14.
    """
    path = _check_cc(cc)
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60, check=False)
    lines = [ln for ln in (out.stdout or out.stderr).splitlines() if ln.strip()]
    return lines[-1] if cc == "nvcc" and lines else (lines[0] if lines else "")


def _compile(cc: str, src: Path, out: Path, flags: Sequence[str], extra: Sequence[str] = ()) -> None:
    cmd = [cc, *flags, str(src), "-o", str(out), *extra]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=_RUN_LIMIT_S, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"compiling failed: {' '.join(cmd)}\n{res.stderr.strip()}")


def _check_flag_sets(flag_sets: object) -> dict[str, tuple[str, ...]]:
    if not isinstance(flag_sets, dict) or not flag_sets:
        raise TypeError("flag_sets must be a non-empty dict {name: [flags...]}, e.g. {'-O0': ['-O0']}")
    out = {}
    for name, flags in flag_sets.items():
        if not isinstance(name, str) or isinstance(flags, str) or not isinstance(flags, (list, tuple)):
            raise TypeError(f"flag_sets[{safe_repr(name)}] must be a list of flag strings")
        if not all(isinstance(f, str) and f.startswith("-") and "\n" not in f for f in flags):
            raise ValueError(f"flag_sets[{safe_repr(name)}]: every flag is a string starting with '-', got {safe_repr(flags)}")
        out[name] = tuple(flags)
    return out


def _positive(name: str, value: object, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not 1 <= value <= high:
        raise ValueError(f"{name} must be in [1, {high}], got {value}")
    return value


def time_builds(flag_sets: dict[str, Sequence[str]], workdir: Path, *, cc: str = "gcc", n: int = 16384,
                reps: int = 2000, rounds: int = 5, common: Sequence[str] = ("-ffp-contract=off",)) -> dict[str, Build]:
    """Compile :data:`KERNEL_C` once per entry of ``flag_sets``, run each binary, return ``{name: Build}``.

    Every binary times ``rounds`` rounds of ``reps`` calls on ``n`` floats and reports its best round (the
    least disturbed one on a busy machine); the binaries run one after another. ``common`` flags go to every build:
    ``-ffp-contract=off`` keeps the compiler from fusing ``a*x + b`` into one FMA (one rounding instead of two),
    so that every build computes bit-identical results. Raises ValueError if ``cc`` is missing and
    RuntimeError if a build fails. Introduced in notebook 14.
    """
    sets = _check_flag_sets(flag_sets)
    root = _check_workdir(workdir)
    path = _check_cc(cc)
    _positive("n", n, 1 << 22)
    _positive("reps", reps, 100_000)
    _positive("rounds", rounds, 20)
    if n * reps * rounds > 5 * 10**9:
        raise ValueError("n * reps * rounds must stay below 5e9 element updates (minutes at -O0)")
    if isinstance(common, str) or not all(isinstance(f, str) and f.startswith("-") for f in common):
        raise TypeError("common must be a list of flag strings")
    tmp = Path(tempfile.mkdtemp(prefix="labkit-cc-", dir=root))
    try:
        src = tmp / "kernel.c"
        src.write_text(KERNEL_C)
        bins = {}
        for i, (name, flags) in enumerate(sets.items()):
            bins[name] = tmp / f"kernel{i}"
            _compile(path, src, bins[name], [*flags, *common])
        out = {}
        for name, binary in bins.items():
            res = subprocess.run([str(binary), str(n), str(reps), str(rounds)], capture_output=True, text=True,
                                 timeout=_RUN_LIMIT_S, check=True)
            checksum, seconds = res.stdout.split()
            out[name] = Build(name, sets[name], checksum, float(seconds))
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def vectorization_report(flags: Sequence[str], workdir: Path, *, cc: str = "gcc", source: str = KERNEL_C,
                         loop_only: bool = False) -> str:
    """Return GCC's own account of which loops of ``source`` it vectorised with ``flags`` (``-fopt-info-vec``).

    ``source`` is :data:`KERNEL_C` or a :func:`kernel_source` variant; ``loop_only`` keeps only the lines about
    ``poly``'s loop (not ``main``'s). Empty when nothing was vectorised. GCC only (clang's equivalent is
    ``-Rpass=loop-vectorize``). Introduced in notebook 14.
    """
    if not isinstance(source, str) or "poly(" not in source:
        raise TypeError("source must be KERNEL_C or a kernel_source() variant (C text with the poly loop)")
    if isinstance(flags, str) or not isinstance(flags, (list, tuple)) or not all(isinstance(f, str) for f in flags):
        raise TypeError("flags must be a list of flag strings such as ['-O3', '-march=native']")
    root = _check_workdir(workdir)
    path = _check_cc(cc)
    tmp = Path(tempfile.mkdtemp(prefix="labkit-cc-", dir=root))
    try:
        src = tmp / "kernel.c"
        src.write_text(source)
        res = subprocess.run([path, *flags, "-fopt-info-vec", "-c", str(src), "-o", str(tmp / "kernel.o")],
                             capture_output=True, text=True, timeout=_RUN_LIMIT_S, check=False)
        if res.returncode != 0:
            raise RuntimeError(f"compiling failed:\n{res.stderr.strip()}")
        line = next(i for i, t in enumerate(source.splitlines(), 1) if "for (int i = 0; i <" in t)  # poly's loop comes first
        keep = [ln.replace(str(src), "kernel.c") for ln in res.stderr.splitlines() if "vectoriz" in ln]
        if loop_only:
            keep = [ln for ln in keep if ln.startswith(f"kernel.c:{line}:")]
        return "\n".join(keep)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


_LIB_V1 = "double scale(double x) { return 2.0 * x; }\n"
_LIB_V2 = _LIB_V1 + "double scale_fast(double x) { return x + x; }   /* new in version 2 */\n"
_EXT = "double scale_fast(double x);\ndouble ext_run(double x) { return scale_fast(x); }\n"
_LOADER = ("import ctypes, sys\nlib = ctypes.CDLL(sys.argv[1])\nlib.ext_run.restype = ctypes.c_double\n"
           "lib.ext_run.argtypes = [ctypes.c_double]\nprint(lib.ext_run(21.0))\n")


def _exported(lib: Path) -> tuple[str, ...] | None:
    nm = shutil.which("nm")
    if nm is None:
        return None
    res = subprocess.run([nm, "-D", "--defined-only", str(lib)], capture_output=True, text=True, timeout=60,
                         check=False)
    return tuple(sorted(p[-1] for p in (ln.split() for ln in res.stdout.splitlines()) if len(p) == 3 and p[1] == "T"))


def _ldd_line(ext: Path, env: dict[str, str], name: str) -> str | None:
    ldd = shutil.which("ldd")
    if ldd is None:
        return None
    res = subprocess.run([ldd, str(ext)], capture_output=True, text=True, timeout=60, env=env, check=False)
    line = next((ln.strip() for ln in res.stdout.splitlines() if name in ln), None)
    return re.sub(r"\s*\(0x[0-9a-f]+\)$", "", line) if line else None


def undefined_symbol_demo(workdir: Path, *, cc: str = "gcc") -> SymbolDemo:
    """Build two versions of a shared library and an extension linked against the newer one; load it with each.

    ``libscale.so`` version 1 exports ``scale``; version 2 adds ``scale_fast``. ``ext.so`` is compiled and
    linked against version 2 and calls ``scale_fast``. Loaded in a fresh Python process with version 2 on the
    library path it works; with version 1 first on the path, the dynamic loader refuses it with
    ``undefined symbol: scale_fast``: the error a torch build gives when it finds an older cuDNN or cuBLAS than
    the one it was built against. Raises ValueError if ``cc`` is missing. Introduced in notebook 14.
    """
    root = _check_workdir(workdir)
    path = _check_cc(cc)
    tmp = Path(tempfile.mkdtemp(prefix="labkit-so-", dir=root))
    try:
        for version, code in (("v1", _LIB_V1), ("v2", _LIB_V2)):
            (tmp / version).mkdir()
            (tmp / version / "scale.c").write_text(code)
            _compile(path, tmp / version / "scale.c", tmp / version / "libscale.so", ["-shared", "-fPIC", "-O2"])
        (tmp / "ext.c").write_text(_EXT)
        _compile(path, tmp / "ext.c", tmp / "ext.so", ["-shared", "-fPIC", "-O2"],
                 extra=[f"-L{tmp / 'v2'}", "-lscale"])
        runs, ldd = {}, {}
        for version in ("v1", "v2"):
            env = {**os.environ, "LD_LIBRARY_PATH": str(tmp / version)}
            runs[version] = subprocess.run([sys.executable, "-c", _LOADER, str(tmp / "ext.so")], capture_output=True,
                                           text=True, timeout=_RUN_LIMIT_S, env=env, check=False)
            line = _ldd_line(tmp / "ext.so", env, "libscale")
            ldd[version] = line.replace(str(tmp), "<tmp>") if line else None
        err = runs["v1"].stderr.strip().splitlines()
        return SymbolDemo(output_v2=runs["v2"].stdout.strip(),
                          error_v1=(err[-1] if err else "").replace(str(tmp), "<tmp>"),
                          symbols_v1=_exported(tmp / "v1" / "libscale.so"),
                          symbols_v2=_exported(tmp / "v2" / "libscale.so"),
                          resolved_v1=ldd["v1"], resolved_v2=ldd["v2"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def container_runtime() -> str | None:
    """Return the container this process runs in ("docker", "podman", "apptainer", "kubernetes") or None.

    Read from the marks each runtime leaves: ``/.dockerenv``, ``/run/.containerenv``, ``APPTAINER_CONTAINER`` /
    ``SINGULARITY_CONTAINER``, ``KUBERNETES_SERVICE_HOST``, and the cgroup of process 1. Introduced in notebook 14.
    """
    if os.environ.get("APPTAINER_CONTAINER") or os.environ.get("SINGULARITY_CONTAINER"):
        return "apptainer"
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return "kubernetes"
    if Path("/run/.containerenv").exists():
        return "podman"
    if Path("/.dockerenv").exists():
        return "docker"
    try:
        cgroup = Path("/proc/1/cgroup").read_text()
    except OSError:
        return None
    for mark, name in (("kubepods", "kubernetes"), ("docker", "docker"), ("containerd", "docker"),
                       ("libpod", "podman")):
        if mark in cgroup:
            return name
    return None


def library_versions() -> dict[str, str | None]:
    """Return the versions of the libraries under torch: CUDA, cuDNN, NCCL, oneDNN, the BLAS, OpenMP.

    None where a library is absent (a CPU build has no CUDA, cuDNN or NCCL). Read from torch itself
    (``torch.version``, ``torch.backends``, ``torch.__config__.show()``). Introduced in notebook 14.
    """
    import torch

    from labkit import device as dev_gate

    cfg = torch.__config__.show()

    def find(pattern: str) -> str | None:
        m = re.search(pattern, cfg)
        return m.group(1).strip() if m else None

    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "torch": torch.__version__,
        "cuda (toolkit torch was built with)": torch.version.cuda,
        "cudnn": str(cudnn) if cudnn else None,
        "nccl": dev_gate.nccl_version(),
        "onednn": find(r"(?:oneDNN|MKL-DNN)[^\n]*?(v[\d.]+)"),
        "blas": find(r"BLAS_INFO=([^,\n]+)"),
        "openmp": find(r"OpenMP (\d+)"),
    }


def read_energy_uj() -> int | None:
    """Return the CPU package's energy counter in microjoules (Intel RAPL, package 0), or None if unreadable.

    The counter lives in ``/sys/class/powercap/intel-rapl:0/energy_uj``; many kernels let only root read it,
    and virtual machines and containers usually hide it. It wraps around at ``max_energy_range_uj``.
    Introduced in notebook 14.
    """
    try:
        return int(Path("/sys/class/powercap/intel-rapl:0/energy_uj").read_text().strip())
    except (OSError, ValueError):
        return None


def ib_timeout_seconds(value: int) -> float:
    """Return the InfiniBand retry timeout that ``NCCL_IB_TIMEOUT=value`` sets: 4.096 µs × 2**value.

    The value is an exponent (the InfiniBand "local ACK timeout"), from 1 to 31; NCCL's default is 20
    (about 4.3 s per attempt, retried ``NCCL_IB_RETRY_CNT`` = 7 times). Introduced in notebook 14.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"value must be an int, got {type(value).__name__}")
    if not 1 <= value <= 31:
        raise ValueError(f"NCCL_IB_TIMEOUT is an exponent from 1 to 31, got {value}")
    return 4.096e-6 * 2**value


def amdahl(fraction: float, speedup: float) -> float:
    """Return the whole job's speed-up when a ``fraction`` of its time gets ``speedup`` times faster.

    Amdahl's law: 1 / ((1 - fraction) + fraction / speedup). The rest of the job bounds it: even an infinite
    ``speedup`` gives at most 1 / (1 - fraction). Introduced in notebook 14.
    """
    for name, v in (("fraction", fraction), ("speedup", speedup)):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"{name} must be a number, got {type(v).__name__}")
    fraction, speedup = as_float("fraction", fraction), as_float("speedup", speedup)
    if not 0 <= fraction <= 1:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    if not (speedup > 0):
        raise ValueError(f"speedup must be > 0, got {speedup}")
    if math.isinf(speedup):
        return math.inf if fraction == 1 else 1 / (1 - fraction)
    return 1 / ((1 - fraction) + fraction / speedup)
