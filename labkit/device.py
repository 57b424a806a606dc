"""The one device gate: which device, which dtypes, which fast paths (TF32, fp8) are really available.

Every CUDA-specific query in labkit goes through this module; no other module touches ``torch.cuda``
or ``torch.backends.cuda``. Three separate questions are asked about a low-precision dtype, because their
answers differ on real machines:

- :func:`computes`: does autocast to it run here and return that dtype? (A tiny matmul is tried.)
- :func:`fast`: does the hardware do it natively? On CPU: AMX or AVX512-BF16/FP16, and oneDNN allowed to
  use them; on CUDA: the compute capability (bf16 and TF32 sm80+, fp8 sm89+). Emulation never counts.
- :func:`deepspeed_accepts`: does DeepSpeed's accelerator accept it? (DeepSpeed is asked.)

A CPU without AVX512-FP16 still *computes* fp16 (about a hundred times slower than fp32), DeepSpeed's CPU
accelerator refuses it there, and a V100 computes bf16 by emulation: one question cannot stand for another.
"""

from __future__ import annotations

import functools
import os
import platform
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from labkit._validate import safe_repr
from labkit.i18n import gettext as _

__all__ = [
    "Capabilities",
    "autocast_dtype",
    "capabilities",
    "computes",
    "CPU_CLASSES",
    "cpu_class",
    "cpu_isa_flags",
    "cpu_isa_in_use",
    "cpu_summary",
    "deepspeed_accepts",
    "cuda_properties",
    "dist_backend",
    "empty_cache",
    "event_timer",
    "fast",
    "fp32_matmul_settings",
    "get_rng_state",
    "inductor_cache_per_cpu_class",
    "is_cuda",
    "max_memory_allocated",
    "memory_allocated",
    "memory_reserved",
    "memory_summary",
    "nccl_version",
    "pick_device",
    "resolve",
    "reset_peak_memory_stats",
    "set_current_device",
    "set_float32_matmul_precision",
    "set_rng_state",
    "set_tf32",
    "synchronize",
    "tier",
]

_ISA_OF_INTEREST = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni",
                    "amx_tile", "amx_bf16", "amx_int8", "amx_fp16")


def _as_device(device: torch.device | str | None) -> torch.device:
    if device is None:
        return pick_device()
    if isinstance(device, torch.device):
        return device
    if isinstance(device, str):
        try:
            return torch.device(device)
        except RuntimeError as exc:
            raise ValueError(f"expected a device such as 'cpu', 'cuda' or 'cuda:0', got {safe_repr(device)}") from exc
    raise TypeError(f"expected a torch.device, a str or None, got {type(device).__name__}")


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def _present(device: torch.device | str | None) -> torch.device:
    """:func:`_as_device`, and a ValueError (not torch's AssertionError) for a GPU this machine does not have."""
    dev = _as_device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{dev} was asked for, but torch sees no CUDA GPU (torch.cuda.is_available() is False)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"{dev} was asked for, but torch sees {torch.cuda.device_count()} CUDA GPU(s)")
    elif dev.type == "mps" and not _mps_available():
        raise ValueError("an MPS device was asked for, but this machine has none")
    return dev


def pick_device(prefer: str | None = None) -> torch.device:
    """Return the best available device: CUDA, then MPS, then CPU (``prefer`` or $LABKIT_DEVICE overrides).

    Asking for a device that is not present raises ``ValueError`` rather than silently falling back.
    Introduced in notebook 00.
    """
    want = prefer if prefer is not None else os.environ.get("LABKIT_DEVICE") or None
    if want is not None:
        if not isinstance(want, str):
            raise TypeError(f"prefer must be 'cpu', 'cuda', 'mps' or None, got {type(want).__name__}")
        dev = _as_device(want)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("a CUDA device was asked for, but torch sees no GPU (torch.cuda.is_available() is False)")
        if dev.type == "mps" and not _mps_available():
            raise ValueError("an MPS device was asked for, but this machine has none")
        if dev.type not in {"cpu", "cuda", "mps"}:
            raise ValueError(f"labkit supports cpu, cuda and mps devices, not {safe_repr(dev.type)}")
        return dev
    if torch.cuda.is_available():
        return torch.device("cuda")
    if _mps_available():
        return torch.device("mps")
    return torch.device("cpu")


