"""labkit.debug: the first non-finite module (forward hooks) and the backward NaN (anomaly mode), on real NaNs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from labkit import debug


class _Dist(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(((a - b) ** 2).sum(-1))  # finite at a == b, NaN gradient there


class _Net(nn.Module):
    def __init__(self, divide: bool = False) -> None:
        super().__init__()
        self.enc, self.norm, self.head, self.dist = nn.Linear(4, 4), nn.LayerNorm(4), nn.Linear(4, 1), _Dist()
        self.divide = divide

    def forward(self, x: torch.Tensor, same: bool = False) -> torch.Tensor:
        h = self.enc(x)
        if self.divide:
            h = h / 0.0  # a bad value made between modules
        h = self.norm(h)
        return self.head(h).squeeze(-1) + self.dist(h, h if same else h.flip(0))


def _net(divide: bool = False) -> _Net:
    torch.manual_seed(0)
    return _Net(divide)


def test_nonfinite_count():
    assert debug.nonfinite_count(torch.tensor([1.0, float("nan"), float("inf"), -float("inf")])) == 3
    assert debug.nonfinite_count((torch.ones(2), {"a": torch.tensor([float("nan")])}, 3, "x")) == 1
    assert debug.nonfinite_count(torch.arange(3)) == 0


def test_first_nonfinite_finds_the_module_that_made_it():
    net, x = _net(), torch.randn(8, 4)
    assert debug.first_nonfinite(net, lambda: net(x)) is None
    with torch.no_grad():
        net.enc.weight[1, 2] = float("inf")
    hit = debug.first_nonfinite(net, lambda: net(x))
    assert (hit.module, hit.kind, hit.inputs_finite) == ("enc", "Linear", True)
    assert hit.bad == 8 and hit.numel == 32  # one output column, every row
    assert torch.isnan(net(x)).all()  # ... and it spread to every output
    assert all(not m._forward_hooks for m in net.modules())  # hooks removed


def test_first_nonfinite_blames_code_between_modules():
    net = _net(divide=True)
    hit = debug.first_nonfinite(net, lambda: net(torch.randn(8, 4)))
    assert (hit.module, hit.inputs_finite) == ("norm", False)
    assert "already non-finite" in hit.describe()


def test_first_nonfinite_removes_hooks_on_error_and_checks_types():
    net = _net()
    with pytest.raises(RuntimeError):
        debug.first_nonfinite(net, lambda: net(torch.randn(8, 5)))
    assert all(not m._forward_hooks for m in net.modules())
    with pytest.raises(TypeError):
        debug.first_nonfinite(lambda: 0, lambda: 0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        debug.first_nonfinite(net, 3)  # type: ignore[arg-type]


def test_backward_anomaly_names_the_function_and_the_forward_line():
    net, x = _net(), torch.randn(8, 4)
    assert debug.backward_anomaly(lambda: net(x).mean()) is None  # finite: nothing to report
    assert all(torch.isfinite(p.grad).all() for p in net.parameters())
    net.zero_grad()
    out = net(x, same=True).mean()
    assert torch.isfinite(out)  # the forward is fine...
    out.backward()
    assert torch.isnan(net.enc.weight.grad).all()  # ... the gradients are not
    hit = debug.backward_anomaly(lambda: net(x, same=True).mean())
    assert hit.function == "PowBackward0" and "returned nan" in hit.message
    assert hit.forward_line is not None and "torch.sqrt(((a - b) ** 2)" in hit.forward_line
    assert not torch.is_anomaly_enabled()
    with pytest.raises(TypeError):
        debug.backward_anomaly(lambda: torch.ones(2))
    with pytest.raises(TypeError):
        debug.backward_anomaly(torch.ones(2))  # type: ignore[arg-type]
