"""Exercises of notebook 15 (serving: latency, load and batching).

The percentile exercise runs the learner's function on fresh lists; the others compute their answers with
:mod:`labkit.serving`, the functions the notebook uses. Introduced in notebook 15.
"""

from __future__ import annotations

import math
import random
from typing import Any

from labkit.exercises._core import Exercise, FormatSlip
from labkit.exercises._graders import number
from labkit.i18n import N_
from labkit.i18n import gettext as _
from labkit.inference import percentile
from labkit.serving import kv_cache_bytes_per_token

__all__ = ["EXERCISES"]


# ---- 15.p99 --------------------------------------------------------------------------------------------
def _off_by_one_p99(values: list[float]) -> float:
    """The typical mistake: index int(0.99 n) of the sorted list, which is the maximum for n = 100."""
    s = sorted(values)
    return s[min(int(0.99 * len(s)), len(s) - 1)]


def _reference_p99(values: list[float]) -> float:
    s = sorted(values)
    return s[math.ceil(0.99 * len(s)) - 1]


_P99_WHY = N_("sorted(x)[int(0.99 * n)] is one place too far: with 100 latencies it returns the largest, which is "
              "the 100th percentile. Nearest ranks count from 1 and round up; list indices count from 0.")


def _grade_p99(fn: Any) -> tuple[bool, str] | None:
    if not callable(fn):
        return False, FormatSlip(_("Define a function p99(latencies) and pass the function itself."))
    rng = random.Random(15)
    cases = [[float(i) for i in range(1, 101)], [rng.expovariate(1.0) for _i in range(1000)],
             [rng.uniform(1, 2) for _i in range(37)], [5.0], [3.0, 1.0, 2.0],
             [rng.uniform(1, 2) for _i in range(60)], [rng.expovariate(1.0) for _i in range(250)]]  # where rounding rules differ
    for vals in cases:
        got = fn(list(vals))
        if got is None or got is Ellipsis:
            return None
        if hasattr(got, "item") and callable(got.item) and getattr(got, "size", 1) == 1:
            got = got.item()                                 # a numpy or torch scalar is a number too
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            return False, FormatSlip(_("Return one number: the latency that 99 % of the requests do not exceed."))
        want = percentile(vals, 99)
        if got != want:
            if len(vals) == 100 and got == max(vals):
                return False, _(_P99_WHY)
            if got not in vals:
                return False, _("For {n} latencies you return {got!r}, which is not one of them: the nearest-rank "
                                "percentile never interpolates, it returns an observed latency.").format(
                    n=len(vals), got=got)
            return False, _("For {n} latencies you return {got!r}; P99 (nearest rank) is {want!r}.").format(
                n=len(vals), got=got, want=want)
    return True, _("Nearest rank: sorted(x)[ceil(0.99 n) - 1], an observed latency, never an interpolation.")


# ---- 15.kv-bytes ---------------------------------------------------------------------------------------
_KV = kv_cache_bytes_per_token(40, 40, 128, 2)
_KV_WHY = {_KV / 2: N_("Half of it: one factor of 2 is missing. Every token keeps a key *and* a value vector, and "
                        "fp16 takes 2 bytes per value."),
           _KV / 40: N_("A factor of 40 is missing: every layer keeps keys and values, for every one of its KV heads."),
           _KV * 8: N_("That is in bits: the question asks for bytes.")}

# ---- 15.omission ---------------------------------------------------------------------------------------
_OMISSION_WHY = {1.0: N_("That is the closed-loop client's count: it waits for the reply before sending the next "
                         "request, so during the stall it sends nothing. Users kept arriving at 1000 per second."),
                 100.0: N_("Not all of them: a request that arrives near the end of the stall waits only a little."),
                 70_000.0: N_("Mind the units: the rate is per second, the stall lasts a tenth of one.")}


EXERCISES = [
    Exercise("15.p99",
             "Write p99(latencies): the 99th percentile by nearest rank (an observed latency, not interpolated).",
             _grade_p99,
             "Sort the latencies first; P99 is one of them.",
             method="The nearest rank of the q-th percentile of n values is ceil(q/100 × n), counted from 1.",
             solution="def p99(latencies):\n    s = sorted(latencies)\n    return s[math.ceil(0.99 * len(s)) - 1]",
             kind="implement", wrong_why=_P99_WHY,
             reference=_reference_p99, wrong=_off_by_one_p99),
    Exercise("15.kv-bytes",
             "The KV-cache bytes one token takes in Llama-2 13B (40 layers, 40 KV heads of 128) in fp16.",
             number(_KV, N_("the bytes per token"), _KV_WHY),
             "For every token, what does each layer keep, and for how many heads?",
             method="Per token: a key and a value vector (2) in every layer, for every KV head, each head_dim values "
                    "of 2 bytes in fp16.",
             solution="answer = 2 * 40 * 40 * 128 * 2 = 819,200 bytes (0.78 MiB) per token.",
             kind="compute", wrong_why=_KV_WHY[_KV / 2],
             reference=_KV, wrong=_KV / 2),
    Exercise("15.omission",
             "Arrivals at 1000/s, one 100 ms stall of an otherwise instantaneous server: how many requests do their "
             "users see delayed by at least 30 ms?",
             number(70.0, N_("the number of requests"), _OMISSION_WHY, rel=0.0142),  # 70; 69 and 71 are off by one
             "Which arrivals have waited at least 30 ms by the time the server comes back?",
             method="A request that arrives t seconds into the stall waits 0.1 - t seconds. Find the arrival times "
                    "for which that is at least 0.03 s, and count the arrivals in that window at 1000 per second.",
             solution="answer = 1000 * (0.100 - 0.030) = 70 requests (a closed-loop client would have recorded 1).",
             kind="compute", wrong_why=_OMISSION_WHY[1.0],
             reference=70.0, wrong=1.0),
]
