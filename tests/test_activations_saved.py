"""labkit.activations.measure_saved_tensors against torch itself: nbytes of real tensors, torch.utils.checkpoint.

Notebook 06 measures what activation checkpointing saves by counting, with saved-tensor hooks, the bytes autograd
keeps for backward with and without ``torch.utils.checkpoint``, and checks the saving against the segments' inner
activations counted one segment at a time. These tests check the counter on tensors whose sizes are known from
torch (``nbytes``, ``untyped_storage().nbytes()``), and the accounting identity with torch's own checkpoint
function (not labkit's ``checkpointed`` wrapper), on models other than the notebook's.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from labkit import activations as A
from labkit import models

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _segments(activation: str, depth: int = 3, width: int = 24) -> nn.ModuleList:
    torch.manual_seed(0)
    act = {"gelu": nn.GELU, "relu": nn.ReLU, "tanh": nn.Tanh}[activation]
    return nn.ModuleList(nn.Sequential(nn.Linear(width, width), act()) for _ in range(depth))


def _run(segments: nn.ModuleList, x: torch.Tensor, ckpt: bool) -> torch.Tensor:
    for seg in segments:
        x = checkpoint(seg, x, use_reentrant=False) if ckpt else seg(x)
    return x


def test_counts_the_bytes_of_the_tensors_an_op_saves():
    a = torch.randn(7, 5, requires_grad=True)
    b = torch.randn(7, 5, dtype=torch.float64, requires_grad=True)
    _, s = A.measure_saved_tensors(lambda: a * b.float())  # mul saves both operands (b's fp32 copy, not b)
    assert s.activations == a.nbytes + b.float().nbytes == 2 * 7 * 5 * 4
    assert s.by_dtype == {"float32": 2 * 7 * 5 * 4} and s.weight_copies == s.params == 0


def test_a_saved_view_counts_its_whole_storage():
    big = torch.randn(100, requires_grad=True)
    base = big * 1.0                        # a non-leaf whose storage the view shares
    view = base[:10]
    _, s = A.measure_saved_tensors(lambda: view * view)
    assert view.nbytes == 40 and s.activations == base.untyped_storage().nbytes() == 400


def test_parameters_and_their_casts_are_not_activations():
    lin = nn.Linear(16, 8)
    x = torch.randn(4, 16, requires_grad=True)
    _, s = A.measure_saved_tensors(lambda: lin(x), lin.parameters())
    assert (s.activations, s.params, s.weight_copies) == (x.nbytes, lin.weight.nbytes, 0)

    def amp():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return lin(x)

    _, s = A.measure_saved_tensors(amp, lin.parameters())
    assert s.weight_copies == lin.weight.numel() * 2 and s.activations == x.numel() * 2 and s.params == 0


@pytest.mark.parametrize("activation", ["gelu", "tanh", "relu"])
def test_torch_checkpoint_keeps_only_the_segment_inputs(activation):
    segments = _segments(activation)
    x = torch.randn(6, 24, requires_grad=True)
    inputs, h = [], x
    for seg in segments:                   # the segments' inputs, computed independently
        inputs.append(h.nbytes)
        h = seg(h)
    _, ck = A.measure_saved_tensors(lambda: _run(segments, x, True), segments.parameters())
    _, plain = A.measure_saved_tensors(lambda: _run(segments, x, False), segments.parameters())
    assert ck.activations == sum(inputs)
    if activation == "gelu":               # GELU saves its input, the Linear's output: one more tensor per segment
        assert plain.activations == 2 * sum(inputs) > ck.activations
    else:                                  # ReLU and Tanh save their output, the next segment's input: only the
        assert plain.activations == sum(inputs) + h.nbytes  # last one is extra (in an MLP its head saves it anyway)


@pytest.mark.parametrize("softmax", ["fp32", "naive"])
@pytest.mark.parametrize("n_layers", [1, 3])
def test_gpt_saving_is_the_blocks_inner_activations_minus_their_inputs(softmax, n_layers):
    """The identity notebook 06 asserts, with torch's checkpoint called directly on each block."""
    cfg = models.GPTConfig(vocab_size=12, seq_len=10, d_model=32, n_heads=4, n_layers=n_layers, softmax=softmax)
    model = models.TinyGPT(cfg, seed=0)
    idx = torch.randint(0, 12, (3, 10), generator=torch.Generator().manual_seed(0))
    h0 = model.tok(idx) + model.pos(torch.arange(10))
    _, plain = A.measure_saved_tensors(lambda: _run(model.blocks, h0, False), model.parameters())
    _, ck = A.measure_saved_tensors(lambda: _run(model.blocks, h0, True), model.parameters())
    inner, h = [], h0
    for block in model.blocks:
        h, s = A.measure_saved_tensors(lambda block=block, h=h: block(h), model.parameters())
        inner.append(s.activations)
    assert ck.activations == n_layers * h0.nbytes
    assert plain.activations - ck.activations == sum(inner) - n_layers * h0.nbytes > 0
