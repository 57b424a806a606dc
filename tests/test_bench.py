"""Tests for labkit.bench: warm-up + median, interleaved comparisons, the amp candidates and the CLI.

No timing assertions: the timer is replaced where ratios are checked."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from labkit import bench


def test_time_fn_counts_warmup_and_repeats():
    calls = []
    t = bench.time_fn(lambda: calls.append(1), warmup=2, repeats=5, device="cpu", name="noop")
    assert len(calls) == 7 and len(t.times) == 5 and t.warmup == 2
    assert t.method == "perf_counter" and t.median >= 0 and t.name == "noop"


def test_compare_interleaves_and_rotates(monkeypatch):
    order: list[str] = []
    cands = {k: (lambda k=k: order.append(k)) for k in "abc"}
    cmp = bench.compare(cands, warmup=1, repeats=3, device="cpu")
    assert order[:3] == ["a", "b", "c"]  # warm-up round
    assert order[3:] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert cmp.baseline == "a" and set(cmp.timings) == {"a", "b", "c"}


def test_ratios_use_medians_of_the_same_run(monkeypatch):
    fake = {"fp32": [4.0, 100.0, 4.0], "bf16": [1.0, 1.0, 50.0]}  # one outlier each: medians 4 and 1
    it = {k: iter(v) for k, v in fake.items()}

    def fake_timer(dev):
        return (lambda fn: next(it[fn()])), "fake"

    monkeypatch.setattr(bench, "_timer", fake_timer)
    cmp = bench.compare({"fp32": lambda: "fp32", "bf16": lambda: "bf16"}, warmup=0, repeats=3, device="cpu")
    assert cmp.timings["fp32"].median == 4.0 and cmp.ratio("bf16") == 0.25 and cmp.speedup("bf16") == 4.0
    assert "time / fp32" in cmp.table() and cmp.method == "fake"


def test_matmul_candidates_compute_the_product():
    c = bench.matmul_candidates(32, ("fp32", "bf16"), "cpu")
    assert set(c) == {"fp32", "bf16"}
    out32, out16 = c["fp32"](), c["bf16"]()
    assert out16.dtype == torch.bfloat16
    torch.testing.assert_close(out16.float(), out32, rtol=0.05, atol=0.5)


def test_train_step_candidates_update_the_model():
    c = bench.train_step_candidates(("fp32", "bf16"), "cpu", batch_size=4, d_model=16, n_layers=1)
    for step in c.values():
        step()
        step()


def test_bad_arguments():
    with pytest.raises(ValueError):
        bench.compare({})
    with pytest.raises(ValueError, match="baseline"):
        bench.compare({"a": lambda: None}, baseline="b")
    with pytest.raises(ValueError, match="repeats"):
        bench.time_fn(lambda: None, repeats=0)
    with pytest.raises(TypeError):
        bench.compare({"a": 3})
    with pytest.raises(ValueError, match="unknown dtype"):
        bench.matmul_candidates(8, ("fp8",), "cpu")


def test_cli_amp_prints_ratios_measured_in_one_run():
    cmd = [sys.executable, "-m", "labkit.bench", "amp", "--device", "cpu", "--size", "64", "--warmup", "1",
           "--repeats", "2", "--batch-size", "4", "--threads", "1"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300).stdout
    assert "bf16/fp32 time ratio: matmul" in out and "train step" in out
    assert "interleaved" in out and "perf_counter" in out


@pytest.mark.parametrize(("argv", "match"), [
    (["amp", "--threads", "0"], "--threads"), (["amp", "--size", "0"], "--size"),
    (["amp", "--dtypes", "fp8"], "--dtypes"), (["amp", "--repeats", "-1"], "--repeats"),
    (["amp", "--device", "nonsense"], "--device"), (["peak", "--sizes", "64,x"], "--sizes"),
    (["peak", "--bandwidth-mib", "0"], "--bandwidth-mib"), (["nope"], "invalid choice"),
    # sizes with an upper bound: a typo cannot time for days or start a million threads
    (["amp", "--repeats", str(10**9)], "<= 10000"), (["amp", "--warmup", "10001"], "<= 10000"),
    (["amp", "--threads", str(10**6)], "<= 1024"), (["peak", "--threads", "1025"], "<= 1024"),
])
def test_cli_bad_values_fail_while_parsing(argv, match, capsys):
    """One line on stderr and exit status 2, before anything is measured (in-process: no torch start-up)."""
    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and match in err and err.startswith("python -m labkit.bench")


def test_cli_amp_threads_0_as_a_user_runs_it():
    """``--threads 0`` used to reach torch.set_num_threads and end in a RuntimeError traceback."""
    out = subprocess.run([sys.executable, "-m", "labkit.bench", "amp", "--threads", "0"], capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 2 and out.stdout == "" and "Traceback" not in out.stderr
    assert out.stderr.count("\n") == 1 and "--threads" in out.stderr


def test_round_speedups_pair_each_round_and_quartiles_bracket_the_median():
    from labkit.bench import Comparison, Timing
    cmp = Comparison({"a": Timing("a", (2.0, 4.0, 6.0, 8.0, 10.0), 0, "t"),
                      "b": Timing("b", (1.0, 1.0, 3.0, 8.0, 2.0), 0, "t")}, "a", "t")
    assert cmp.round_speedups("b") == (1.0, 2.0, 2.0, 4.0, 5.0)   # a_r / b_r, sorted
    lo, mid, hi = cmp.speedup_quartiles("b")
    assert (lo, mid, hi) == (2.0, 2.0, 4.0)
    with pytest.raises(ValueError):
        cmp.round_speedups("c")


def test_excess_note_names_the_wrong_assumption_only_above_the_peak():
    from labkit.bench import TheoreticalPeak, excess_note
    theo = TheoreticalPeak("bf16", 665e9, "2 cores x 2.60 GHz x 128 FLOP/cycle", ())
    assert excess_note(theo, 600e9) == ""
    note = excess_note(theo, 867e9)                     # the EPYC VM's 130 %
    assert "2.60 GHz" in note and "nominal clock" in note
    with pytest.raises(TypeError):
        excess_note(665e9, 867e9)
