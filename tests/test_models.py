"""Tests for labkit.models: the MLP, the tiny GPT and its swappable softmax."""

from __future__ import annotations

import pytest
import torch

from labkit import data, models


def test_mlp_shape_seed_and_global_rng_untouched():
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a = models.MLP(8, 32, 3, depth=2, seed=0)
    assert torch.equal(torch.random.get_rng_state(), before)
    b = models.MLP(8, 32, 3, depth=2, seed=0)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    assert a(torch.randn(5, 8)).shape == (5, 3)
    assert models.count_parameters(models.MLP(4, 10, 2, depth=1)) == 4 * 10 + 10 + 10 * 2 + 2


def test_mlp_init_scale_makes_fp16_gradients_partly_underflow():
    x, y = data.make_regression(256, 16, seed=0)

    def underflow_fraction(scale: float) -> float:
        m = models.MLP(16, 64, 1, depth=3, init_scale=scale, seed=0)
        torch.nn.functional.mse_loss(m(x), y).backward()
        g = torch.cat([p.grad.flatten() for p in m.parameters()])
        g = g[g != 0]
        return float((g.half() == 0).float().mean())

    assert underflow_fraction(1.0) < 0.01
    frac = underflow_fraction(0.05)
    assert 0.05 < frac < 0.95  # partly, not entirely


def test_mlp_bad_arguments():
    with pytest.raises(ValueError, match="activation"):
        models.MLP(activation="swish")
    with pytest.raises(ValueError, match="init_scale"):
        models.MLP(init_scale=0)
    with pytest.raises(ValueError):
        models.MLP(depth=-1)


def test_model_sizes_past_the_limits_are_refused_before_anything_is_built():
    """MLP(4, 4, 1, depth=2**40) looped for ever; huge widths and GPT shapes allocated until the machine gave up."""
    from labkit._validate import MAX_MODEL_PARAMS, mlp_param_count

    for kwargs, match in [({"depth": 2**40}, "depth must be an int between 0 and 10,000"),
                          ({"depth": 10_001}, "depth must be an int between 0 and 10,000"),
                          ({"hidden": 10**6}, "20,000,000,000"), ({"in_features": 2**64, "depth": 0}, "parameters"),
                          ({"out_features": 10**400}, "parameters"), ({"hidden": 2**70, "depth": 10_000}, "parameters")]:
        with pytest.raises(ValueError, match=match):
            models.MLP(**{"in_features": 4, "hidden": 4, "out_features": 1, **kwargs})
    for kwargs in [{"d_model": 2**20}, {"n_layers": 10**6}, {"vocab_size": 10**400}, {"seq_len": 2**20},
                   {"mlp_ratio": 2**64}, {"seq_len": 2**14, "n_layers": 400}]:
        with pytest.raises(ValueError, match="parameters|n_layers must be between"):
            models.GPTConfig(**kwargs)
    with pytest.raises(ValueError, match="causal masks"):
        models.CausalSelfAttention(8, 2, 2**20)
    # the count the limit uses is the real one
    for shape in [(4, 10, 2, 1), (16, 256, 1, 3), (3, 7, 5, 0)]:
        assert mlp_param_count(*shape) == models.count_parameters(models.MLP(*shape[:3], depth=shape[3]))
    cfg = models.GPTConfig(d_model=32, n_layers=3, mlp_ratio=2, vocab_size=20, seq_len=9)
    assert models._gpt_param_count(cfg) == models.count_parameters(models.TinyGPT(cfg))
    assert MAX_MODEL_PARAMS == 20 * 10**9
    assert models.MLP(4, 4, 1, depth=10_000).config["depth"] == 10_000  # the limit itself is built


@pytest.mark.parametrize("impl", models.SOFTMAX_IMPLS)
def test_softmax_impls_match_torch_in_fp32(impl):
    s = torch.randn(4, 7) * 3
    out = models.softmax(s, impl)
    torch.testing.assert_close(out, torch.softmax(s, -1))
    assert out.dtype == s.dtype


def test_naive_half_softmax_overflows_and_fp32_island_does_not():
    s = torch.tensor([[12.0, 1.0, 0.0]], dtype=torch.float16)  # exp(12) > 65504
    assert torch.isnan(models.softmax(s, "naive")).any()
    fixed = models.softmax(s, "fp32")
    assert fixed.dtype == torch.float16
    torch.testing.assert_close(fixed.float(), torch.softmax(s.float(), -1), atol=1e-3, rtol=1e-3)
    with pytest.raises(ValueError, match="unknown softmax"):
        models.softmax(s, "fast")


def test_fp32_island_inside_cpu_autocast():
    torch.manual_seed(0)
    cfg = models.GPTConfig(vocab_size=10, seq_len=8, d_model=32, n_layers=1, n_heads=2)
    m = models.TinyGPT(cfg, seed=0)
    with torch.no_grad():
        m.blocks[0].attn.qkv.weight.mul_(60.0)  # sharp attention, as after training
    idx = torch.randint(10, (4, 8))
    with torch.autocast("cpu", dtype=torch.float16):
        m.set_softmax("naive")
        bad = m(idx)
        assert m.attentions[0].last_scores_absmax > 11.1
        m.set_softmax("fp32")
        good = m(idx)
    assert torch.isnan(bad).any()
    assert torch.isfinite(good).all()


def test_tinygpt_shapes_params_and_causality():
    cfg = models.GPTConfig(vocab_size=12, seq_len=12)
    m = models.TinyGPT(cfg, seed=0)
    n = models.count_parameters(m)
    assert 100_000 < n < 1_000_000
    idx = torch.randint(12, (3, 12))
    out = m(idx)
    assert out.shape == (3, 12, 12)
    idx2 = idx.clone()
    idx2[:, 8:] = (idx2[:, 8:] + 1) % 12  # change the future
    torch.testing.assert_close(m(idx2)[:, :8], out[:, :8])
    assert not torch.allclose(m(idx2)[:, 8:], out[:, 8:])


def test_tinygpt_seed_overrides_and_errors():
    a, b = models.TinyGPT(seed=1, d_model=32, n_heads=2), models.TinyGPT(seed=1, d_model=32, n_heads=2)
    assert a.config.d_model == 32
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    with pytest.raises(ValueError, match="divisible"):
        models.GPTConfig(d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="unknown GPTConfig"):
        models.TinyGPT(width=3)
    with pytest.raises(ValueError, match="exceeds"):
        a(torch.zeros(1, 20, dtype=torch.long))


def test_lm_loss_ignores_masked_targets():
    logits = torch.randn(2, 3, 5)
    targets = torch.tensor([[-100, 1, 2], [3, -100, 4]])
    keep = targets != -100
    expect = torch.nn.functional.cross_entropy(logits[keep], targets[keep])
    torch.testing.assert_close(models.lm_loss(logits, targets), expect)


def test_tinygpt_learns_reverse_quickly():
    torch.manual_seed(0)
    task = data.make_token_task("reverse", n=2048, n_digits=6, vocab_size=12, seed=0)
    m = models.TinyGPT(vocab_size=task.vocab_size, seq_len=task.seq_len, seed=0)
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.0)
    batches = data.Batches(task.inputs, task.targets, batch_size=64, seed=0)
    first = None
    for step in range(40):
        x, y = batches(step)
        loss = models.lm_loss(m(x), y)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert first > 2.0 and loss.item() < 0.3