def resolve(device: torch.device | str | None = None, must_exist: bool = True) -> torch.device:
    """Return ``device`` as a ``torch.device`` that is really present (``None``: :func:`pick_device`).

    A bad name or type raises ``ValueError``/``TypeError``, and so does asking for a GPU this machine lacks (torch
    itself would raise a RuntimeError or an AssertionError deep inside), unless ``must_exist=False`` (a device
    only described, e.g. for a formula). Introduced in notebook 00.
    """
    if not isinstance(must_exist, bool):
        raise TypeError(f"must_exist must be a bool, got {type(must_exist).__name__}")
    if device is None:
        return pick_device()
    if not must_exist:
        return _as_device(device)
    if isinstance(device, torch.device):
        return device if device.type == "cpu" else pick_device(str(device))
    if isinstance(device, str):
        return pick_device(device)
    raise TypeError(f"device must be a torch.device, a str such as 'cpu' or 'cuda:0', or None, got "
                    f"{type(device).__name__}")


def is_cuda(device: torch.device | str | None = None) -> bool:
    """Say whether ``device`` (default: the picked device) is a CUDA device. Introduced in notebook 00."""
    return _as_device(device).type == "cuda"


@functools.cache
def cpu_isa_flags() -> tuple[str, ...]:
    """Return the CPU's SIMD/matrix ISA flags of interest (AVX-512 BF16/FP16, AMX …) read from /proc/cpuinfo.

    Empty on platforms without /proc/cpuinfo. Introduced in notebook 00.
    """
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return tuple(f for f in _ISA_OF_INTEREST if f in have)
    except OSError:
        pass
    return ()


@functools.cache
def _try_dtype(device_str: str, dtype_name: str) -> bool:
    dtype = getattr(torch, dtype_name)
    dev = torch.device(device_str)
    try:
        a = torch.ones(8, 8, device=dev, dtype=dtype)
        with torch.amp.autocast(device_type=dev.type, dtype=dtype):
            b = torch.nn.functional.linear(a.float(), a.float())
        return bool(b.dtype == dtype and torch.isfinite(b.float()).all().item() and float(b[0, 0]) == 8.0)
    except (RuntimeError, TypeError, NotImplementedError, AssertionError):
        return False


def _check_autocast_dtype(dtype: object) -> torch.dtype:
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype such as torch.bfloat16, got {type(dtype).__name__}")
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"autocast dtypes are torch.float16 and torch.bfloat16 (or torch.float32), got {dtype}")
    return dtype


def _fp8_dtypes() -> tuple[torch.dtype, ...]:
    return tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n))


@functools.cache
def _try_scaled_mm(device_str: str, dtype_name: str) -> bool:
    dev = torch.device(device_str)
    try:
        a = torch.ones(16, 16, device=dev).to(getattr(torch, dtype_name))
        b = torch.ones(16, 16, device=dev).to(torch.float8_e4m3fn).t()  # column-major second operand
        one = torch.ones((), device=dev)
        out = torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.float32)
        return bool(float(out[0, 0]) == 16.0)
    except (RuntimeError, TypeError, NotImplementedError, AttributeError):
        return False


