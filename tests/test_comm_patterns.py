"""labkit.recipes.comm_patterns: a parameter server and a ring all-reduce by hand, and BatchNorm across ranks.

One torchrun launch with 3 ranks (notebook 14 uses 4: an odd number of ranks checks the ring's indices), whose
results are checked against torch inside the ranks (``dist.all_reduce``; one process with every rank's rows for
BatchNorm) and against the traffic formulas here; the bytes come from torch.profiler, not from the recipe's code.
"""

from __future__ import annotations

import pytest
import torch

from labkit.dist import launch
from labkit.recipes import comm_patterns as comm

P, N_ELEMS = 3, 3000  # N divisible by p: the ring's pieces are equal and its formula exact


@pytest.fixture(scope="module")
def result():
    return launch("labkit.recipes.comm_patterns", P,
                  ["--device", "cpu", "--elements", str(N_ELEMS), "--batch", "2", "--channels", "3"],
                  timeout=240, stream=False)


def test_both_hand_written_all_reduces_give_dist_all_reduces_sums(result):
    ar = result["allreduce"]
    assert result["world_size"] == P and result["backend"] == "gloo"
    assert ar["bytes"] == 4 * N_ELEMS
    assert ar["ps"]["max_rel_diff"] < 1e-5 and ar["ring"]["max_rel_diff"] < 1e-5


def test_the_traffic_matches_the_formulas(result):
    ar = result["allreduce"]
    n = ar["bytes"]
    # parameter server: rank 0 receives and sends (p - 1) N, every worker N each way, in one message
    assert ar["ps"]["sent"] == ar["ps"]["received"] == [(P - 1) * n, n, n]
    assert ar["ps"]["messages_sent"] == [P - 1, 1, 1]
    # ring: 2 (p - 1) messages of N / p each, on every rank
    assert ar["ring"]["sent"] == ar["ring"]["received"] == [2 * (P - 1) * n // P] * P
    assert ar["ring"]["messages_sent"] == [2 * (P - 1)] * P


def test_batchnorm_local_statistics_differ_and_synchronised_ones_match_one_process(result):
    bn = result["batchnorm"]
    assert (bn["world_size"], bn["batch_per_rank"], bn["channels"]) == (P, 2, 3)
    assert set(bn["local"]) == set(bn["sync"]) == {"output", "input_grad", "running_mean", "running_var"}
    assert min(bn["local"].values()) > 1e-3
    assert max(bn["sync"].values()) < 1e-5
    assert bn["running_mean_differs_between_ranks"]


def test_torch_syncbatchnorm_refuses_cpu_tensors(result):
    """The reason the recipe synchronises by hand on the CPU: torch's own module raises (torch 2.13)."""
    sync = result["batchnorm"]["torch_syncbn"]
    assert sync["ran"] is False and sync["error"].startswith("ValueError: SyncBatchNorm expected input tensor")


def test_functions_check_their_arguments_before_the_process_group():
    bn = torch.nn.BatchNorm1d(3)
    for fn in (comm.ps_allreduce, comm.ring_allreduce):
        with pytest.raises(TypeError):
            fn([1.0, 2.0])
        with pytest.raises(ValueError):
            fn(torch.arange(3))                              # integers: not a floating-point gradient
        with pytest.raises(RuntimeError, match="initialised process group"):
            fn(torch.ones(3))
    with pytest.raises(TypeError, match="BatchNorm1d"):
        comm.sync_batch_norm(torch.ones(4, 3), torch.nn.LayerNorm(3))
    with pytest.raises(TypeError, match="momentum"):
        comm.sync_batch_norm(torch.ones(4, 3), torch.nn.BatchNorm1d(3, momentum=None))
    with pytest.raises(ValueError, match="shape"):
        comm.sync_batch_norm(torch.ones(4, 5), bn)
    with pytest.raises(ValueError, match="eval mode"):
        comm.sync_batch_norm(torch.ones(4, 3), torch.nn.BatchNorm1d(3).eval())
    with pytest.raises(RuntimeError, match="initialised process group"):
        comm.sync_batch_norm(torch.ones(4, 3), bn)


@pytest.mark.parametrize("argv", [["--elements", "0"], ["--batch", "1"], ["--channels", "x"], ["--bogus"],
                                  ["--device", "nonsense"], ["--pg-timeout", "inf"]])
def test_the_parser_rejects_bad_flags(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        comm.build_parser().parse_args(argv)
    assert exc.value.code == 2
    assert capsys.readouterr().err.startswith("python -m labkit.recipes.comm_patterns: error:")
