"""labkit.recipes.comm_share: the summary arithmetic in-process, the recipe under torchrun (gloo, 2 CPU ranks).

One torchrun launch (module fixture) is shared by the tests that need ranks.
"""

from __future__ import annotations

import pytest
import torch

from labkit.dist import launch
from labkit.recipes import comm_share


def _event(step: int, start: float, end: float | None, index: int = 0) -> dict:
    return {"step": step, "index": index, "start": start, "end": end, "missing": 0, "tensors": 1, "bytes": 4}


def test_summary_counts_every_step_and_times_the_ones_after_warmup():
    steps = [(0.0, 1.0), (1.0, 2.0), (2.0, 3.0), (3.0, 4.0)]
    events = [_event(s, s + 0.1, s + 0.1 + d) for s, d in ((0, 0.9), (0, 0.9), (1, 0.5), (1, 0.5), (2, 0.2),
                                                             (2, 0.2), (3, 0.1), (3, 0.3))]
    out = comm_share.summarize_share(events, steps, samples_per_step=10, warmup=2)
    assert out["allreduces"] == 8 and out["allreduces_per_step"] == 2 and out["timed_steps"] == 2
    assert out["comm_s"] == pytest.approx(0.4) and out["step_s"] == pytest.approx(1.0)
    assert out["share"] == pytest.approx(0.4) and out["comm_s_per_sample"] == pytest.approx(0.04)
    assert out["comm_s_min"] == pytest.approx(0.4) and out["comm_s_per_sample_min"] == pytest.approx(0.04)
    odd = comm_share.summarize_share(events[:-1], steps, samples_per_step=10, warmup=0)
    assert odd["allreduces_per_step"] == 7 / 4 and odd["comm_s_min"] == pytest.approx(0.1)


@pytest.mark.parametrize("kwargs, exc", [
    ({"events": [], "steps": [(0.0, 1.0)], "samples_per_step": 1, "warmup": 1}, ValueError),  # nothing left to time
    ({"events": [], "steps": [(1.0, 0.5), (1.0, 2.0)], "samples_per_step": 1, "warmup": 0}, ValueError),
    ({"events": [], "steps": [(0.0, 1.0)], "samples_per_step": 0, "warmup": 0}, ValueError),
    ({"events": [], "steps": [(0.0, 1.0)], "samples_per_step": 1.5, "warmup": 0}, TypeError),
    ({"events": [_event(3, 0.0, 1.0)], "steps": [(0.0, 1.0)], "samples_per_step": 1, "warmup": 0}, ValueError),
    ({"events": [_event(0, 0.0, None)], "steps": [(0.0, 1.0)], "samples_per_step": 1, "warmup": 0}, ValueError),
    ({"events": [{"step": 0}], "steps": [(0.0, 1.0)], "samples_per_step": 1, "warmup": 0}, ValueError),
])
def test_summary_refuses_bad_input(kwargs, exc):
    with pytest.raises(exc):
        comm_share.summarize_share(**kwargs)


def test_timing_hook_checks_its_arguments():
    with pytest.raises(TypeError):
        comm_share.timing_hook({}, [], {})
    with pytest.raises(TypeError):
        comm_share.timing_hook([], [torch.zeros(1)], [])
    with pytest.raises(TypeError):
        comm_share.timing_hook([], [1.0], {})
    assert callable(comm_share.timing_hook([], [torch.zeros(1)], {}))


@pytest.mark.parametrize("argv", [["--accum", "1"], ["--steps", "2"], ["--bucket-caps", "0"],
                                  ["--bucket-caps", "1,nan"], ["--bucket-caps", ",".join(["1"] * 9)]])
def test_bad_flags_are_refused_while_parsing(argv, capsys):
    with pytest.raises(SystemExit) as info:
        comm_share.build_parser().parse_args(argv)
    assert info.value.code == 2


@pytest.fixture(scope="module")
def run():
    return launch("labkit.recipes.comm_share", 2, ["--hidden", "64", "--depth", "3", "--batch", "8", "--accum", "3",
                                                   "--steps", "6", "--bucket-caps", "25,0.01"],
                  timeout=120, stream=False)


@pytest.mark.slow
def test_no_sync_divides_the_all_reduces_and_keeps_the_weights(run):
    assert run["world_size"] == 2 and run["backend"] == "gloo" and run["samples_per_step"] == 8 * 2 * 3
    assert [r["allreduces_per_step"] for r in run["sync"]] == [3, 3]
    assert [r["allreduces_per_step"] for r in run["no_sync"]] == [1, 1]
    assert all(r["allreduces"] == 3 * r["steps"] for r in run["sync"])
    assert run["param_diff"] < 1e-5
    for r in run["sync"] + run["no_sync"]:
        assert 0 < r["comm_s_min"] <= r["comm_s"] and 0 < r["share"] < 1.5  # a share, up to clock noise


@pytest.mark.slow
def test_buckets_start_before_backward_ends_only_when_there_are_several(run):
    for per_rank in run["buckets_per_rank"]:
        one, many = per_rank
        assert one["bucket_cap_mb"] == 25 and many["bucket_cap_mb"] == 0.01
        assert [b["missing"] for b in one["buckets"]] == [0]  # one bucket waits for every gradient
        assert len(many["buckets"]) > 1 and many["buckets"][0]["missing"] > 0 == many["buckets"][-1]["missing"]
        assert [b["index"] for b in many["buckets"]] == list(range(len(many["buckets"])))
        # the buckets hold every gradient once: DDP's bucket buffers add up to the model's fp32 gradients
        assert sum(b["bytes"] for b in many["buckets"]) == one["buckets"][0]["bytes"] == 4 * run["params"]
        assert sum(b["tensors"] for b in many["buckets"]) == one["params"] == 8
