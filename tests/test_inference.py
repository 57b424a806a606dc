"""labkit.inference: percentiles against numpy, INT8 against exact integer arithmetic and against torch's own
dynamic quantization, generation against the model's own argmax."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from labkit import inference as I
from labkit import models


@pytest.mark.parametrize("n", [1, 2, 7, 37, 100, 101, 1000])
@pytest.mark.parametrize("q", [1, 50, 90, 95, 99, 100])
def test_percentile_is_numpys_nearest_rank(n, q):
    vals = list(np.random.default_rng(n).exponential(size=n))
    assert I.percentile(vals, q) == np.percentile(vals, q, method="inverted_cdf")


def test_percentile_rank_is_exact_where_floats_round_up():
    """P99.9 of 1000 values is the 999th: 0.999 * 1000 is 999.0000000000001 in floats (numpy returns the 1000th)."""
    vals = [float(i) for i in range(1, 1001)]
    assert I.percentile(vals, 99.9) == 999.0 and I.percentile(vals, 100) == 1000.0


def test_percentile_and_stats_check_inputs():
    assert I.percentile([float(i) for i in range(1, 101)], 99) == 99.0  # not the maximum
    for bad in ([], "abc", [1.0, float("nan")]):
        with pytest.raises((TypeError, ValueError)):
            I.percentile(bad, 50)
    for q in (0, 101, -5):
        with pytest.raises(ValueError):
            I.percentile([1.0], q)
    s = I.LatencyStats.of([1.0, 2.0, 3.0, 4.0])
    assert (s.n, s.mean, s.p50, s.p90, s.p99) == (4, 2.5, 2.0, 4.0, 4.0)


def test_int8_linear_is_exact_integer_arithmetic_rescaled():
    torch.manual_seed(0)
    lin = torch.nn.Linear(40, 24)
    q = I.Int8Linear(lin)
    x = torch.randn(3, 5, 40)
    y = q(x)
    assert y.shape == (3, 5, 24) and q.w_q.dtype == torch.int8 and q.w_q.abs().max() <= 127
    # the same computation in float64, from the stored integers and scales
    x2 = x.reshape(-1, 40).double()
    xs = x2.abs().amax(1, keepdim=True) / 127
    xq = torch.round(x2 / xs).clamp(-127, 127)
    want = (xq @ q.w_q.double().t()) * xs * q.w_scale.double() + lin.bias.double()
    torch.testing.assert_close(y.reshape(-1, 24).double(), want, rtol=1e-6, atol=1e-6)
    # and close to the fp32 layer: a few ulps of int8 per element
    rel = ((y - lin(x)).norm() / lin(x).norm()).item()
    assert rel < 0.02


def test_int8_matmul_probe_and_both_paths_agree(monkeypatch):
    """The probe answers a bool, once per device; the fallback (float64 of the same integers) equals _int_mm's
    product wherever _int_mm is exact, so the two paths of Int8Linear give the same outputs."""
    exact = I.int8_matmul_exact("cpu")
    assert isinstance(exact, bool) and I.int8_matmul_exact(torch.device("cpu")) is exact
    torch.manual_seed(2)
    q = I.Int8Linear(torch.nn.Linear(64, 32))
    x = torch.randn(20, 64)
    y = q(x)
    monkeypatch.setitem(I._EXACT, "cpu", False)
    y_fallback = q(x)
    if exact:
        torch.testing.assert_close(y, y_fallback, rtol=0, atol=0)
    a = torch.randint(-127, 128, (8, 64), dtype=torch.int8)
    assert torch.equal((a.double() @ q.w_q.double().t()).long(), a.long() @ q.w_q.long().t())
    with pytest.raises((TypeError, ValueError)):
        I.int8_matmul_exact(3)


def test_int8_is_as_accurate_as_torch_ao_dynamic_quantization():
    torch.manual_seed(1)
    mlp = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)).eval()
    x = torch.randn(32, 128)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ao = torch.ao.quantization.quantize_dynamic(mlp, {torch.nn.Linear}, dtype=torch.qint8)
    mine = I.quantize_int8(mlp)
    with torch.inference_mode():
        ref = mlp(x)
        err_mine = ((mine(x) - ref).norm() / ref.norm()).item()
        err_ao = ((ao(x) - ref).norm() / ref.norm()).item()
    assert err_mine < 0.05 and err_ao < 0.05
    assert err_mine < 2 * err_ao, (err_mine, err_ao)  # per-channel weights: at least as good as torch's scheme


def test_quantize_int8_keeps_named_layers_and_leaves_the_original_alone():
    model = models.TinyGPT(vocab_size=12, seq_len=12, seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    q = I.quantize_int8(model, keep=["head"])
    assert isinstance(q.head, torch.nn.Linear) and isinstance(q.blocks[0].attn.qkv, I.Int8Linear)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert I.weight_bytes(q) < I.weight_bytes(model) / 3
    assert isinstance(I.quantize_int8(torch.nn.Linear(2, 2)), I.Int8Linear)
    with pytest.raises(ValueError, match="no module"):
        I.quantize_int8(model, keep=["nope"])
    with pytest.raises(TypeError):
        I.quantize_int8(model, keep="head")
    with pytest.raises(TypeError):
        I.Int8Linear(torch.nn.Conv1d(2, 2, 1))


def test_weight_bytes_counts_parameters_and_buffers():
    lin = torch.nn.Linear(10, 5)
    assert I.weight_bytes(lin) == (50 + 5) * 4
    assert I.weight_bytes(I.Int8Linear(lin)) == 50 * 1 + 5 * 4 + 5 * 4  # int8 weights, fp32 scales and bias


def test_batch_sweep_times_every_batch_size():
    model = torch.nn.Linear(8, 4)
    pts = I.batch_sweep(model, torch.randn(16, 8), [1, 16, 4], repeats=5, warmup=1)
    assert [p.batch for p in pts] == [1, 16, 4]
    assert all(p.latency.n == 5 and p.latency.p99 >= p.latency.p50 > 0 for p in pts)
    assert pts[1].throughput == pytest.approx(16 / pts[1].latency.mean)  # sustained: the mean, not the median
    with pytest.raises(ValueError):
        I.batch_sweep(model, torch.randn(16, 8), [32])
    with pytest.raises(ValueError, match="cannot run"):
        I.batch_sweep(model, torch.randn(16, 3), [2])


def test_generation_is_greedy_argmax_and_timed():
    model = models.TinyGPT(vocab_size=12, seq_len=12, seed=3).eval()
    prompt = torch.randint(0, 12, (2, 7), generator=torch.Generator().manual_seed(0))
    gen = I.timed_generate(model, prompt, 5)
    seq = prompt
    for _ in range(5):  # the same, by hand
        seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(gen.tokens, seq[:, 7:]) and torch.equal(I.greedy_generate(model, prompt, 5), gen.tokens)
    assert len(gen.token_seconds) == 5 and gen.ttft == gen.token_seconds[0] > 0
    assert gen.time_per_output_token == I.percentile(list(gen.token_seconds[1:]), 50)
    with pytest.raises(ValueError):
        I.timed_generate(model, prompt, 7)  # 7 + 7 - 1 > seq_len 12
    with pytest.raises(TypeError):
        I.timed_generate(model, prompt.float(), 2)


def test_timing_waits_for_the_models_device_before_and_after_each_call(monkeypatch):
    """On a GPU the clock must time the kernels, not their launch: every timed call is bracketed by a synchronise of
    each device the model's tensors or the input live on (here a stand-in that records the calls; on a CPU it is
    a no-op). The meta device stands in for a second device the model lives on."""
    from labkit import device as dev_gate

    calls: list[str] = []
    monkeypatch.setattr(dev_gate, "synchronize", lambda d=None, stream_only=False: calls.append(str(d)))
    model = torch.nn.Linear(8, 4)
    I.batch_sweep(model, torch.randn(16, 8), [1, 4], repeats=3, warmup=1)
    assert calls == ["cpu"] * (2 * 2 * (3 + 1))  # 2 sizes x (3 + 1 rounds) x before and after
    calls.clear()
    model.register_buffer("elsewhere", torch.empty(1, device="meta"))
    assert [str(d) for d in I._devices(model, torch.randn(2, 8))] == ["cpu", "meta"]
    gpt = models.TinyGPT(vocab_size=12, seq_len=12, seed=3).eval()
    I.timed_generate(gpt, torch.randint(0, 12, (1, 7)), 3)
    assert calls == ["cpu"] * (2 * 3)
