"""Exercises of notebook 08 (fused kernels in Triton). Introduced in notebook 08.

The kernel exercises are graded by running the learner's ``@triton.jit`` kernel (in Triton's interpreter on a CPU,
compiled on a GPU) through the launchers of :mod:`labkit.kernels`, on fresh inputs, against torch (computed in float64 on the same values). Inputs and
outputs sit inside larger buffers: the input's tail is poisoned with NaN and the output's tail holds a sentinel,
so a kernel without a mask is caught reading or writing past the end. Each grader tries the cases in an order
that tells the typical mistakes apart (a size that needs the mask, large inputs, bf16 inputs, several key blocks).

Importing this module needs neither Triton nor a mode: the reference answers and the typical mistakes are
:class:`labkit.kernels.KernelRef` names, resolved when a grader runs.
"""

from __future__ import annotations

import ast
import inspect
import math
import textwrap
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from labkit import kernelbench, kernels
from labkit.exercises._core import Exercise, FormatSlip
from labkit.exercises._graders import as_number
from labkit.i18n import N_
from labkit.i18n import gettext as _

__all__ = ["EXERCISES"]

_SENTINEL = 7.0  # exact in every float format: an output tail still holding it was not written


def _fn_of(answer: Any) -> Any:
    if isinstance(answer, kernels.KernelRef):
        return None
    fn = getattr(answer, "fn", answer)
    return fn if inspect.isfunction(fn) else None


def _tree(answer: Any) -> ast.AST | None:
    fn = _fn_of(answer)
    if fn is None:
        return None
    try:
        return ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return None


def _stores(answer: Any) -> bool:
    """Whether a kernel's body calls ``tl.store`` at all (a kernel that stores nothing is not written yet)."""
    tree = _tree(answer)
    if tree is None:
        return True
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "store"
               for n in ast.walk(tree))


def _updates_in_loop(answer: Any, name: str) -> bool:
    """Whether a kernel assigns ``name`` inside a ``for`` loop (the online-softmax update)."""
    tree = _tree(answer)
    if tree is None:
        return True
    for loop in (n for n in ast.walk(tree) if isinstance(n, ast.For)):
        for n in ast.walk(loop):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AugAssign) else []
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
    return False