def computes(dtype: torch.dtype, device: torch.device | str | None = None) -> bool:
    """Say whether ``dtype`` really computes on ``device`` (a tiny op is tried once, then cached).

    fp16/bf16: autocast to it runs a matmul and returns that dtype. fp8 (``torch.float8_e4m3fn``/``e5m2``):
    ``torch._scaled_mm`` runs with it (against an E4M3 operand); oneDNN has no such kernel on some CPU classes.
    True says nothing about speed: a CPU without AVX512-FP16 computes fp16, slowly (see :func:`fast`).
    Introduced in notebook 00.
    """
    if isinstance(dtype, torch.dtype) and dtype in _fp8_dtypes():
        dev = _as_device(device)
        return _try_scaled_mm(str(dev), str(dtype).replace("torch.", ""))
    dtype = _check_autocast_dtype(dtype)
    if dtype == torch.float32:
        return True
    dev = _as_device(device)
    return _try_dtype(str(dev), str(dtype).replace("torch.", ""))


# oneDNN's ISA levels, lowest first (its ONEDNN_MAX_CPU_ISA values; later aliases share a level).
_ONEDNN_ISA_ORDER = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI",
                     "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16",
                     "AVX10_2_512", "AVX10_2_512_AMX_2")
_ONEDNN_ALIASES = {"AVX10_1_512": "AVX512_CORE_FP16", "AVX10_1_512_AMX": "AVX512_CORE_AMX",
                   "AVX10_1_512_AMX_FP16": "AVX512_CORE_AMX_FP16", "ALL": "AVX10_2_512_AMX_2", "DEFAULT": None}


def _onednn_allows(level: str) -> bool:
    """Whether $ONEDNN_MAX_CPU_ISA (or the older $DNNL_MAX_CPU_ISA), if set, admits ISA ``level``."""
    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").strip().upper()
    if not cap:
        return True
    cap = _ONEDNN_ALIASES.get(cap, cap)
    if cap is None or cap not in _ONEDNN_ISA_ORDER:
        return True  # a value oneDNN does not know is ignored by oneDNN too
    return _ONEDNN_ISA_ORDER.index(cap) >= _ONEDNN_ISA_ORDER.index(level)


def _mkldnn_answer(name: str) -> bool:
    try:
        return bool(getattr(torch.ops.mkldnn, name)())
    except (AttributeError, RuntimeError):
        return False


def _cpu_fast(dtype: torch.dtype) -> bool:
    flags = set(cpu_isa_flags())
    if dtype == torch.bfloat16:
        native = bool(flags & {"avx512_bf16", "amx_bf16"})
        return native and _onednn_allows("AVX512_CORE_BF16") and _mkldnn_answer("_is_mkldnn_bf16_supported")
    if dtype == torch.float16:
        native = bool(flags & {"avx512_fp16", "amx_fp16"})
        return native and _onednn_allows("AVX512_CORE_FP16") and _mkldnn_answer("_is_mkldnn_fp16_supported")
    return False


def fast(dtype: torch.dtype, device: torch.device | str | None = None) -> bool:
    """Say whether ``device``'s hardware does ``dtype`` natively (no emulation): the "is it worth it" question.

    CPU: bf16 needs AVX512-BF16 or AMX-BF16, fp16 needs AVX512-FP16 or AMX-FP16, each also allowed by oneDNN
    (``$ONEDNN_MAX_CPU_ISA`` and torch's oneDNN answer). CUDA: fp16 from sm70 (tensor cores), bf16 from sm80
    (``torch.cuda.is_bf16_supported`` counts emulation on a V100 or T4, so it is not asked), fp8 from sm89.
    ``torch.float32`` is always fast. Introduced in notebook 00.
    """
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype such as torch.bfloat16, got {type(dtype).__name__}")
    fp8 = _fp8_dtypes()
    if dtype not in (torch.float32, torch.float16, torch.bfloat16) + fp8:
        raise ValueError(f"fast() knows float32, float16, bfloat16 and the float8 dtypes, got {dtype}")
    if dtype == torch.float32:
        return True
    dev = _present(device)
    if dev.type == "cuda":
        cc = tuple(torch.cuda.get_device_capability(dev))
        need = {torch.float16: (7, 0), torch.bfloat16: (8, 0)}.get(dtype, (8, 9))
        return cc >= need and (dtype in fp8 or computes(dtype, dev))
    if dev.type == "cpu":
        return dtype not in fp8 and _cpu_fast(dtype)
    return dtype in (torch.float16, torch.bfloat16) and computes(dtype, dev)  # MPS: native half precision


