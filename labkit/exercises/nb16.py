"""Exercises of notebook 16 (Triton II: tiled matmul and FlashAttention, forward and backward). Introduced in
notebook 16.

Both are graded by running the learner's kernel through the launchers of :mod:`labkit.kernels` on odd shapes,
against torch in float64: the matmul's K loop (inputs in guarded buffers, every load checked against the tensors
in the interpreter), and FlashAttention's backward tile update (dQ, dK and dV against autograd of
``F.scaled_dot_product_attention``). Importing this module needs neither Triton nor a mode.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from labkit import kernels
from labkit.exercises._core import Exercise, number_grader
from labkit.exercises.nb08 import (
    _SENTINEL,
    _Case,
    _guarded,
    _output,
    _stores,
    _updates_in_loop,
    _verdict,
)
from labkit.i18n import N_
from labkit.i18n import gettext as _

__all__ = ["EXERCISES"]


def _quiet(fn: Any) -> Any:
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        if kernels.mode().interpreted:
            from labkit import traffic

            got: dict[str, Any] = {}
            strays = traffic.triton_strays(lambda: got.setdefault("r", fn()))
            return got["r"], strays.reads + strays.writes  # atomics count as both
        return fn(), 0


# --- 16.matmul-k-loop ----------------------------------------------------------------------------------------------

_EVEN = "fp32, 64 x 64 x 64 (K a multiple of BLOCK_K)"
_ODD = "fp32, 33 x 70 x 47 (odd M, K, N)"
_STRIDED = "fp32, 64 x 64 x 64, A and B transposed views"
_MM_BF16 = "bf16, 33 x 70 x 47"
_MM_BF16_WHY = N_("Right with fp32 inputs, wrong with bf16 ones. If your tl.dot takes the bf16 tiles as loaded: on a "
                  "GPU that is the right tensor-core path (bf16 products, fp32 accumulation; labkit's kernel does it "
                  "when compiled), but Triton's interpreter stores bf16 as 16-bit integers and multiplies the bit "
                  "patterns. Convert the tiles with .to(tl.float32) before tl.dot here. If you add in bf16 anywhere "
                  "else, keep the accumulator fp32.")


def _grade_matmul(answer: Any) -> tuple[bool, str] | None:
    if not _stores(answer) or not _updates_in_loop(answer, "acc"):
        return None
    kernel = kernels.as_kernel(answer)
    cases = []
    for i, (label, m, k, n, dt) in enumerate(((_EVEN, 64, 64, 64, "fp32"), (_ODD, 33, 70, 47, "fp32"),
                                              (_STRIDED, 64, 64, 64, "fp32"), (_MM_BF16, 33, 70, 47, "bf16"))):
        a0 = kernels.randn(m, k, seed=40 + i, dtype=dt)
        b0 = kernels.randn(k, n, seed=50 + i, dtype=dt)
        if label == _STRIDED:  # column-major views: the K stride of A and the N stride of B are not 1 and N
            a, b = (_guarded(t.t().contiguous(), None)[0].t() for t in (a0, b0))
        else:
            a, b = _guarded(a0, None)[0], _guarded(b0, None)[0]
        out, tail = _output(torch.empty(m, n, dtype=a0.dtype, device=a0.device))
        _result, strays = _quiet(lambda a=a, b=b, out=out: kernels.matmul(a, b, kernel=kernel, out=out))
        spilled = bool((tail != _SENTINEL).any())
        ok, worst = kernels.matmul_close(out, a0, b0)
        cases.append(_Case(label, ok and not spilled and not strays, worst, spilled, bool(torch.isnan(out).any()),
                           strays))
    return _verdict(cases, [
        (lambda c: c[_EVEN].ok and not c[_ODD].ok,
         _("Right when K is a multiple of BLOCK_K, wrong otherwise: the last step of the K loop covers columns of A "
           "and rows of B past K. Without a mask on k they read the next row of A and memory past the end of B, and "
           "those products land in the sum. Mask the K index in both loads (with 0 as the fill, which adds nothing "
           "to a dot product).")),
        (lambda c: c[_EVEN].ok and c[_ODD].ok and not c[_STRIDED].ok,
         _("Right on contiguous matrices, wrong on transposed views of the same shape: the pointers must move with "
           "each tensor's own strides (a_ptrs by BLOCK_K * stride_ak, b_ptrs by BLOCK_K * stride_bk), not by "
           "BLOCK_K or BLOCK_K * N, which hold only for a contiguous row-major A and B.")),
        (lambda c: c[_ODD].ok and not c[_MM_BF16].ok, _(_MM_BF16_WHY)),
    ], _("Matches torch.matmul on an even and an odd shape, on transposed views, and with bf16 inputs, within the "
         "fp32 accumulation bound."),
        strays_first=False)


# --- 16.flash-bwd --------------------------------------------------------------------------------------------------

_ONE = "fp32, 16 positions (one key block)"
_THREE = "fp32, 40 positions (three key blocks)"
_CAUSAL = "fp32, causal, 40 positions"


class _GradCase(_Case):
    def __init__(self, label: str, off: list[str], worst: float, strays: int) -> None:
        super().__init__(label, not off and not strays, worst, False, False, strays)
        self.off = off

    def say(self) -> str:
        if self.stray_reads:
            return _("{label}: your kernel loaded or stored {count} elements outside the tensors it was given (a "
                     "tl.atomic_add needs a mask, as a tl.store does)").format(label=self.label,
                                                                             count=self.stray_reads)
        return _("{label}: {grads} off by up to {worst:.3g}x the tolerance").format(
            label=self.label, grads=", ".join(self.off), worst=self.worst)


def _grade_flash_bwd(answer: Any) -> tuple[bool, str] | None:
    if not _updates_in_loop(answer, "dv"):
        return None
    kernel = kernels.as_kernel(answer)
    cases = []
    for i, (label, n, causal) in enumerate(((_ONE, 16, False), (_THREE, 40, False), (_CAUSAL, 40, True))):
        q, k, v, do = (kernels.randn(1, 2, n, 16, seed=60 + 4 * i + j) for j in range(4))
        o, lse = kernels.flash_attention_fwd(q, k, v, causal)
        grads, strays = _quiet(lambda q=q, k=k, v=v, o=o, lse=lse, do=do, causal=causal:
                               kernels.flash_attention_bwd(q, k, v, o, lse, do, causal, kernel=kernel))
        leaves = [t.double().requires_grad_() for t in (q, k, v)]
        F.scaled_dot_product_attention(*leaves, is_causal=causal).backward(do.double())
        checks = {name: kernels.close(g, t.grad) for name, g, t in zip(("dQ", "dK", "dV"), grads, leaves, strict=True)}
        off = [name for name, (ok, _worst) in checks.items() if not ok]
        cases.append(_GradCase(label, off, max(w for _ok, w in checks.values()), strays))
    return _verdict(cases, [
        (lambda c: c[_ONE].ok and not c[_THREE].ok and c[_THREE].off == ["dQ"],
         _("dK and dV are right, dQ is right only with a single key block: every key block adds its share to the "
           "same rows of dQ, so a plain store keeps one share (the last program's in the interpreter; on a GPU a "
           "race). The shares must be added up in memory, atomically.")),
        (lambda c: "dV" not in c[_THREE].off and "dK" in c[_THREE].off,
         _("dV is right but dK (and dQ) are not: the gradient of the scores. Through the softmax, dS = P * (dP - "
           "delta) row by row, with delta = rowsum(dO * O) given to the kernel; and S = Q K^T * scale, so dK and dQ "
           "carry the scale too.")),
        (lambda c: "dV" in c[_ONE].off,
         _("dV is off already with one key block: dV sums P^T dO over the query blocks, with P recomputed from the "
           "saved logsumexp (already done above the update) and the masked entries zero.")),
    ], _("dQ, dK and dV match autograd of F.scaled_dot_product_attention with one and several key blocks, causal "
         "too."),
        strays_first=False)


# --- 16.causal-tiles ----------------------------------------------------------------------------------------------

_NO_STOP = ("That is every query block walking every key tile, the loop without the causal stop: the tiles past a "
            "block's diagonal are entirely masked, and the complete kernel never loads them.")
_HALF = N_("Half of the full count drops the diagonal tiles, but each query block needs its diagonal tile too: it "
           "holds the keys up to the block's own rows, partly masked.")


def _grade_causal_tiles(answer: Any) -> tuple[bool, str]:
    ok, message = number_grader(15.0, _("the number of K tiles"))(answer)
    if not ok and not isinstance(message, str | type(None)):
        return ok, message  # a slip of form
    if not ok and answer in (25, 25.0):
        return False, _NO_STOP
    if not ok and answer in (12.5, 10, 10.0):
        return False, _(_HALF)
    return ok, message


EXERCISES = [
    Exercise("16.matmul-k-loop", "Write the K loop of a tiled matmul kernel: load the A and B tiles, accumulate, "
             "advance.", _grade_matmul,
             "Each step of the loop covers BLOCK_K columns of A and as many rows of B. What must the last step not "
             "read, and what fill value leaves a dot product unchanged?",
             method="For each step k: load the A tile and the B tile at the current pointers, each with a mask "
                    "that keeps M (or N) in range and also the K index below K - k, filling masked entries with "
                    "zero; accumulate their product into the fp32 acc with tl.dot (tiles converted to fp32, IEEE "
                    "precision); then move both pointer blocks BLOCK_K elements along K, using each tensor's own "
                    "K stride.",
             solution="for k in range(0, K, BLOCK_K):\n"
                      "    a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < K - k), other=0.0)\n"
                      "    b = tl.load(b_ptrs, mask=(offs_k[:, None] < K - k) & (offs_n[None, :] < N), other=0.0)\n"
                      "    acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision='ieee')\n"
                      "    a_ptrs += BLOCK_K * stride_ak\n"
                      "    b_ptrs += BLOCK_K * stride_bk",
             kind="implement", reference=kernels.KernelRef("matmul_kernel"),
             wrong=kernels.KernelRef("matmul_no_k_mask"),
             wrong_why="The loads mask M and N but not K: when K is not a multiple of BLOCK_K, the last step reads "
                       "past K (the next row of A, memory past B's end) and adds those products to the sum."),
    Exercise("16.flash-bwd", "Write FlashAttention's backward tile update: dV, dP, dS, dK, and this tile's share of "
             "dQ.", _grade_flash_bwd,
             "Differentiate O = P V, then the softmax row by row, then S = Q K^T * scale. Which of dQ, dK, dV does "
             "this program own alone, and which does it share with the other key blocks?",
             method="With P recomputed: dV gets P transposed times dO; dP is dO times V transposed; the softmax's "
                    "backward turns dP into dS by subtracting each row's delta and multiplying by P elementwise; dK "
                    "gets dS transposed times Q, dQ's share is dS times K, both times the scale. dK and dV stay in "
                    "registers (this program owns its keys); dQ's rows are shared by every key block, so the share "
                    "is added into memory atomically.",
             solution="dv += tl.dot(tl.trans(p), do, input_precision='ieee')\n"
                      "dp = tl.dot(do, tl.trans(v), input_precision='ieee')\n"
                      "ds = p * (dp - delta[:, None])\n"
                      "dk += tl.dot(tl.trans(ds), q, input_precision='ieee') * scale\n"
                      "tl.atomic_add(dq_ptr + q_offs, tl.dot(ds, k, input_precision='ieee') * scale, "
                      "mask=m_mask[:, None])",
             kind="implement", reference=kernels.KernelRef("flash_bwd_kernel"),
             wrong=kernels.KernelRef("flash_bwd_dq_store"),
             wrong_why="dQ is written with tl.store: each key block's program overwrites the share the others wrote, "
                       "so dQ holds one key block's contribution (on a GPU, whichever program stored last)."),
    Exercise("16.causal-tiles", "With N = 160 and BLOCK_M = BLOCK_N = 32, how many K tiles does the causal forward "
             "kernel load in all, over the query blocks of one head?", _grade_causal_tiles,
             "Which key tiles can a query block's rows attend to at all, with the causal mask?",
             method="Number the query blocks from 0. Block i holds the rows from i * BLOCK_M up to its last row; the "
                    "causal loop stops at min((i + 1) * BLOCK_M, N), so it loads the key tiles up to and including "
                    "its diagonal tile. Count the tiles per block and add over all the blocks.",
             solution="5 query blocks; block i loads the tiles 0 .. i, i + 1 of them: 1 + 2 + 3 + 4 + 5 = 15, "
                      "against 5 x 5 = 25 without the stop.",
             kind="compute", reference=15, wrong=25, wrong_why=_NO_STOP),
]
