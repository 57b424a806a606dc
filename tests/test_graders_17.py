"""Notebook 17's graders against the wrong answers a learner gives: each is rejected (with a message naming the
mistake where it is a typical one), the references pass."""

from __future__ import annotations

import math

import torch

from labkit.check import evaluate
from labkit.exercises import get_exercise
from labkit.exercises.nb17 import exercise_blocks, round_to


def _verdict(ex_id, answer):
    return evaluate(ex_id, answer)


def test_mx_scale_rejects_the_rceil_the_unshifted_the_ratio_and_the_fp32_scales():
    amax = [float(b.abs().max()) for b in exercise_blocks()]
    right = [2.0 ** (math.floor(math.log2(a)) - 2) for a in amax]  # MXFP4: E2M1's 6 = 1.5 x 2^2
    assert _verdict("17.mx-scale", right).status == "correct"
    assert _verdict("17.mx-scale", tuple(right)).status == "correct"
    k = [math.log2(r) for r in right]
    wrongs = {
        "RCEIL": [2.0 ** math.ceil(math.log2(a / 6)) for a in amax],
        "emax": [2.0 ** math.floor(math.log2(a)) for a in amax],
        "MXFP8": [2.0 ** (math.floor(math.log2(a)) - 8) for a in amax],
        "log2(amax / 6)": [2.0 ** math.floor(math.log2(a / 6)) for a in amax],
        "rounds log2": [2.0 ** round(math.log2(a / 6)) for a in amax],
        "FP32": [a / 6 for a in amax],
        "Upside down": [1 / r for r in right],
        "exponents": k,
        "E8M0 bytes": [x + 127 for x in k],
    }
    for says, wrong in wrongs.items():
        v = _verdict("17.mx-scale", wrong)
        assert v.status == "wrong", (says, wrong, v.message)
        assert says.split()[0] in v.message or says == "rounds log2" and "log2(amax / 6)" in v.message, (says, v.message)
    v = _verdict("17.mx-scale", [right[0], right[1] * 2])
    assert v.status == "wrong" and "Block 2" in v.message
    assert _verdict("17.mx-scale", right[0]).status != "correct"  # one number is a slip of form, not a verdict


def _nvfp4(scale_of, elements_of=None):
    def f(x, tensor_scale):
        s = scale_of(x, tensor_scale)
        e = round_to(x / (s * tensor_scale), "e2m1fn") if elements_of is None else elements_of(x, s, tensor_scale)
        return e * s * tensor_scale
    return f


def test_nvfp4_block_rejects_the_usual_slips():
    ok = _nvfp4(lambda x, t: round_to(x.abs().max() / 6 / t, "e4m3fn"))
    assert _verdict("17.nvfp4-block", ok).status == "correct"
    wrongs = {
        "scale not rounded to E4M3": _nvfp4(lambda x, t: x.abs().max() / 6 / t),
        "448 instead of 6": _nvfp4(lambda x, t: round_to(x.abs().max() / 448 / t, "e4m3fn")),
        "tensor scale forgotten": lambda x, t: (lambda s: round_to(x / s, "e2m1fn") * s)(
            round_to(x.abs().max() / 6, "e4m3fn")),
        "scale rounded up to a power of two": _nvfp4(
            lambda x, t: 2.0 ** torch.ceil(torch.log2(x.abs().max() / 6 / t))),
        "elements rounded toward zero": _nvfp4(
            lambda x, t: round_to(x.abs().max() / 6 / t, "e4m3fn"),
            lambda x, s, t: torch.sign(x) * round_to(torch.floor((x / (s * t)).abs() * 2) / 2, "e2m1fn")),
        "FP8 elements": _nvfp4(lambda x, t: round_to(x.abs().max() / 6 / t, "e4m3fn"),
                               lambda x, s, t: round_to(x / (s * t), "e4m3fn")),
    }
    for name, fn in wrongs.items():
        v = _verdict("17.nvfp4-block", fn)
        assert v.status != "correct", name
    assert "E4M3" in _verdict("17.nvfp4-block", wrongs["scale not rounded to E4M3"]).message
    assert "E2M1" in _verdict("17.nvfp4-block", wrongs["448 instead of 6"]).message
    assert "tensor scale is missing" in _verdict("17.nvfp4-block", wrongs["tensor scale forgotten"]).message
    assert _verdict("17.nvfp4-block", lambda x, t: x).status != "correct"  # no quantisation at all
    stub = _verdict("17.nvfp4-block", lambda x, t: None)
    assert stub.status == "not attempted"


def test_outlier_spread_rejects_the_whole_block_the_row_and_the_tensor():
    ex = get_exercise("17.outlier-spread")
    measured = ex.measure()
    assert 0 < measured < 31  # the power-of-two scale leaves most of the block's neighbours as they were
    assert ex.grade((measured, measured))[0]
    for wrong in (31, 255, 98303):
        ok, message = ex.grade((wrong, measured))
        assert not ok and "power of two" in message
    assert not ex.grade((0, measured))[0] and not ex.grade((16, measured))[0]


def test_recipe_rejects_mx_on_hopper_and_fp8_on_ampere():
    ex = get_exercise("17.recipe")
    right = dict(ex.reference)
    assert ex.grade(right)[0]
    ok, message = ex.grade({**right, "h100-outliers": "mxfp8"})
    assert not ok and "Blackwell" in message
    ok, message = ex.grade({**right, "l40s": "mxfp8"})
    assert not ok and "Blackwell" in message
    for key, wrong in (("a100", "fp8-tensor"), ("b200-fp4", "mxfp8"), ("b200-fp8", "fp8-blockwise"),
                       ("h100-simple", "nvfp4"), ("l40s", "bf16"), ("h100-outliers", "fp8-tensor")):
        assert not ex.grade({**right, key: wrong})[0], (key, wrong)