def deepspeed_accepts(dtype: torch.dtype) -> bool:
    """Ask DeepSpeed's own accelerator whether it accepts ``dtype`` (its ``is_fp16/bf16_supported``).

    DeepSpeed's CPU accelerator asks oneDNN, so it refuses fp16 where torch's autocast still computes it.
    Raises ``ModuleNotFoundError`` naming the install command when DeepSpeed is not installed. Introduced in
    notebook 10.
    """
    dtype = _check_autocast_dtype(dtype)
    if dtype == torch.float32:
        return True
    if "DS_ACCELERATOR" not in os.environ and not torch.cuda.is_available():
        os.environ["DS_ACCELERATOR"] = "cpu"  # say it, rather than let DeepSpeed guess and warn
    try:
        from deepspeed.accelerator import get_accelerator
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "deepspeed":
            raise
        raise ModuleNotFoundError("DeepSpeed is not installed in this kernel's environment. `make lab` installs it; "
                                  "by hand: DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed==0.19.8",
                                  name="deepspeed") from None

    acc = get_accelerator()
    return bool(acc.is_fp16_supported() if dtype == torch.float16 else acc.is_bf16_supported())


def cpu_isa_in_use() -> tuple[str, ...]:
    """Return the CPU's ISA flags of interest that torch may really use: :func:`cpu_isa_flags` minus what the caps
    in force ($ATEN_CPU_CAPABILITY, $ONEDNN_MAX_CPU_ISA) switch off.

    A theoretical peak or a sentence about this machine must be computed from these, not from /proc/cpuinfo alone.
    Introduced in notebook 07.
    """
    aten_512 = str(torch.backends.cpu.get_cpu_capability()).upper().startswith("AVX512")
    gates = {"avx512f": aten_512 or _onednn_allows("AVX512_CORE"), "avx512_vnni": _onednn_allows("AVX512_CORE_VNNI"),
             "avx512_bf16": _onednn_allows("AVX512_CORE_BF16"), "avx512_fp16": _onednn_allows("AVX512_CORE_FP16"),
             "amx_tile": _onednn_allows("AVX512_CORE_AMX"), "amx_bf16": _onednn_allows("AVX512_CORE_AMX"),
             "amx_int8": _onednn_allows("AVX512_CORE_AMX"), "amx_fp16": _onednn_allows("AVX512_CORE_AMX_FP16")}
    return tuple(f for f in cpu_isa_flags() if gates.get(f, True))


#: The CPU classes :func:`cpu_class` names, lowest first; a cap ($ATEN_CPU_CAPABILITY, $ONEDNN_MAX_CPU_ISA) can only
#: move a machine down this list. Introduced in notebook 00.
CPU_CLASSES: tuple[str, ...] = ("baseline", "avx2", "avx512", "avx512-bf16", "amx")


def cpu_class() -> str:
    """Name the CPU class torch is using here: "amx", "avx512-bf16", "avx512", "avx2" or "baseline".

    Read from the CPU's flags *and* the caps in force ($ATEN_CPU_CAPABILITY, $ONEDNN_MAX_CPU_ISA), so a capped
    run names the class it emulates. Introduced in notebook 00.
    """
    flags = set(cpu_isa_flags())
    aten = str(torch.backends.cpu.get_cpu_capability()).upper()
    if aten.startswith("AVX512") and "avx512f" not in flags:
        aten = "AVX2" if "avx2" in flags else "DEFAULT"  # $ATEN_CPU_CAPABILITY=avx512 is echoed, not checked
    if aten.startswith("AVX512") and "amx_bf16" in flags and _onednn_allows("AVX512_CORE_AMX") \
            and _cpu_fast(torch.bfloat16):
        return "amx"
    if aten.startswith("AVX512") and _cpu_fast(torch.bfloat16):
        return "avx512-bf16"
    if aten.startswith("AVX512"):
        return "avx512"
    if aten.startswith("AVX2"):
        return "avx2"
    return "baseline"