def _guarded(t: torch.Tensor, fill: float | None, pad: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """``t`` copied into the front of a longer buffer; returns (view shaped like t, the tail after it)."""
    buf = torch.full((t.numel() + pad,), math.nan if fill is None else fill, dtype=t.dtype, device=t.device)
    view = buf[: t.numel()].view(t.shape)
    view.copy_(t)
    return view, buf[t.numel():]


def _output(like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    out, tail = _guarded(torch.full_like(like, math.nan), _SENTINEL)
    return out, tail


class _Case:
    def __init__(self, label: str, ok: bool, worst: float, spilled: bool, unwritten: bool,
                 stray_reads: int = 0) -> None:
        self.label, self.ok, self.worst, self.spilled, self.unwritten = label, ok, worst, spilled, unwritten
        self.stray_reads = stray_reads

    def say(self) -> str:
        if self.spilled:
            return _("{case}: your kernel wrote past the end of the output").format(case=self.label)
        if self.stray_reads:
            return _("{case}: your kernel read {count} elements outside the tensors it was given").format(
                case=self.label, count=self.stray_reads)
        if self.unwritten:
            return _("{case}: some outputs are NaN (never written, or computed as NaN: an inf - inf or 0 / 0)").format(
                case=self.label)
        return _("{case}: off by up to {worst:.3g}x the tolerance").format(case=self.label, worst=self.worst)


def _run(label: str, launcher: Callable[..., Any], like: torch.Tensor, want: torch.Tensor,
         tol: tuple[float, float] | None = None, **kwargs: Any) -> tuple[_Case, Any]:
    """Launch ``launcher(**kwargs, out=...)`` into a guarded output shaped like ``like``; compare with ``want``.

    In the interpreter every load and store is also checked against the tensors of the launch
    (:func:`labkit.traffic.triton_strays`): a read past the end of an input is caught even when the store is
    masked and the output looks right. Compiled on a GPU only the guard zones remain.
    """
    from labkit import traffic

    out, tail = _output(like)
    got: dict[str, Any] = {}

    def launch() -> None:
        got["result"] = launcher(**kwargs, out=out)

    with warnings.catch_warnings(), np.errstate(all="ignore"):  # a wrong kernel's overflows: graded, not printed
        warnings.simplefilter("ignore", RuntimeWarning)
        if kernels.mode().interpreted:
            stray_reads = traffic.triton_strays(launch).reads
        else:
            launch()
            stray_reads = 0
    spilled = bool((tail != _SENTINEL).any())
    unwritten = bool(torch.isnan(out).any()) and not bool(torch.isnan(want).any())
    ok, worst = kernels.close(out, want, tol=tol)
    return _Case(label, ok and not spilled and not stray_reads, worst, spilled, unwritten, stray_reads), \
        got["result"]


_MASK = N_("Right when the size is a multiple of BLOCK, wrong otherwise: the mask. The last program's lanes past "
           "the end must be switched off in tl.load (with a harmless `other`) and in tl.store.")
_BF16 = N_("Right with fp32 inputs, wrong with bf16 ones: your arithmetic runs in bf16. Convert right after loading "
           "(`.to(tl.float32)`) and convert back only when storing. On a GPU bf16 sums lose digits; Triton's "
           "interpreter even computes garbage, since it stores bf16 as 16-bit integers.")


def _verdict(cases: list[_Case], diagnoses: list[tuple[Callable[[dict[str, _Case]], bool], str]],
             success: str, strays_first: bool = True) -> tuple[bool, str]:
    by = {c.label: c for c in cases}
    if all(c.ok for c in cases):
        return True, success
    strays = [c for c in cases if c.stray_reads]
    if strays_first and strays and not any(c.spilled for c in cases):
        return False, _("{case}: your kernel read {count} elements past the end of its inputs. The stores are "
                        "masked, so the output looked right, but a load without the mask reads memory that is not "
                        "the tensor's: on a GPU an illegal-address fault or another tensor's bytes. Every tl.load "
                        "needs the same mask as its tl.store.").format(case=strays[0].label,
                                                                       count=strays[0].stray_reads)
    for test, message in diagnoses:
        if test(by):
            return False, message
    failing = "; ".join(c.say() for c in cases if not c.ok)
    return False, _("Compared with torch: {failures}.").format(failures=failing)


# --- 08.bias-gelu -------------------------------------------------------------------------------------------------


def _grade_bias_gelu(answer: Any) -> tuple[bool, str] | None:
    if not _stores(answer):
        return None
    kernel = kernels.as_kernel(answer)
    cases = []
    for label, rows, cols, dt in (("fp32, 4 x 64 = 4 blocks of 64", 4, 64, "fp32"),
                                  ("fp32, 3 x 50 = 150 elements", 3, 50, "fp32"),
                                  ("bf16, 3 x 50", 3, 50, "bf16")):
        inp = kernelbench.make_inputs("bias_gelu", rows, cols, dt, seed=11)
        x, _tail = _guarded(inp["x"], None)
        want = F.gelu(inp["x"].double() + inp["bias"].double())
        cases.append(_run(label, kernels.bias_gelu, x, want, x=x, bias=inp["bias"], kernel=kernel, block=64)[0])
    return _verdict(cases, [
        (lambda c: c["fp32, 4 x 64 = 4 blocks of 64"].ok and not c["fp32, 3 x 50 = 150 elements"].ok, _(_MASK)),
        (lambda c: c["fp32, 3 x 50 = 150 elements"].ok and not c["bf16, 3 x 50"].ok, _(_BF16)),
    ], _("Matches F.gelu(x + b) in fp32 and, for bf16 inputs, within one bf16 ulp, with a size that needs the mask."))


# --- 08.softmax ---------------------------------------------------------------------------------------------------

_BELOW = "fp32, 50 columns, all below -100"


def _grade_softmax(answer: Any) -> tuple[bool, str] | None:
    if not _stores(answer):
        return None
    kernel = kernels.as_kernel(answer)
    cases = []
    for label, rows, cols, dt, scale in (("fp32, 64 columns", 4, 64, "fp32", 1.0),
                                         ("fp32, 50 columns", 4, 50, "fp32", 1.0),
                                         ("fp32, inputs up to ~500", 4, 64, "fp32", 80.0),
                                         (_BELOW, 4, 50, "fp32", 1.0),
                                         ("bf16, 50 columns", 4, 50, "bf16", 1.0)):
        x0 = kernelbench.make_inputs("softmax", rows, cols, dt, seed=12)["x"] * scale - (200.0 if label == _BELOW
                                                                                        else 0.0)
        x, _tail = _guarded(x0, None)
        cases.append(_run(label, kernels.softmax, x, torch.softmax(x0.double(), -1), x=x, kernel=kernel)[0])
    return _verdict(cases, [
        (lambda c: c["fp32, 64 columns"].ok and not c["fp32, inputs up to ~500"].ok,
         _("Right for small inputs, wrong (inf/NaN) for large ones: subtract the row max before tl.exp. exp(x) "
           "overflows fp32 above x = 88.7; exp(x - max) is at most 1, and the ratio is unchanged.")),
        (lambda c: c["fp32, 64 columns"].ok and not c["fp32, 50 columns"].ok,
         _("Right when the row fills the block, wrong with 50 columns in a block of 64: the mask. Masked lanes must "
           "load -inf (so that exp gives 0 and the max ignores them), and must not be stored.")),
        (lambda c: c["fp32, 50 columns"].ok and not c[_BELOW].ok,
         _("Right on ordinary rows, NaN on a row whose values all lie below -104: the lanes past the end load 0, and "
           "that 0 wins the row max. Every real exp(x - max) then underflows to 0, the sum is 0, and 0/0 is NaN. "
           "Zeroing those lanes after exp does not help; what they load must never win the max.")),
        (lambda c: c["fp32, 50 columns"].ok and not c["bf16, 50 columns"].ok, _(_BF16)),
    ], _("Matches torch.softmax in fp32 (also for inputs in the hundreds, and for a row far below zero) and, for "
         "bf16, within one bf16 ulp."))


# --- 08.layernorm -------------------------------------------------------------------------------------------------


_CONSTANT = "fp32, 50 columns, one row constant"
_OFFSET = "fp32, rows of 1000 + 1e-3 N(0,1)"
#: The tolerance of the offset case: fp32 knows x near 1000 to ~6e-5, so the mean itself is uncertain by about
#: that, and rstd (~300 here) magnifies it in y: torch's own fp32 F.layer_norm is off by ~0.03 there. A two-pass
#: variance keeps rstd within 1e-2 of float64's; the one-pass E[x^2] - E[x]^2 loses every digit (or goes negative).
_OFFSET_TOL, _OFFSET_RSTD_RTOL = (0.0, 0.1), 1e-2


def _grade_layernorm(answer: Any) -> tuple[bool, str] | None:
    if not _stores(answer):
        return None
    kernel = kernels.as_kernel(answer)
    cases, stats_bad = [], set()
    for label, cols, dt in (("fp32, 64 columns", 64, "fp32"), ("fp32, 50 columns", 50, "fp32"),
                            (_CONSTANT, 50, "fp32"), (_OFFSET, 50, "fp32"),
                            ("bf16, 50 columns around 8", 50, "bf16")):
        inp = kernelbench.make_inputs("layernorm", 4, cols, dt, seed=13)
        x0, w, b = inp["x"] + (7.0 if dt == "bf16" else 0.0), inp["weight"], inp["bias"]
        if label == _CONSTANT:
            x0[1] = 3.0  # variance 0: only eps keeps rstd finite
        elif label == _OFFSET:
            x0 = kernels.randn(4, cols, seed=13, shift=1000.0, scale=1e-3)
        x, _tail = _guarded(x0, None)
        want, want_mean, want_rstd = torch.ops.aten.native_layer_norm(x0.double(), [cols], w.double(), b.double(), 1e-5)
        case, (_y, mean, rstd) = _run(label, kernels.layernorm, x, want, tol=_OFFSET_TOL if label == _OFFSET else None,
                                     x=x, weight=w, bias=b, eps=1e-5, kernel=kernel)
        if label == _OFFSET:  # graded on rstd, the variance's own error
            case.ok = case.ok and kernels.close(rstd, want_rstd.view(-1), tol=(_OFFSET_RSTD_RTOL, 0.0))[0]
        elif case.ok and not (kernels.close(mean, want_mean.view(-1))[0]
                              and kernels.close(rstd, want_rstd.view(-1))[0]):
            stats_bad.add(label)  # y right, the stored statistics not
        cases.append(case)
    by = {c.label: c for c in cases}
    ordinary = {"fp32, 64 columns", "fp32, 50 columns"}
    stats_wrong = stats_bad & ordinary if all(by[k].ok for k in ordinary) else set()
    if stats_wrong or (all(c.ok for c in cases) and stats_bad - {_CONSTANT}):
        return False, _("y is right, but the mean and rstd you store per row differ from native_layer_norm's (rstd "
                        "is 1 / sqrt(var + eps), not the standard deviation; both go to mean_ptr + row and rstd_ptr "
                        "+ row).")
    if by["fp32, 50 columns"].ok and _CONSTANT in stats_bad:
        return False, _("y is right, but on a constant row (variance 0) the rstd you store is not 1 / sqrt(eps): "
                        "eps belongs inside the square root, rstd = 1 / sqrt(var + eps), as torch defines LayerNorm.")
    return _verdict(cases, [
        (lambda c: c["fp32, 64 columns"].ok and not c["fp32, 50 columns"].ok,
         _("Right when the row fills the block, wrong with 50 columns: masked lanes must count neither in the mean "
           "(load them as 0) nor in the variance (zero x - mean there with tl.where), and must not be stored.")),
        (lambda c: c["fp32, 50 columns"].ok and not c[_CONSTANT].ok,
         _("Right on ordinary rows, NaN (or inf) on a constant row: its variance is exactly 0, and without eps "
           "inside the square root, 1 / sqrt(0) is inf and 0 * inf is NaN. eps is part of LayerNorm's definition, "
           "not an optional guard.")),
        (lambda c: c["fp32, 50 columns"].ok and not c[_OFFSET].ok,
         _("Right on rows around 1, wrong on rows of 1000 + 1e-3 N(0,1): the variance is computed as E[x^2] - "
           "E[x]^2, the difference of two numbers near 10^6 that agree in every digit fp32 keeps (catastrophic "
           "cancellation: the result is rounding noise, often negative). Centre first, then square.")),
        (lambda c: c["fp32, 50 columns"].ok and not c["bf16, 50 columns around 8"].ok, _(_BF16)),
    ], _("y, mean and rstd match torch's native_layer_norm (fp32), also on a constant row and on rows of 1000 + "
         "1e-3 N(0,1) (rstd within 1e-2, y within 0.1: fp32's own limit there), and bf16 inputs within one bf16 "
         "ulp."))


# --- 08.flash-attention -------------------------------------------------------------------------------------------


def _grade_flash(answer: Any) -> tuple[bool, str] | None:
    """Grade the online-softmax update. A query row whose *first* key tile is fully masked would start with
    m_new = -inf and exp(-inf - -inf) = NaN; the workbook's masks cannot produce one (the loop starts at key 0,
    which the causal mask keeps for every query, and the length mask removes keys only from the last tile), so
    no case tests it; a kernel with padding or sliding-window masks must guard it (notebook 08 says how)."""
    if not _updates_in_loop(answer, "acc"):
        return None
    kernel = kernels.as_kernel(answer)
    cases = []
    for i, (label, n, causal, dt) in enumerate((("fp32, 32 keys (one key block)", 32, False, "fp32"),
                                                ("fp32, 80 keys (three key blocks)", 80, False, "fp32"),
                                                ("fp32, causal, 80 keys", 80, True, "fp32"),
                                                ("bf16, 80 keys", 80, False, "bf16"))):
        q0, k0, v0 = (kernels.randn(1, 2, n, 16, seed=20 + 3 * i + j, dtype=dt) for j in range(3))
        q, k, v = (_guarded(t, None)[0] for t in (q0, k0, v0))
        want = F.scaled_dot_product_attention(q0.double(), k0.double(), v0.double(), is_causal=causal)
        cases.append(_run(label, kernels.flash_attention, q, want, q=q, k=k, v=v, causal=causal, kernel=kernel)[0])
    return _verdict(cases, [
        (lambda c: c["fp32, 32 keys (one key block)"].ok and not c["fp32, 80 keys (three key blocks)"].ok,
         _("Right with one key block, wrong with several: when a new block raises the running max, what you summed "
           "so far (l_i and acc) still counts against the old max, and the new block's terms against the new one.")),
        (lambda c: c["fp32, 80 keys (three key blocks)"].ok and not c["bf16, 80 keys"].ok, _(_BF16)),
    ], _("Matches F.scaled_dot_product_attention with one and several key blocks, causal, and bf16 inputs."))


# --- 08.softmax-bytes (predict, then run) ---------------------------------------------------------------------------


def _grade_bytes(answer: Any) -> tuple[bool, str]:
    if not (isinstance(answer, tuple) and len(answer) == 2):
        return False, FormatSlip(_("This one is predict, then run: predict(\"08.softmax-bytes\", your factor) "
                                   "records a number, and the next cell's reveal(...) compares it with the count."))
    prediction, result = answer
    given = prediction
    prediction = as_number(prediction)  # numpy and torch scalars, Fractions: numbers too
    if prediction is None or not math.isfinite(prediction) or prediction <= 0:
        return False, FormatSlip(_("Give the factor as a positive number, such as 2 or 10, not {given!r}.").format(
            given=given))
    if isinstance(result, bool) or not isinstance(result, (int, float)) or not result > 0:
        return False, FormatSlip(_("The measured result must be a positive number (the cell below computes it)."))
    why = _("The five ops read the matrix 5 times (max, subtract, exp, sum, divide) and write it 3 times "
            "(subtract, exp, divide); max and sum write one value per row. The fused kernel reads it once and "
            "writes it once: 8 passes against 2, measured {result:.2f}x.").format(result=result)
    if abs(prediction / result - 1) <= 0.125:
        return True, _("You predicted {prediction:g}x.").format(prediction=prediction) + " " + why
    return False, _("You predicted {prediction:g}x, the count says {result:.2f}x.").format(
        prediction=prediction, result=result) + " " + why


def _measure_softmax_bytes() -> float:
    """The count of 08.softmax-bytes, made again on the notebook's 64 x 1000 fp32 matrix: the bytes of the 5-op
    torch softmax (``traffic.torch_traffic``) over the fused kernel's, counted in the interpreter
    (``traffic.triton_traffic``) or, compiled on a GPU, from the model ``traffic.fused_traffic``."""
    from labkit import traffic

    x = kernelbench.make_inputs("softmax", 64, 1000)["x"]
    unfused = traffic.torch_traffic(kernels.softmax_unfused, x)
    fused = (traffic.triton_traffic(kernels.softmax, x) if kernels.mode().interpreted
             else traffic.fused_traffic("softmax", 64, 1000))
    return unfused.total / fused.total


EXERCISES = [
    Exercise("08.bias-gelu", "Write the body of a kernel that computes gelu(x + b), one program per BLOCK elements.",
             _grade_bias_gelu,
             "Each program owns BLOCK consecutive elements of the flattened x; which column's bias does element i "
             "need, and what must the last program not touch?",
             method="Each program builds the offsets of its BLOCK elements and a mask for the last, partial block. "
                    "Load x, and for each element the bias of its column (its offset modulo n_cols), both masked; "
                    "compute in fp32 (gelu needs erf: tl.math.erf), and store in y's dtype under the same mask.",
             solution="pid = tl.program_id(0); offs = pid * BLOCK + tl.arange(0, BLOCK); mask = offs < n\n"
                      "x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)\n"
                      "b = tl.load(b_ptr + offs % n_cols, mask=mask).to(tl.float32)\n"
                      "h = x + b; y = 0.5 * h * (1.0 + tl.math.erf(h * 0.7071067811865476))\n"
                      "tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)",
             kind="implement", reference=kernels.KernelRef("bias_gelu_kernel"),
             wrong=kernels.KernelRef("bias_gelu_no_mask"), wrong_why=_MASK),
    Exercise("08.softmax", "Write the body of a row-softmax kernel, one program per row, the row in one block.",
             _grade_softmax,
             "Softmax is unchanged if you subtract the same number from every element of a row. Which number keeps "
             "exp from overflowing, and what should lanes past the end of the row hold?",
             method="Load the row masked, filling the missing lanes with a value that can never be the max and "
                    "adds nothing to the sum once exponentiated; work in fp32; shift the row by its max before the "
                    "exponential, normalise by the sum, and store under the mask in y's dtype.",
             solution="mask = offs < n_cols\n"
                      "x = tl.load(x_ptr + row * row_stride + offs, mask=mask, other=float('-inf')).to(tl.float32)\n"
                      "e = tl.exp(x - tl.max(x, axis=0)); y = e / tl.sum(e, axis=0)\n"
                      "tl.store(y_ptr + row * row_stride + offs, y.to(y_ptr.dtype.element_ty), mask=mask)",
             kind="implement", reference=kernels.KernelRef("softmax_kernel"),
             wrong=kernels.KernelRef("softmax_no_max"),
             wrong_why="The row max is not subtracted: exp(x) overflows to inf for x above 88.7 in fp32, and "
                       "inf / inf is NaN. exp(x - max) <= 1, and the ratio is the same."),
    Exercise("08.layernorm", "Write the body of a LayerNorm forward kernel that also stores each row's mean and rstd.",
             _grade_layernorm,
             "Think about the dtype your sums run in when x arrives as bf16, and about what lanes past the end of "
             "the row add to the mean and to the variance.",
             method="Work in fp32 from the load on. The statistics divide by n_cols, not by the block size, and the "
                    "lanes past the end must add nothing: a masked load's fill handles the mean, but the centred "
                    "values there are not zero unless you zero them (tl.where) before squaring. Then scale and "
                    "shift with the weight and bias, store y in its own dtype, and store the row's mean and rstd "
                    "at the row's index.",
             solution="mask = offs < n_cols\n"
                      "x = tl.load(x_ptr + row * row_stride + offs, mask=mask, other=0.0).to(tl.float32)\n"
                      "mean = tl.sum(x, axis=0) / n_cols; xc = tl.where(mask, x - mean, 0.0)\n"
                      "rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / n_cols + eps)\n"
                      "w = tl.load(w_ptr + offs, mask=mask).to(tl.float32); b = tl.load(b_ptr + offs, mask=mask)"
                      ".to(tl.float32)\n"
                      "tl.store(y_ptr + row * row_stride + offs, (xc * rstd * w + b).to(y_ptr.dtype.element_ty), "
                      "mask=mask)\n"
                      "tl.store(mean_ptr + row, mean); tl.store(rstd_ptr + row, rstd)",
             kind="implement", reference=kernels.KernelRef("layernorm_kernel"),
             wrong=kernels.KernelRef("layernorm_bf16_accumulation"), wrong_why=_BF16),
    Exercise("08.softmax-bytes",
             "Predict how many times more bytes the 5-op unfused softmax moves than the fused kernel, then count.",
             _grade_bytes,
             "Count passes over the matrix: for each of the five ops, does it read the whole matrix, write the "
             "whole matrix, or only one value per row?",
             method="Go through the five ops one by one and count whole-matrix passes: does the op read the matrix, "
                    "write a whole matrix, or write only one value per row (next to nothing)? Count the fused "
                    "kernel the same way, then divide.",
             solution="(5 reads + 3 writes) / (1 read + 1 write) = 8 / 2 = 4x (plus a few columns).",
             kind="predict", reference=(4, 4.01), wrong=(5, 4.01), measure=_measure_softmax_bytes,
             wrong_why="One pass per op counts 5 ops against 1 kernel, but every elementwise op both reads and writes "
                       "the matrix, the two reductions read it and write one value per row, and the fused kernel "
                       "also reads and writes: 8 passes against 2."),
    Exercise("08.flash-attention",
             "Complete FlashAttention's online-softmax update inside the loop over key blocks.", _grade_flash,
             "After a new block of scores s, the running max may grow. What happens to the sum l_i and the "
             "accumulator acc, which were built with exponentials of the old max?",
             method="For each key block: the running max becomes the larger of the old one and the block's row "
                    "max. Everything summed so far (l_i and acc) was weighted by exponentials of the old max: find "
                    "the one factor per row that turns exp(s - m_old) into exp(s - m_new), and rescale both by it "
                    "before adding the new block's exponentials (to l_i) and their product with v (to acc).",
             solution="m_new = tl.maximum(m_i, tl.max(s, axis=1)); alpha = tl.exp(m_i - m_new)\n"
                      "p = tl.exp(s - m_new[:, None]); l_i = l_i * alpha + tl.sum(p, axis=1)\n"
                      "acc = acc * alpha[:, None] + tl.dot(p, v, input_precision='ieee'); m_i = m_new",
             kind="implement", reference=kernels.KernelRef("flash_attention_kernel"),
             wrong=kernels.KernelRef("flash_attention_no_rescale"),
             wrong_why="Without the rescale, blocks summed before the max grew keep weights exp(s - m_old), too "
                       "large by exp(m_new - m_old) relative to the later ones: right only with a single key block."),
]
