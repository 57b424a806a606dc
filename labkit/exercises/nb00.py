"""Exercises of notebook 00 (environment check). Introduced in notebook 00."""

from __future__ import annotations

from collections.abc import Callable

from labkit.exercises._core import Exercise, FormatSlip
from labkit.i18n import gettext as _

__all__ = ["EXERCISES"]

_DEVICE_WHY = ("That is not the device pick_device() chose here. It takes a CUDA GPU if torch sees one, else "
               "Apple's MPS, else the CPU, and $LABKIT_DEVICE overrides it: ask it on the machine you run on "
               "instead of answering for the machine you think you are on.")


def _grade_device(answer: object) -> tuple[bool, str]:
    from labkit.device import pick_device

    want = pick_device().type
    got = str(answer).strip().lower()
    if got == want:
        return True, ""
    if got in ("cpu", "cuda", "mps"):
        return False, _DEVICE_WHY
    return False, FormatSlip(_("Give the device type as a string: 'cpu', 'cuda' or 'mps'."))


_DTYPE_WHY = ("That is the other half-precision dtype. labkit prefers the one that is fast here, bf16 first, and "
              "otherwise the one that computes, bf16 first: bf16 has fp32's exponent range and needs no "
              "GradScaler, so fp16 is chosen only where bf16 is missing or emulated (a V100, a T4).")


def _grade_dtype(answer: object) -> tuple[bool, str]:

    from labkit.device import autocast_dtype

    want = str(autocast_dtype()).replace("torch.", "")
    got = "" if isinstance(answer, (bool, int, float)) else str(answer).strip().lower().replace("torch.", "")
    got = {"bf16": "bfloat16", "fp16": "float16", "half": "float16"}.get(got, got)
    if got == want:
        return True, ""
    if got in ("bfloat16", "float16"):
        return False, _DTYPE_WHY
    return False, FormatSlip(_("Give a torch.dtype (e.g. torch.bfloat16) or its name."))


class _AtGradeTime:
    """An answer computed when it is graded, not on import: the right (or a wrong) value on this machine."""

    def __init__(self, fn: Callable[[], str], what: str) -> None:
        self._fn, self._what = fn, what

    def __str__(self) -> str:
        return self._fn()

    def __repr__(self) -> str:
        return f"<{self._what}>"


def _picked() -> str:
    from labkit.device import pick_device

    return pick_device().type


def _not_picked() -> str:
    return "cuda" if _picked() != "cuda" else "cpu"


def _autocast_name() -> str:
    from labkit.device import autocast_dtype

    return str(autocast_dtype()).replace("torch.", "")


def _other_dtype() -> str:
    # the typical mistake: the other half-precision dtype
    return "float16" if _autocast_name() != "float16" else "bfloat16"


_BOTTLENECKS = {"compute", "memory bandwidth", "communication"}
_SCENARIOS = {
    "a 8192x8192 bf16 matmul": "compute",
    "adding a bias to a 1 GB activation tensor": "memory bandwidth",
    "all-reducing 1 GB of gradients between two nodes": "communication",
}
_BIAS_WHY = ("Adding a bias does one FLOP per element it reads and writes: about 1/4 FLOP per byte in bf16. The "
             "arithmetic units finish long before the next bytes arrive, so the add waits on memory bandwidth, "
             "however fast the units are.")


def _grade_bottlenecks(answer: object) -> tuple[bool, str]:
    if not isinstance(answer, dict):
        return False, FormatSlip(_("Give a dict {scenario: bottleneck}."))
    norm = {str(k): str(v).strip().lower() for k, v in answer.items()}
    unknown = set(norm.values()) - _BOTTLENECKS
    if unknown:
        return False, FormatSlip(_("Bottlenecks are named {names}, not {unknown}.").format(
            names=sorted(_BOTTLENECKS), unknown=sorted(unknown)))
    wrong = [k for k, v in _SCENARIOS.items() if norm.get(k) != v]
    if not wrong:
        return True, ""
    if wrong == ["adding a bias to a 1 GB activation tensor"] and norm[wrong[0]] == "compute":
        return False, _BIAS_WHY
    return False, _("{wrong} of {total} scenarios are off: {scenarios}.").format(
        wrong=len(wrong), total=len(_SCENARIOS), scenarios=", ".join(wrong))


# ---- 00.matmul-vs-add: predict, then run ------------------------------------------------------------
_WINNERS = ("matmul", "add", "about the same")
_FLOPS_WHY = ("A FLOP is not a FLOP: the add does 1 FLOP per 12 bytes it moves (read two fp32 numbers, write one) "
              "and waits on memory, while a 512x512 matmul does 2n^3 FLOPs on 3n^2 numbers, about 85 FLOPs per "
              "byte, and keeps the arithmetic units busy. Same hardware, orders of magnitude apart.")