def cpu_summary() -> str:
    """One sentence about this CPU for a notebook to print: cores, ISA class, and what bf16/fp16 cost here.

    Generated from what is detected, never fixed prose. Introduced in notebook 00.
    """
    cores = os.cpu_count() or 1
    threads = torch.get_num_threads()
    caps = [f"{k}={os.environ[k]}" for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA") if os.environ.get(k)]
    speed = {True: _("natively"), False: _("by emulation (slow)")}
    return _("{cores} ({threads}), class {cls}{capped}: bf16 computed {bf16}, fp16 computed {fp16}").format(
        cores=(_("{n} CPU core") if cores == 1 else _("{n} CPU cores")).format(n=cores),
        threads=(_("{n} torch thread") if threads == 1 else _("{n} torch threads")).format(n=threads),
        cls=cpu_class(), capped=_(" (capped: {caps})").format(caps=", ".join(caps)) if caps else "",
        bf16=speed[fast(torch.bfloat16, "cpu")], fp16=speed[fast(torch.float16, "cpu")])


def inductor_cache_per_cpu_class() -> str:
    """Point torch.compile's on-disk cache at a folder per CPU class, unless $TORCHINDUCTOR_CACHE_DIR is set.

    Inductor's cache is not safe across CPU classes: a kernel compiled for AVX-512 and loaded by a run capped to
    AVX2 (or by a node of another CPU generation sharing a home directory) fails with
    ``SystemError: <built-in function kernel> returned a result with an exception set``. Returns the folder in
    use. Call it before the first ``torch.compile``. Introduced in notebook 07.
    """
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return os.environ["TORCHINDUCTOR_CACHE_DIR"]
    import getpass
    import tempfile

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid()) if hasattr(os, "getuid") else "user"
    path = os.path.join(tempfile.gettempdir(), f"torchinductor_{user}_{cpu_class()}")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
    return path


def autocast_dtype(device: torch.device | str | None = None) -> torch.dtype:
    """Choose the autocast dtype for ``device``: the fast one (bf16 first), else whichever computes (bf16 first).

    A V100 gets fp16 (fast there; its bf16 is emulated); a CPU without AVX512-BF16 still gets bf16, which
    computes and needs no loss scaler. Introduced in notebook 00.
    """
    dev = _present(device)
    for question in (fast, computes):
        for dt in (torch.bfloat16, torch.float16):
            if question(dt, dev) and (question is computes or computes(dt, dev)):
                return dt
    raise ValueError(f"neither bf16 nor fp16 autocast works on {dev}; use fp32")


def dist_backend(device: torch.device | str | None = None) -> str:
    """Return the torch.distributed backend for ``device``: "nccl" on CUDA, "gloo" otherwise.

    Introduced in notebook 09.
    """
    return "nccl" if is_cuda(device) else "gloo"


def set_current_device(device: torch.device | str) -> None:
    """Make ``device`` this process's current CUDA device (a no-op on CPU and MPS).

    A DDP rank calls it with ``cuda:LOCAL_RANK`` before joining an NCCL group, so that object collectives and
    barriers use its own GPU rather than GPU 0. Introduced in notebook 09.
    """
    dev = _present(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)


def synchronize(device: torch.device | str | None = None, stream_only: bool = False) -> None:
    """Wait for queued work on ``device`` to finish (a no-op on CPU).

    ``stream_only``: on CUDA wait for the current (compute) stream only, not for every stream (NCCL's own stream
    included), so a timing around compute does not turn a pending send into a rendezvous. Introduced in notebook 04.
    """
    dev = _present(device)
    if dev.type == "cuda" and stream_only:
        torch.cuda.current_stream(dev).synchronize()
    elif dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev.type == "mps":
        torch.mps.synchronize()


