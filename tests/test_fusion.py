"""Tests for labkit.fusion: the fused bias + GELU op against torch's own GELU and autograd, and gradcheck's verdicts."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from labkit import fusion


def _inputs(shape=(5, 7), dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g, dtype=dtype) * 2).requires_grad_(True)
    b = torch.randn(shape[-1], generator=g, dtype=dtype).requires_grad_(True)
    return x, b


@pytest.mark.parametrize("shape", [(5, 7), (2, 3, 4), (1,)])
def test_forward_and_backward_match_torch_autograd_of_f_gelu(shape):
    x, b = _inputs(shape)
    y = fusion.fused_bias_gelu(x, b)
    ref = F.gelu(x + b, approximate="tanh")
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(y)
    gx, gb = torch.autograd.grad(y, (x, b), g)
    rx, rb = torch.autograd.grad(ref, (x, b), g)
    torch.testing.assert_close(gx, rx, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(gb, rb, rtol=1e-10, atol=1e-12)


def test_derivative_matches_autograd_of_torch_gelu():
    h = torch.linspace(-6, 6, 241, dtype=torch.float64, requires_grad=True)
    (want,) = torch.autograd.grad(F.gelu(h, approximate="tanh").sum(), h)
    torch.testing.assert_close(fusion.gelu_tanh_derivative(h.detach()), want, rtol=1e-12, atol=1e-12)


def test_gradcheck_passes_the_exact_backward_and_catches_the_bug():
    x, b = _inputs()
    assert torch.autograd.gradcheck(fusion.fused_bias_gelu, (x, b))
    buggy = lambda x, b: fusion.fused_bias_gelu(x, b, backward="tanh-held-constant")  # noqa: E731
    assert not torch.autograd.gradcheck(buggy, (x, b), raise_exception=False)
    torch.testing.assert_close(buggy(x, b), fusion.fused_bias_gelu(x, b))  # the bug is invisible in the forward


def test_fp32_forward_agrees_with_f_gelu():
    x, b = _inputs((64, 32), dtype=torch.float32)
    torch.testing.assert_close(fusion.fused_bias_gelu(x, b), F.gelu(x + b, approximate="tanh"), rtol=1e-5, atol=1e-6)


def test_bad_input():
    x, b = _inputs()
    with pytest.raises(TypeError):
        fusion.fused_bias_gelu(x.detach().numpy(), b)
    with pytest.raises(TypeError):
        fusion.fused_bias_gelu(torch.ones(3, 4, dtype=torch.int64), torch.ones(4, dtype=torch.int64))
    with pytest.raises(TypeError):
        fusion.fused_bias_gelu(x, b.float())
    with pytest.raises(ValueError):
        fusion.fused_bias_gelu(x, b[:3])
    with pytest.raises(ValueError):
        fusion.fused_bias_gelu(torch.tensor(1.0, dtype=torch.float64), b)
    with pytest.raises(ValueError):
        fusion.fused_bias_gelu(x, b, backward="approximate")
    with pytest.raises(TypeError):
        fusion.fused_bias_gelu(x, b, backward=1)
    with pytest.raises(TypeError):
        fusion.gelu_tanh_derivative([1.0, 2.0])
    with pytest.raises(TypeError):
        fusion.gelu_tanh_derivative(torch.ones(3).to_sparse())


def test_docstrings_name_the_notebook():
    assert fusion.__doc__.rstrip().endswith("Introduced in notebook 07.")
    for name in ("fused_bias_gelu", "gelu_tanh_derivative"):
        assert getattr(fusion, name).__doc__.rstrip().endswith("Introduced in notebook 07."), name