def _grade_flops(pair: object) -> tuple[bool, str]:
    if not (isinstance(pair, tuple) and len(pair) == 2):
        return False, FormatSlip(_("predict() records your prediction and reveal() passes the measurement: "
                                   "call them, not check()."))
    pred, result = pair
    pred = str(pred).strip().lower() if isinstance(pred, str) else pred
    if pred not in _WINNERS:
        return False, FormatSlip(_("Predict one of {choices}.").format(choices=list(_WINNERS)))
    if result not in _WINNERS:
        raise ValueError(_("the measured winner must be one of {choices}, got {result!r}").format(
            choices=_WINNERS, result=result))
    if pred == result == "matmul":
        return True, _("The matmul reuses every number it loads about n times, so it runs at the speed of the "
                       "arithmetic units; the add moves 12 bytes per FLOP and runs at the speed of memory.")
    if pred == result:
        return True, _("Your prediction matches what this machine measured.")
    if pred == "about the same" and result == "matmul":
        return False, _FLOPS_WHY
    if result == "matmul":
        return False, _("The add has far less arithmetic to do, but that is not what limits it: it waits for "
                        "memory, 12 bytes per FLOP, while the matmul reuses each loaded number about n times.")
    return False, _("This machine measured {result!r}, which is unusual: run the timing cell again (another "
                    "program may have been running) before you trust it.").format(result=result)


def _measure_flops_winner() -> str:
    """The race of 00.matmul-vs-add, run again: a 512 x 512 fp32 matmul against an add of two 16 MB fp32 vectors on
    the CPU on one thread, FLOP/s from the median of 5 timings after a warm-up each; a factor of 2 either way is
    'about the same' (the notebook's rule)."""
    import statistics
    import time

    import torch

    a, big = torch.randn(512, 512), torch.randn(16 * 2**20 // 4)

    def median_time(fn: Callable[[], object]) -> float:
        fn()
        times = []
        for _unused in range(5):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the notebook's race: one core each
    try:
        mm, add = 2 * 512**3 / median_time(lambda: a @ a), big.numel() / median_time(lambda: big + big)
    finally:
        torch.set_num_threads(threads)
    return "matmul" if mm > 2 * add else "add" if add > 2 * mm else "about the same"


EXERCISES = [
    Exercise("00.device", "Which device type does labkit.device.pick_device() choose on this machine?",
             _grade_device,
             "Don't guess from the machine you think you are on: ask labkit.",
             method="labkit's device gate, labkit.device, has one function that picks the device every notebook "
                    "uses (help(device) lists them). Ask it here, and read which kind of torch.device it returns.",
             solution="answer = device.pick_device().type  # 'cpu' here; 'cuda' on a GPU node; 'mps' on a Mac",
             kind="recall", wrong_why=_DEVICE_WHY,
             reference=_AtGradeTime(_picked, "pick_device().type"),
             wrong=_AtGradeTime(_not_picked, "a device type that pick_device() does not choose")),
    Exercise("00.autocast-dtype", "Which dtype does autocast use here by default?", _grade_dtype,
             "Two 16-bit dtypes exist; labkit's device gate decides between them from what this machine can do.",
             method="The device gate (labkit.device) has a function for exactly this question; help(device) lists "
                    "them. It asks two questions in turn, 'is it fast here?' and 'does it compute here?', each for "
                    "bf16 first, then fp16.",
             solution="answer = device.autocast_dtype()  # bf16 where it is fast; else fp16 where that is fast "
                      "(a V100, a T4); else whichever computes",
             kind="recall", wrong_why=_DTYPE_WHY,
             reference=_AtGradeTime(_autocast_name, "autocast_dtype()"),
             wrong=_AtGradeTime(_other_dtype, "the other half-precision dtype")),
    Exercise("00.bottlenecks", "Name the bottleneck of each scenario.", _grade_bottlenecks,
             "For each one ask: what does it mostly do, arithmetic, moving bytes within a machine, or moving "
             "bytes between machines?",
             method="Compare FLOPs with bytes moved (the arithmetic intensity): an n×n matmul does 2n³ FLOPs on "
                    "3n² numbers; an elementwise op does about one FLOP per element read and written; anything "
                    "that crosses the network waits for the network.",
             solution="matmul: compute (thousands of FLOPs per byte at n = 8192); bias add: memory bandwidth "
                      "(~1/4 FLOP per byte); all-reduce between nodes: communication.",
             kind="recall", wrong_why=_BIAS_WHY,
             reference=dict(_SCENARIOS),
             wrong={**_SCENARIOS, "adding a bias to a 1 GB activation tensor": "compute"}),
    Exercise("00.matmul-vs-add",
             "Predict, then run: which reaches more FLOP/s on this machine, a 512x512 fp32 matmul or an add of "
             "two 16 MB fp32 vectors (one FLOP per element)? 'matmul', 'add' or 'about the same'.",
             _grade_flops,
             "Count what each one has to move for every FLOP it does.",
             method="Arithmetic intensity: the add reads 8 bytes and writes 4 per FLOP; the matmul does 2n³ FLOPs "
                    "on 3n² numbers. The lower the intensity, the more the op waits on memory instead of computing.",
             solution="prediction = 'matmul': ~85 FLOP/byte against 1/12 FLOP/byte, so the matmul runs at the "
                      "speed of the arithmetic units and the add at the speed of memory (here 50-200x apart).",
             kind="predict", wrong_why=_FLOPS_WHY,
             reference=("matmul", "matmul"), wrong=("about the same", "matmul"), measure=_measure_flops_winner),
]
