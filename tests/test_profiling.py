"""Tests for labkit.profiling: profiler tables and shares, traces, the fused chain vs PyTorch's own GELU/dropout."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from labkit import profiling as P


@pytest.fixture(scope="module")
def mm_profile():
    a, b, small = torch.randn(256, 256), torch.randn(256, 256), torch.randn(8)

    def step():
        for _ in range(3):
            a @ b
        small.add(1.0)

    return P.profile_steps(step, steps=2, warmup=1, device="cpu")


def _us(text: str) -> float:
    for unit, scale in (("us", 1.0), ("ms", 1e3), ("s", 1e6)):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * scale
    raise ValueError(text)


def test_top_ops_shares_are_sorted_fractions_of_the_self_time(mm_profile):
    ops = P.top_ops(mm_profile, k=50)
    shares = [o.share for o in ops]
    assert shares == sorted(shares, reverse=True)
    assert all(0 <= s <= 1 for s in shares) and sum(shares) == pytest.approx(1.0)
    by_name = {o.name: o for o in ops}
    assert by_name["aten::mm"].calls == 6 and by_name["aten::add"].calls == 2  # 2 profiled steps, not the warm-up
    total = sum(e.self_cpu_time_total for e in mm_profile.key_averages() if e.key != "train_step")
    assert by_name["aten::mm"].share == pytest.approx(by_name["aten::mm"].self_us / total)
    assert "train_step" not in by_name
    assert len(P.top_ops(mm_profile, k=1)) == 1
    with pytest.raises(ValueError):
        P.top_ops(mm_profile, k=0)
    with pytest.raises(ValueError):
        P.top_ops(mm_profile, by="gpu")


def test_op_table_is_sorted_by_self_time(mm_profile):
    t = P.op_table(mm_profile, row_limit=5)
    assert "Self CPU" in t and "aten::mm" in t
    rows = [ln.split() for ln in t.splitlines() if ln.strip().startswith(("aten::", "train_step"))]
    assert len(rows) == 5
    self_us = [_us(r[2]) for r in rows]  # name, self %, self time, ...
    assert self_us == sorted(self_us, reverse=True)
    with pytest.raises(ValueError):
        P.op_table(mm_profile, row_limit=0)


def test_profile_keeps_kineto_lines_off_stderr(capfd):
    P.profile_steps(lambda: torch.ones(4).sum(), steps=1, warmup=0, device="cpu")
    err = capfd.readouterr().err
    assert "profiler_start" not in err and "USDT" not in err


def test_profile_bad_arguments():
    with pytest.raises(TypeError):
        P.profile_steps("not callable")
    with pytest.raises(ValueError):
        P.profile_steps(lambda: None, steps=0)


def test_ops_to_cover():
    assert P.ops_to_cover([0.5, 0.3, 0.1, 0.1], 0.8) == 2
    assert P.ops_to_cover([0.1, 0.5, 0.3, 0.1], 0.8) == 2  # sorted first
    assert P.ops_to_cover([0.25] * 4, 1.0) == 4
    assert P.ops_to_cover([0.9], 0.8) == 1
    with pytest.raises(ValueError):
        P.ops_to_cover([0.2, 0.2], 0.8)
    with pytest.raises(ValueError):
        P.ops_to_cover([], 0.8)
    with pytest.raises(ValueError):
        P.ops_to_cover([0.5], 0.0)


def test_chrome_trace_round_trip(mm_profile, tmp_path):
    path = P.write_chrome_trace(mm_profile, tmp_path / "sub" / "trace.json")
    assert path.exists()
    data = P.read_chrome_trace(path)
    names = {e.get("name") for e in data["traceEvents"]}
    assert "aten::mm" in names and "train_step" in names
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"nope": 1}))
    with pytest.raises(ValueError, match="traceEvents"):
        P.read_chrome_trace(bad)


def test_make_gpt_step_trains():
    step = P.make_gpt_step(batch=16, seed=1, device="cpu")
    losses = [step() for _ in range(8)]
    assert all(isinstance(v, float) for v in losses)
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("shape", [(64, 96), (33, 1000), (1, 7)])
@pytest.mark.parametrize("p", [0.0, 0.1, 0.5])
def test_gelu_chains_match_pytorch_gelu_and_dropout(shape, p):
    g = torch.Generator().manual_seed(shape[0] * 31 + int(p * 10))
    x = torch.randn(shape, generator=g) * 3
    bias = torch.randn(shape[1], generator=g)
    # the mask PyTorch's own dropout draws, read back from its output
    torch.manual_seed(7)
    ref_gelu = F.gelu(x + bias, approximate="tanh")
    want = F.dropout(ref_gelu, p=p, training=True)
    mask = (want != 0) | (ref_gelu == 0)
    for fn in (P.gelu_chain_unfused, P.gelu_chain_fused, P.gelu_chain_reference):
        got = fn(x, bias, mask, p)
        torch.testing.assert_close(got, want, atol=2e-6, rtol=2e-6)
    small_blocks = P.gelu_chain_fused(x, bias, mask, p, block_bytes=1)  # one row per block
    torch.testing.assert_close(small_blocks, want, atol=2e-6, rtol=2e-6)


def test_gelu_chain_bad_arguments():
    x, b, m = torch.randn(4, 5), torch.randn(5), torch.ones(4, 5, dtype=torch.bool)
    with pytest.raises(ValueError, match="bias"):
        P.gelu_chain_unfused(x, torch.randn(4), m)
    with pytest.raises(ValueError, match="dropout"):
        P.gelu_chain_fused(x, b, m, p=1.0)
    with pytest.raises(TypeError):
        P.gelu_chain_reference(x.numpy(), b, m)


class _ByteCounter(TorchDispatchMode):
    """Sum the bytes of every tensor each aten op reads (distinct inputs) and writes."""

    def __init__(self):
        super().__init__()
        self.ops, self.bytes = 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        seen = {id(a): a for a in args if isinstance(a, torch.Tensor)}
        self.ops += 1
        self.bytes += sum(t.nbytes for t in seen.values()) + out.nbytes
        return out


def test_gelu_chain_cost_matches_the_bytes_the_unfused_ops_touch():
    rows, cols = 64, 128
    x, bias = torch.randn(rows, cols), torch.randn(cols)
    mask = torch.rand(rows, cols) > 0.1
    with _ByteCounter() as bc:
        P.gelu_chain_unfused(x, bias, mask, 0.1)
    cost = P.gelu_chain_cost(x.numel(), torch.float32, fused=False)
    assert bc.ops == len(P.CHAIN_STEPS)
    assert bc.bytes == cost.bytes + bias.nbytes  # the model leaves out the (cached) bias vector
    fused = P.gelu_chain_cost(x.numel(), torch.float32, fused=True)
    assert fused.bytes == x.nbytes + mask.nbytes + x.nbytes
    assert fused.flops == cost.flops and fused.bytes < cost.bytes / 10
    assert P.gelu_chain_cost(100, "bf16", fused=True).bytes == 100 * 5


def test_launch_overhead_returns_consistent_figures():
    r = P.launch_overhead(n_ops=50, size=8, repeats=2, device="cpu")
    assert set(r) == {"many_s", "one_s", "ratio", "overhead_us"}
    assert r["many_s"] > 0 and r["one_s"] > 0 and r["ratio"] == pytest.approx(r["many_s"] / r["one_s"])
    with pytest.raises(ValueError):
        P.launch_overhead(n_ops=0)


def test_interleaved_times_runs_each_function_the_same_number_of_times():
    calls = {"a": 0, "b": 0}

    def mk(k):
        def f(v):
            calls[k] += v
        return f

    t = P.interleaved_times({"a": mk("a"), "b": mk("b")}, 1, repeats=3, warmup=2, device="cpu")
    assert calls == {"a": 5, "b": 5} and set(t) == {"a", "b"} and all(v >= 0 for v in t.values())
    with pytest.raises(TypeError):
        P.interleaved_times({})


def test_compile_timed_eager_backend_gives_the_same_result():
    x, b = torch.randn(8, 16), torch.randn(16)
    m = torch.ones(8, 16, dtype=torch.bool)
    fn, seconds = P.compile_timed(P.gelu_chain_unfused, x, b, m, 0.1, backend="eager")
    assert seconds > 0
    torch.testing.assert_close(fn(x, b, m, 0.1), P.gelu_chain_reference(x, b, m, 0.1))
    with pytest.raises(TypeError):
        P.compile_timed(42)


def test_busy_fraction_on_a_synthetic_trace():
    ev = [{"ph": "X", "name": "train_step", "cat": "user_annotation", "ts": 0, "dur": 100},
          {"ph": "X", "name": "train_step", "cat": "user_annotation", "ts": 200, "dur": 100},
          {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 10, "dur": 30},
          {"ph": "X", "name": "aten::add", "cat": "cpu_op", "ts": 20, "dur": 30},   # overlaps: counts once
          {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 90, "dur": 20},    # half outside the window
          {"ph": "X", "name": "gemm", "cat": "kernel", "ts": 210, "dur": 50},
          {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 150, "dur": 20}]   # between windows
    assert P.busy_fraction(ev) == pytest.approx((40 + 10) / 200)
    assert P.busy_fraction(ev, category="kernel") == pytest.approx(50 / 200)
    with pytest.raises(ValueError, match="no 'step'"):
        P.busy_fraction(ev, window="step")


def test_busy_fraction_of_a_real_profile_is_a_fraction(tmp_path):
    step = P.make_gpt_step(batch=4, n_layers=1)
    prof = P.profile_steps(step, steps=2)
    events = P.read_chrome_trace(P.write_chrome_trace(prof, tmp_path / "t.json"))["traceEvents"]
    assert 0 < P.busy_fraction(events) <= 1


def test_gpt_train_flops_matches_torch_flop_counter():
    from labkit import models

    for kw, batch in (({}, 32), ({"n_layers": 3, "d_model": 64, "mlp_ratio": 2}, 4)):
        step = P.make_gpt_step(batch=batch, **kw)
        cfg = models.GPTConfig(vocab_size=12, seq_len=12, **kw)
        assert P.count_flops(step) == P.gpt_train_flops(cfg, batch)
    cfg = models.GPTConfig(vocab_size=12, seq_len=12)
    assert P.gpt_train_flops(cfg, 2, seq_len=6) < P.gpt_train_flops(cfg, 2)
    with pytest.raises(ValueError):
        P.gpt_train_flops(cfg, 0)
    with pytest.raises(TypeError):
        P.gpt_train_flops(object(), 2)


def test_mfu_formula():
    # 6 * 1e9 params * 1e5 tokens = 6e14 FLOPs in 2 s on a 1e15 FLOP/s peak: 30 %
    assert P.mfu(6 * 10**9 * 10**5, 2.0, 1e15) == pytest.approx(0.3)
    for bad in (0, -1.0, float("inf")):
        with pytest.raises(ValueError):
            P.mfu(1.0, bad, 1.0)
    with pytest.raises(TypeError):
        P.mfu("1", 1.0, 1.0)  # type: ignore[arg-type]


def test_top_ops_by_device_time_counts_each_kernel_once(mm_profile, monkeypatch):
    """make gpu-check's expert read: in a GPU profile each kernel is a row of its own (device type CUDA) and also
    inside the self device time of the op that launched it. Ranked by device time, only the ops count, so the
    shares are of the kernels' time once. (A stand-in key_averages: no GPU here.)"""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    def row(key, dev, us):
        return SimpleNamespace(key=key, device_type=dev, self_device_time_total=us, self_cpu_time_total=1.0, count=1)

    rows = [row("aten::mm", DeviceType.CPU, 600.0), row("aten::add", DeviceType.CPU, 400.0),
            row("void gemm_kernel<...>", DeviceType.CUDA, 600.0), row("elementwise_kernel", DeviceType.CUDA, 400.0),
            row("train_step", DeviceType.CPU, 1000.0)]
    monkeypatch.setattr(mm_profile, "key_averages", lambda: rows)
    ops = P.top_ops(mm_profile, k=10, by="device")
    assert [(o.name, o.share) for o in ops] == [("aten::mm", 0.6), ("aten::add", 0.4)]
