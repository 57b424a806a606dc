"""Notebook 08's graders against the wrong kernels a learner writes (issue 31): each is rejected with a message
that names the bug, and labkit's reference kernels still pass. The kernels below are plain functions written as a
learner would write them in the notebook's cells (the grader decorates them), each differing from a correct
kernel by the one mistake its docstring names."""

from __future__ import annotations

import pytest
import torch
import triton.language as tl

from labkit import kernels
from labkit import traffic as T
from labkit.check import evaluate
from labkit.exercises import get_exercise

MODE = kernels.setup()
K = kernels.load()


def layernorm_no_eps(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, n_cols, row_stride, eps, BLOCK: tl.constexpr):
    """rstd = 1 / sqrt(var): NaN on a constant row."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * row_stride + offs, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    xc = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / n_cols)
    w = tl.load(w_ptr + offs, mask=mask).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask).to(tl.float32)
    tl.store(y_ptr + row * row_stride + offs, (xc * rstd * w + b).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)


def layernorm_one_pass(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, n_cols, row_stride, eps, BLOCK: tl.constexpr):
    """var = E[x^2] - E[x]^2: one pass over the row, catastrophic cancellation when the mean dwarfs the spread."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * row_stride + offs, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    var = tl.sum(x * x, axis=0) / n_cols - mean * mean
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + offs, mask=mask).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask).to(tl.float32)
    tl.store(y_ptr + row * row_stride + offs, ((x - mean) * rstd * w + b).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)


def layernorm_eps_outside(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, n_cols, row_stride, eps,
                          BLOCK: tl.constexpr):
    """rstd = 1 / (std + eps): y is right even on a constant row (x - mean = 0), the stored rstd is 1/eps there."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * row_stride + offs, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    xc = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / (tl.sqrt(tl.sum(xc * xc, axis=0) / n_cols) + eps)
    w = tl.load(w_ptr + offs, mask=mask).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask).to(tl.float32)
    tl.store(y_ptr + row * row_stride + offs, (xc * rstd * w + b).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)


def layernorm_no_stats(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, n_cols, row_stride, eps, BLOCK: tl.constexpr):
    """y right, mean and rstd never stored (the offset rows' rstd check must not blame the variance formula)."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * row_stride + offs, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    xc = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + offs, mask=mask).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask).to(tl.float32)
    tl.store(y_ptr + row * row_stride + offs, (xc * rstd * w + b).to(y_ptr.dtype.element_ty), mask=mask)


def softmax_zero_fill(x_ptr, y_ptr, n_cols, row_stride, BLOCK: tl.constexpr):
    """other=0.0, then the masked lanes zeroed after exp: the padding's 0 wins the max of a row below -104."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * row_stride + offs, mask=mask, other=0.0).to(tl.float32)
    e = tl.where(mask, tl.exp(x - tl.max(x, axis=0)), 0.0)
    tl.store(y_ptr + row * row_stride + offs, (e / tl.sum(e, axis=0)).to(y_ptr.dtype.element_ty), mask=mask)


def bias_gelu_loads_unmasked(x_ptr, b_ptr, y_ptr, n, n_cols, BLOCK: tl.constexpr):
    """The store is masked, the loads are not: the last program reads past the end of x."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs).to(tl.float32)
    b = tl.load(b_ptr + offs % n_cols).to(tl.float32)
    h = x + b
    tl.store(y_ptr + offs, (0.5 * h * (1.0 + tl.math.erf(h * 0.7071067811865476))).to(y_ptr.dtype.element_ty),
             mask=mask)


@pytest.mark.parametrize(("ex_id", "kernel", "words"), [
    ("08.layernorm", layernorm_no_eps, "constant row"),
    ("08.layernorm", layernorm_one_pass, "E[x^2] - E[x]^2"),
    ("08.layernorm", layernorm_eps_outside, "inside the square root"),
    ("08.layernorm", layernorm_no_stats, "mean and rstd you store"),
    ("08.softmax", softmax_zero_fill, "0/0 is NaN"),
    ("08.bias-gelu", bias_gelu_loads_unmasked, "read"),
])
def test_a_learners_wrong_kernel_is_rejected_by_name(ex_id, kernel, words):
    v = evaluate(ex_id, kernel)
    assert v.status == "wrong", (ex_id, kernel.__name__, v.message)
    assert words in v.message, v.message


def test_the_unmasked_loads_are_caught_by_the_interpreter_hook_not_by_the_output():
    """The output of the unmasked-load kernel is right (the stray lanes are never stored): only the loads betray it."""
    x, bias = kernels.randn(3, 50, seed=1), kernels.randn(50, seed=2)
    buf = torch.full((150 + 64,), float("nan"))
    buf[:150] = x.view(-1)
    xv = buf[:150].view(3, 50)
    y = kernels.bias_gelu(xv, bias, kernel=bias_gelu_loads_unmasked, block=64)
    assert kernels.close(y, kernels.bias_gelu_unfused(x.double(), bias.double()))[0]
    if not MODE.interpreted:
        with pytest.raises(ValueError, match="compute-sanitizer"):
            T.triton_strays(kernels.bias_gelu, xv, bias, kernel=bias_gelu_loads_unmasked, block=64)
        return
    bad = T.triton_strays(kernels.bias_gelu, xv, bias, kernel=bias_gelu_loads_unmasked, block=64)
    good = T.triton_strays(kernels.bias_gelu, xv, bias, block=64)
    assert (bad.reads, bad.writes, bad.any) == (3 * 64 - 150, 0, True)
    assert (good.reads, good.writes, good.any) == (0, 0, False)


@pytest.mark.parametrize("ex_id", ["08.bias-gelu", "08.softmax", "08.layernorm", "08.flash-attention"])
def test_the_references_still_pass(ex_id):
    assert get_exercise(ex_id).grade(get_exercise(ex_id).reference)[0]


def test_the_offset_rows_are_beyond_torchs_own_fp32_but_not_the_two_pass_variance():
    """The offset case's tolerance is stated from fp32's limit: torch's fp32 F.layer_norm misses the strict one
    too, the two-pass kernel keeps rstd within 1e-2, the one-pass one does not."""
    x = kernels.randn(4, 50, seed=13, shift=1000.0, scale=1e-3)
    w, b = kernels.randn(50, seed=14, shift=1.0, scale=0.1), kernels.randn(50, seed=15, scale=0.1)
    want, _, want_rstd = torch.ops.aten.native_layer_norm(x.double(), [50], w.double(), b.double(), 1e-5)
    torch32 = torch.nn.functional.layer_norm(x, [50], w, b, 1e-5)
    assert not kernels.close(torch32, want)[0] and kernels.close(torch32, want, tol=(0.0, 0.1))[0]
    _, _, rstd = kernels.layernorm(x, w, b)
    assert kernels.close(rstd, want_rstd.view(-1), tol=(1e-2, 0.0))[0]
    _, _, rstd1 = kernels.layernorm(x, w, b, kernel=layernorm_one_pass)
    assert not kernels.close(rstd1, want_rstd.view(-1), tol=(1e-2, 0.0))[0]