def max_memory_allocated(device: torch.device | str | None = None) -> int | None:
    """Return the peak bytes allocated by torch on a CUDA device, or ``None`` where torch does not track it.

    Introduced in notebook 04.
    """
    dev = _present(device)
    return int(torch.cuda.max_memory_allocated(dev)) if dev.type == "cuda" else None


def cuda_properties(device: torch.device | str | None = None) -> dict[str, object] | None:
    """Return a CUDA device's name, capability, SM count, SM clock and memory clock/bus width; None off CUDA.

    Clocks are the maximum (boost) clocks the driver reports, in kHz; ``None`` where this torch build
    does not expose them. Introduced in notebook 07.
    """
    dev = _present(device)
    if dev.type != "cuda":
        return None
    p = torch.cuda.get_device_properties(dev)
    return {"name": p.name, "capability": (p.major, p.minor), "sm_count": int(p.multi_processor_count),
            "clock_khz": getattr(p, "clock_rate", None) or None,
            "memory_clock_khz": getattr(p, "memory_clock_rate", None) or None,
            "memory_bus_width_bits": getattr(p, "memory_bus_width", None) or None,
            "total_memory": int(p.total_memory)}


def nccl_version() -> str | None:
    """Return the NCCL version torch was built with ("2.21.5"), or None without CUDA. Introduced in notebook 00."""
    if not torch.cuda.is_available():
        return None
    try:
        v = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return None
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def memory_summary(device: torch.device | str | None = None) -> str | None:
    """Return torch's CUDA allocator report (``torch.cuda.memory_summary``), or ``None`` off CUDA.

    Introduced in notebook 06.
    """
    dev = _present(device)
    return torch.cuda.memory_summary(dev, abbreviated=True) if dev.type == "cuda" else None


def memory_allocated(device: torch.device | str | None = None) -> int | None:
    """Return the bytes torch currently has allocated on a CUDA device, or ``None`` elsewhere.

    Introduced in notebook 04.
    """
    dev = _present(device)
    return int(torch.cuda.memory_allocated(dev)) if dev.type == "cuda" else None


def memory_reserved(device: torch.device | str | None = None) -> int | None:
    """Return the bytes torch's CUDA caching allocator holds (allocated + cached), or ``None`` off CUDA.

    Introduced in notebook 06.
    """
    dev = _present(device)
    return int(torch.cuda.memory_reserved(dev)) if dev.type == "cuda" else None


def empty_cache(device: torch.device | str | None = None) -> None:
    """Return the CUDA caching allocator's unused cached blocks to the driver (a no-op off CUDA).

    Introduced in notebook 06.
    """
    dev = _present(device)
    if dev.type == "cuda":
        with torch.cuda.device(dev):
            torch.cuda.empty_cache()


def reset_peak_memory_stats(device: torch.device | str | None = None) -> None:
    """Reset the peak-memory counter on a CUDA device (a no-op elsewhere). Introduced in notebook 04."""
    dev = _present(device)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)


#: Bytes written between timed runs to evict the GPU's L2 cache (H100/H200: 50 MB; B200: 126 MB), as
#: ``triton.testing.do_bench`` does.
L2_FLUSH_BYTES = 256 * 2**20


def event_timer(device: torch.device | str | None = None,
                flush_bytes: int = L2_FLUSH_BYTES) -> Callable[[Callable[[], object]], float] | None:
    """Return ``timer(fn) -> seconds`` that times ``fn()`` with CUDA events on a CUDA device, else ``None``.

    Done the way ``triton.testing.do_bench`` does it: before each run a ``flush_bytes`` buffer is zeroed (a cold
    L2, as in a real step), then the start event is queued, then ``fn``. The GPU is still busy with the flush while
    Python checks ``fn``'s arguments and launches its first kernel, so that host-side overhead (a 4096² softmax is
    ~30 µs of HBM time on an H200, the same order as a launch) is hidden rather than counted as an idle gap after
    the start event, up to the flush's own length (~60 µs for 256 MiB on an H200). Gaps between the kernels of a
    multi-op ``fn`` are still counted: they are part of what eager multi-op code costs. Events and flush are on
    ``device``'s current stream. The timer synchronises on the end event. ``flush_bytes=0`` skips the flush (then
    a warm cache and the launch gap are in the figure). Introduced in notebook 04.
    """
    dev = _present(device)
    if isinstance(flush_bytes, bool) or not isinstance(flush_bytes, int) or flush_bytes < 0:
        raise ValueError(f"flush_bytes must be an int >= 0, got {safe_repr(flush_bytes)}")
    if dev.type != "cuda":
        return None
    cache = torch.empty(flush_bytes // 4, dtype=torch.int32, device=dev) if flush_bytes else None

    def timer(fn: Callable[[], object]) -> float:
        with torch.cuda.device(dev):  # the events record on this device's stream, where fn's kernels go
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            if cache is not None:
                cache.zero_()  # queued first: evicts L2 and keeps the GPU busy while fn() is launched
            start.record()
            fn()
            end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000.0

    return timer


def get_rng_state(device: torch.device | str | None = None) -> torch.Tensor | None:
    """Return the RNG state of a CUDA device (``None`` elsewhere; the CPU's is ``torch.random.get_rng_state()``).

    Introduced in notebook 04.
    """
    dev = _present(device)
    return torch.cuda.get_rng_state(dev) if dev.type == "cuda" else None


def set_rng_state(state: torch.Tensor | None, device: torch.device | str | None = None) -> None:
    """Restore a CUDA device's RNG state saved by :func:`get_rng_state` (a no-op elsewhere or for ``None``).

    Introduced in notebook 04.
    """
    dev = _present(device)
    if state is not None and dev.type == "cuda":
        torch.cuda.set_rng_state(state.cpu(), dev)


def set_tf32(enabled: bool) -> dict[str, object]:
    """Turn TF32 for fp32 matmuls and convolutions on or off; return the previous settings.

    On a machine without CUDA the flags still exist but change nothing. Introduced in notebook 05.
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be True or False, got {type(enabled).__name__}")
    before = {"matmul": torch.backends.cuda.matmul.allow_tf32, "cudnn": torch.backends.cudnn.allow_tf32,
              "float32_matmul_precision": fp32_matmul_settings()["float32_matmul_precision"]}
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    return before


_MATMUL_PRECISIONS = ("highest", "high", "medium")


def fp32_matmul_settings() -> dict[str, object]:
    """Return what decides how fp32 matmuls compute: the TF32 flags, the precision, and each backend's view.

    ``float32_matmul_precision`` is ``"mixed"`` where the legacy and the per-backend settings disagree
    (torch then refuses to report one value). ``cuda_matmul``/``mkldnn_matmul`` are the per-backend
    ``fp32_precision`` ("none" = follows the global setting, "ieee", "tf32", "bf16"; oneDNN on a CPU
    with AMX/AVX-512 BF16 really computes fp32 matmuls in bf16 under "medium"). ``env_override`` is $TORCH_ALLOW_TF32_CUBLAS_OVERRIDE, which
    NVIDIA's NGC containers set so that TF32 is on by default. Introduced in notebook 05.
    """
    try:
        precision = torch.get_float32_matmul_precision()
    except RuntimeError:
        precision = "mixed"
    mkldnn = getattr(torch.backends, "mkldnn", None)
    return {
        "allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "float32_matmul_precision": precision,
        "cuda_matmul": getattr(torch.backends.cuda.matmul, "fp32_precision", None),
        "mkldnn_matmul": getattr(getattr(mkldnn, "matmul", None), "fp32_precision", None),
        "env_override": os.environ.get("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"),
    }


def set_float32_matmul_precision(precision: str) -> dict[str, object]:
    """Set ``torch.set_float32_matmul_precision`` ("highest", "high" or "medium"); return the previous settings.

    "high" allows TF32 (and sets ``allow_tf32``), "medium" also allows bf16, "highest" is plain fp32. It sets
    every backend at once, so it also repairs a "mixed" state. Restore with
    ``set_float32_matmul_precision(before["float32_matmul_precision"])`` (``"highest"`` if that was "mixed").
    Introduced in notebook 05.
    """
    if not isinstance(precision, str):
        raise TypeError(f"precision must be a str, got {type(precision).__name__}")
    if precision not in _MATMUL_PRECISIONS:
        raise ValueError(f"precision must be one of {_MATMUL_PRECISIONS}, got {safe_repr(precision)}")
    before = fp32_matmul_settings()
    torch.set_float32_matmul_precision(precision)
    return before


@dataclass(frozen=True)
class Capabilities:
    """What the device can do, as measured. ``tier`` is "cuda-fp8", "cuda", "mps" or "cpu".

    ``bf16``/``fp16`` answer :func:`computes`, ``bf16_fast``/``fp16_fast`` answer :func:`fast`; ``cpu_class``
    is :func:`cpu_class` (also filled in on a GPU machine: it is the host's CPU).

    Introduced in notebook 00.
    """

    device: str
    device_type: str
    device_name: str
    tier: str
    gpu_count: int
    cuda_capability: tuple[int, int] | None
    bf16: bool
    fp16: bool
    bf16_fast: bool
    fp16_fast: bool
    autocast_dtype: str | None
    tf32_matmul: bool
    tf32_cudnn: bool
    float32_matmul_precision: str
    fp8_dtypes: bool
    fp8_matmul: bool
    cpu_isa: tuple[str, ...]
    cpu_capability: str
    cpu_class: str
    torch_threads: int

    def as_dict(self) -> dict:
        """Return the capabilities as a plain dict. Introduced in notebook 00."""
        return asdict(self)


def _cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _fp8_matmul(dev: torch.device) -> bool:
    if dev.type != "cuda":
        return False
    return torch.cuda.get_device_capability(dev) >= (8, 9) and hasattr(torch, "_scaled_mm")


def capabilities(device: torch.device | str | None = None) -> Capabilities:
    """Report what ``device`` supports: bf16/fp16 autocast, TF32 flags, fp8, CPU ISA flags, counts.

    Introduced in notebook 00.
    """
    dev = _present(device)
    cuda = dev.type == "cuda"
    bf16, fp16 = computes(torch.bfloat16, dev), computes(torch.float16, dev)
    name = torch.cuda.get_device_name(dev) if cuda else _cpu_model_name()
    fp8 = _fp8_matmul(dev)
    return Capabilities(
        device=str(dev),
        device_type=dev.type,
        device_name=name,
        tier=("cuda-fp8" if fp8 else "cuda") if cuda else dev.type,
        gpu_count=torch.cuda.device_count() if torch.cuda.is_available() else 0,
        cuda_capability=tuple(torch.cuda.get_device_capability(dev)) if cuda else None,
        bf16=bf16,
        fp16=fp16,
        bf16_fast=fast(torch.bfloat16, dev),
        fp16_fast=fast(torch.float16, dev),
        autocast_dtype=str(autocast_dtype(dev)).replace("torch.", "") if (bf16 or fp16) else None,
        tf32_matmul=bool(torch.backends.cuda.matmul.allow_tf32),
        tf32_cudnn=bool(torch.backends.cudnn.allow_tf32),
        float32_matmul_precision=str(fp32_matmul_settings()["float32_matmul_precision"]),
        fp8_dtypes=hasattr(torch, "float8_e4m3fn") and hasattr(torch, "float8_e5m2"),
        fp8_matmul=fp8,
        cpu_isa=cpu_isa_flags(),
        cpu_capability=str(torch.backends.cpu.get_cpu_capability()),
        cpu_class=cpu_class(),
        torch_threads=torch.get_num_threads(),
    )


def tier(device: torch.device | str | None = None) -> str:
    """Return the device tier the notebooks adapt to: "cuda-fp8", "cuda", "mps" or "cpu".

    Introduced in notebook 00.
    """
    return capabilities(device).tier
