"""labkit.handpar and labkit.recipes.handpar: parallelism by hand, checked against torch, DeepSpeed and one process.

Three torchrun launches in all: the recipe with every part (2 ranks, shared by a module fixture), the 3-rank
bitwise experiment (tests/handpar_ranks.py), and the graders on more typical mistakes. The rest runs in this
process, on a 1-rank gloo group where a group is needed.
"""

from __future__ import annotations

import linecache
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from labkit import dist as ldist
from labkit import handpar, memory, models, zero
from labkit.check import evaluate
from labkit.dist import launch
from labkit.exercises import _nb11_mistakes as mistakes
from labkit.exercises import nb11
from labkit.recipes import allreduce
from labkit.recipes import handpar as recipe
from labkit.recipes import handpar_grade as grader

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------------------
# in this process: formulas, layouts, validation, a 1-rank group
# --------------------------------------------------------------------------------------------------

def test_collective_names_are_the_same_for_gloo_and_nccl():
    """The profiler names NCCL's collectives differently (its *_base ops, ranks in p2p names); the counts must not
    depend on the backend."""
    names = {"gloo:all_reduce": "all_reduce", "nccl:all_reduce": "all_reduce", "gloo:all_gather": "all_gather",
             "nccl:_all_gather_base": "all_gather", "nccl:_reduce_scatter_base": "reduce_scatter",
             "gloo:send": "send", "nccl:send 0->1": "send", "nccl:recv 0<-1": "recv", "gloo:recv": "recv"}
    assert {k: handpar.collective_name(k) for k in names} == names


def test_bucket_layout_is_the_one_torch_ddp_rebuilds():
    """torch's own bucket assignment (what DDP calls when it rebuilds buckets in gradient-ready order)."""
    numels = [16384, 256, 65536, 256, 65536, 256, 256, 1]
    tensors = [torch.empty(n) for n in numels]
    order = list(reversed(range(len(numels))))
    for cap in (1, 300, 1000, 65536, 70000, 10**6):
        theirs, _ = dist._compute_bucket_assignment_by_size([tensors[i] for i in order], [4 * cap],
                                                            [False] * len(order), order)
        assert handpar.bucket_layout(numels, cap) == [list(b) for b in theirs], cap


def test_formulas_against_independent_figures():
    for n in (1, 2, 3, 8, 64):  # nccl-tests' busbw factor is the ring all-reduce's bytes per payload byte
        assert math.isclose(handpar.ring_traffic("all_reduce", 1.0, n), allreduce.busbw_factor(n))
        assert math.isclose(2 * handpar.ring_traffic("all_gather", 1.0, n), allreduce.busbw_factor(n))
    assert handpar.tp_comm_bytes(256, 128) == {"forward": 131072, "backward": 131072, "total": 262144}
    assert handpar.pipeline_p2p_bytes(256, 1024)["total"] == 2 * 256 * 1024 * 4
    assert [handpar.bubble_fraction(2, m) for m in (1, 2, 4, 8)] == [1 / 2, 1 / 3, 1 / 5, 1 / 9]
    assert handpar.bubble_fraction(1, 4) == 0.0


@pytest.mark.parametrize(("call", "exc"), [
    (lambda: handpar.bucket_layout("1,2", 4), TypeError),
    (lambda: handpar.bucket_layout([1, 0], 4), ValueError),
    (lambda: handpar.bucket_layout([1, 2], True), TypeError),
    (lambda: handpar.ring_traffic("all_to_all", 4, 2), ValueError),
    (lambda: handpar.ring_traffic("all_reduce", math.nan, 2), ValueError),
    (lambda: handpar.bubble_fraction(2, 0), ValueError),
    (lambda: handpar.allreduce_gradients("model"), TypeError),
    (lambda: handpar.allreduce_gradients(nn.Linear(2, 2)), ValueError),   # no process group
    (lambda: handpar.overlap_gradients(nn.Linear(2, 2)), ValueError),
    (lambda: handpar.ShardedAdamW(nn.Linear(2, 2).parameters()), ValueError),
    (lambda: handpar.TensorParallelMLP(nn.Linear(2, 4), nn.Linear(3, 2)), ValueError),
    (lambda: handpar.zero1_step(torch.ones(4), torch.ones(4), torch.ones(2), "adam"), TypeError),
    (lambda: handpar.clip_sharded_grad_norm_([1.0], 1.0), TypeError),
    (lambda: handpar.clip_sharded_grad_norm_(torch.ones(2), 0), ValueError),
    (lambda: handpar.broadcast_parameters("model"), TypeError),
])
def test_bad_input_and_no_process_group_are_clear_errors(call, exc):
    assert not dist.is_initialized()
    with pytest.raises(exc):
        call()


@pytest.fixture
def one_rank_group(monkeypatch):
    """A real gloo process group of one rank, in this process, destroyed afterwards."""
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "MASTER_ADDR"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(os, "environ", dict(os.environ))  # init_process_group writes the layout into it
    ldist.init_process_group("gloo", timeout_s=30)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_a_parameter_without_gradient_is_named_and_the_next_step_works(one_rank_group):
    """The by-hand buckets raise instead of hanging or skipping a bucket silently; step 0 is a no-op on one rank."""
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body, self.out = nn.Linear(8, 8), nn.Linear(8, 8)
            self.head = nn.Linear(8, 2)  # registered, not called in forward: it never gets a gradient

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.out(self.body(x))

    model = Net()
    before = [p.detach().clone() for p in model.parameters()]
    handpar.broadcast_parameters(model)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    with pytest.raises(ValueError, match="src"):
        handpar.broadcast_parameters(model, src=1)
    buckets = handpar.BucketedGradients(model, bucket_mb=1e-4)  # 26 elements: several buckets
    x = torch.randn(4, 8)
    model(x).sum().backward()
    with pytest.raises(RuntimeError, match=r"head\.weight, head\.bias|head\.bias, head\.weight"):
        buckets.wait()
    del model.head  # now every parameter takes part: a full step goes through and averages (one rank: unchanged)
    buckets = handpar.BucketedGradients(model, bucket_mb=1e-4)
    model.zero_grad(set_to_none=True)
    model(x).sum().backward()
    want = [p.grad.clone() for p in model.parameters()]
    buckets.wait()
    assert all(torch.equal(g, p.grad) for g, p in zip(want, model.parameters()))


def test_sharded_clipping_on_one_rank_is_clip_grad_norm(one_rank_group):
    g = torch.randn(1000, generator=torch.Generator().manual_seed(3))
    p = torch.nn.Parameter(torch.zeros(1000))
    p.grad = g.clone()
    want = float(torch.nn.utils.clip_grad_norm_([p], 0.5))
    mine = g.clone()
    got = handpar.clip_sharded_grad_norm_(mine, 0.5)
    assert math.isclose(got, want, rel_tol=1e-6) and torch.allclose(mine, p.grad, rtol=1e-6)
    small = g * 1e-4  # below max_norm: untouched
    assert handpar.clip_sharded_grad_norm_(small, 0.5) < 0.5 and torch.equal(small, g * 1e-4)
    with pytest.raises(ValueError, match="default step_fn"):
        handpar.ShardedAdamW(nn.Linear(2, 2).parameters(), step_fn=lambda *a: None, max_norm=1.0)


def test_on_one_rank_every_strategy_is_the_plain_model(one_rank_group):
    torch.manual_seed(0)
    x, y = torch.randn(16, 8), torch.randn(16, 8)
    # ZeRO-1 with one rank: the whole vector is the shard, and the step is AdamW's, bit for bit
    a, b = nn.Linear(8, 8), nn.Linear(8, 8)
    b.load_state_dict(a.state_dict())
    sharded = handpar.ShardedAdamW(a.parameters(), lr=1e-2)
    plain = torch.optim.AdamW(b.parameters(), lr=1e-2, foreach=False)
    for _ in range(3):
        for m, opt in ((a, sharded), (b, plain)):
            opt.zero_grad()
            F.mse_loss(m(x), y).backward()
            opt.step()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert sharded.padded == 72 and sharded.state_bytes() == 2 * 4 * 72
    # Megatron's MLP with one rank is the MLP
    fc1, fc2 = nn.Linear(8, 32), nn.Linear(32, 8)
    tp = handpar.TensorParallelMLP(fc1, fc2)
    assert torch.equal(tp(x), fc2(F.gelu(fc1(x))))
    # ... and with sequence parallelism, the pre-norm block x + MLP(LayerNorm(x))
    norm = nn.LayerNorm(8)
    sp = handpar.SequenceParallelBlock(norm, fc1, fc2)
    assert torch.equal(sp(x), x + fc2(F.gelu(fc1(norm(x)))))
    assert sp.replicated() == [sp.ln_w, sp.ln_b, sp.mlp.b2]
    with pytest.raises(ValueError, match="normalise the last dimension"):
        handpar.SequenceParallelBlock(nn.LayerNorm(4), fc1, fc2)
    with pytest.raises(TypeError, match="LayerNorm"):
        handpar.SequenceParallelBlock(nn.Linear(8, 8), fc1, fc2)
    with pytest.raises(TypeError, match="SequenceParallelBlock"):
        handpar.allreduce_sequence_parallel_grads(tp)
    # the whole loops, on one rank, are plain training
    data = [(x, y), (y, x)]
    for train in ("ddp", "zero1"):
        a, b = nn.Linear(8, 8), nn.Linear(8, 8)
        b.load_state_dict(a.state_dict())
        if train == "ddp":
            handpar.train_ddp(a, torch.optim.SGD(a.parameters(), lr=0.1), data, F.mse_loss)
        else:
            handpar.train_zero1(a, data, F.mse_loss, lr=0.1)
        opt = torch.optim.SGD(b.parameters(), lr=0.1) if train == "ddp" else torch.optim.AdamW(
            b.parameters(), lr=0.1, foreach=False)
        for xi, yi in data:
            opt.zero_grad()
            F.mse_loss(b(xi), yi).backward()
            opt.step()
        assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters())), train
    # GPipe with one stage and 4 micro-batches: the gradient of the mean loss, to rounding
    stage = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8))
    loss = handpar.gpipe_step(stage, list(x.chunk(4)), list(y.chunk(4)), F.mse_loss, (4, 8))
    mine = [p.grad.clone() for p in stage.parameters()]
    stage.zero_grad()
    whole = F.mse_loss(stage(x), y)
    whole.backward()
    assert math.isclose(loss, whole.item(), rel_tol=1e-6)
    assert all(torch.allclose(g, p.grad, rtol=1e-5, atol=1e-7) for g, p in zip(mine, stage.parameters()))
    before = [p.detach().clone() for p in stage.parameters()]
    losses = handpar.train_gpipe(stage, torch.optim.SGD(stage.parameters(), lr=0.1), [(x, y)], F.mse_loss, 4, (4, 8))
    assert len(losses) == 1 and math.isclose(losses[0], whole.item(), rel_tol=1e-6)
    assert not any(torch.equal(a, b) for a, b in zip(before, stage.parameters()))
    with pytest.raises(ValueError, match="micro_batches"):
        handpar.train_gpipe(stage, torch.optim.SGD(stage.parameters(), lr=0.1), [(x, y)], F.mse_loss, 0, (4, 8))


# --------------------------------------------------------------------------------------------------
# 2 ranks: every part of the recipe in one launch
# --------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def launched():
    return launch("labkit.recipes.handpar", 2, ["--reps", "2", "--micro", "1,4", "--steps", "3", "--device", "cpu"],
                  timeout=400, stream=False)


@pytest.mark.slow
def test_ddp_by_hand_is_bitwise_torch_ddp_with_the_expected_messages(launched):
    d = launched["ddp"]
    assert all(all(f.values()) for f in d["bitwise_grads_vs_ddp"] + d["bitwise_params_vs_ddp"])
    c = d["collectives"]
    assert {k: c[k]["all_reduce"]["calls"] for k in c} == {"naive": 8, "overlap": 8, "bucketed": 3, "ddp": 1}
    assert {k: c[k]["issued_in_backward"] for k in c} == {"naive": 0, "overlap": 8, "bucketed": 3, "ddp": 1}
    assert all(c[k]["all_reduce"]["elements"] == d["n_params"] == 148481 for k in c)
    assert sorted(c["bucketed"]["all_reduce"]["sizes"]) == sorted([1 + 256 + 256 + 65536, 256 + 65536, 256 + 16384])
    assert set(d["step_s"]) == {"naive", "overlap", "bucketed", "ddp"} and all(t > 0 for t in d["step_s"].values())


@pytest.mark.slow
def test_zero1_by_hand_is_bitwise_adamw_and_holds_what_memory_and_deepspeed_say(launched):
    z = launched["zero1"]
    assert all(z["bitwise_vs_adamw"]) and z["ranks_identical"] and z["losses"] == z["reference_losses"]
    assert (z["padded"], z["part"]) == (148484, 74242)  # DeepSpeed's padding: a multiple of 2 x world size
    assert zero.partition_layout([z["n_params"]], 2, 1)[0]["partition"] == z["part"]
    predicted = memory.model_state_bytes(z["n_params"], "fp32", "adamw", stage=1, world_size=2).device["optimizer"]
    ds = z["deepspeed"]
    assert z["state_bytes"] == [predicted] * 2 == [b["optimizer"] for b in ds["bytes"]]
    assert ds["version"] == "0.19.8" and ds["optimizer"] == "DeepSpeedZeroOptimizer"
    assert ds["bitwise_vs_hand"] and ds["losses"] == z["losses"]
    assert z["collectives"]["all_gather"]["sizes"] == [z["part"]]


@pytest.mark.slow
def test_zero1_by_hand_saves_memory_and_clips_by_the_global_norm(launched):
    """Nothing held twice (parameters and gradients in the flat buffers): below replicated AdamW's total at 2 ranks;
    clipping sharded gradients equals clip_grad_norm_ on the whole gradient, and it really clipped."""
    z = launched["zero1"]
    mine, full = z["memory_bytes"], z["adamw_memory_bytes"]
    assert z["params_in_flat"] and mine[0] == mine[1]
    assert full == {"params": 4 * 148481, "grads": 4 * 148481, "states": 8 * 148481, "total": 16 * 148481}
    assert mine[0] == {"params": 4 * 148484, "grads": 4 * 148484, "states": 8 * 74242, "total": 12 * 148484}
    c = z["clip"]
    assert len(c["norms"]) == len(c["reference_norms"]) == z["steps"] and min(c["norms"]) > c["max_norm"]
    assert all(math.isclose(a, b, rel_tol=1e-5) for a, b in zip(c["norms"], c["reference_norms"]))
    assert c["rel_vs_adamw"] < 1e-5 and all(math.isclose(a, c["max_norm"], rel_tol=1e-4) for a in c["norms_after"])


@pytest.mark.slow
def test_ddp_by_hand_broadcasts_first_and_names_an_unused_parameter(launched):
    d = launched["ddp"]
    assert d["differed_before_step0"] == [False, True]  # rank 1's own seed ...
    assert d["start_digests"][0] == d["start_digests"][1]  # ... and step 0 made every model rank 0's
    assert all("unused.weight" in e and "unused.bias" in e and "never all-reduced" in e
               for e in d["unused_param_error"])


@pytest.mark.slow
def test_tensor_parallel_mlp_equals_one_process_with_one_all_reduce_each_way(launched):
    t = launched["tp"]
    want = handpar.tp_comm_bytes(t["tokens"], t["d_model"])
    for r in t["ranks"]:
        assert all(v < 1e-5 for v in r["rel"].values()), r["rel"]
        assert r["forward"]["all_reduce"]["calls"] == r["backward"]["all_reduce"]["calls"] == 1
        assert 4 * r["forward"]["all_reduce"]["elements"] == want["forward"]
        assert r["held"] == {"w1": [256, 128], "w2": [128, 256], "b2": [128]}


@pytest.mark.slow
def test_sequence_parallel_block_equals_one_process_and_holds_half_the_norms_activations(launched):
    t = launched["tp"]
    tokens, d = t["tokens"], t["d_model"]
    for r in t["sp"]:
        assert set(r["rel"]) == {"output", "ln_weight", "ln_bias", "w1", "b1", "w2", "b2", "input"}
        assert all(v < 1e-5 for v in r["rel"].values()), r["rel"]
        assert r["tokens_held"] == tokens // 2
        # f became an all-gather of my tokens (gloo emulates the reduce-scatter with an all-reduce of the whole)
        assert r["forward"]["all_gather"] == {"calls": 1, "elements": tokens // 2 * d, "sizes": [tokens // 2 * d]}
        assert r["forward"]["all_reduce"]["elements"] == tokens * d
        assert r["backward"]["all_gather"]["elements"] == tokens // 2 * d
        assert r["backward"]["all_reduce"]["sizes"] == [tokens * d, d, d, d]  # + LayerNorm weight, bias and b2
        # the LayerNorm's input and its two statistics (fp32) for the other rank's tokens are not kept here
        assert r["saved_tp"] - r["saved_sp"] == (tokens - tokens // 2) * (d + 2) * 4


@pytest.mark.slow
def test_gpipe_equals_one_process_sends_what_the_formula_says_and_matches_torch_pipelining(launched):
    p = launched["pp"]
    want = handpar.pipeline_p2p_bytes(p["batch"], p["width"])
    assert set(p["runs"]) == {"1", "4"}
    for m, r in p["runs"].items():
        assert r["loss_rel"] < 1e-5 and max(r["grad_rel"]) < 1e-5, m
        sends = [r["p2p"][k]["send"] for k in (0, 1)]
        assert [s["calls"] for s in sends] == [int(m)] * 2
        assert [4 * s["elements"] for s in sends] == [want["forward"], want["backward"]]
        assert 0 <= r["bubble"] < 1 and len(r["timeline"][0]) == 2 * int(m)
    assert p["runs"]["1"]["bubble"] >= 0.45  # one micro-batch: the stages cannot overlap
    # stage work of fixed cost (a wait, no core needed): the measured bubble follows (p-1)/(m+p-1)
    fixed = p["fixed_cost"]["bubble"]
    assert list(fixed) == ["1", "4"] and fixed["1"] > fixed["4"]
    assert all(abs(b - handpar.bubble_fraction(2, int(m))) < 0.1 for m, b in fixed.items()), fixed
    pl = p["pipelining"]
    assert pl["works"] and pl["loss_rel"] < 1e-5 and max(pl["grad_rel"]) < 1e-5


@pytest.mark.slow
def test_fsdp2_and_deepspeed_stage3_train_the_same_curve_with_the_predicted_bytes(launched):
    f = launched["fsdp"]
    f2, ds = f["fsdp2"], f["deepspeed"]
    assert f2["works"], f2.get("error")
    for curve in (f2["losses"], ds["losses"]):
        assert all(abs(a - b) / b < 1e-5 for a, b in zip(curve, f["reference_losses"]))
    pred = memory.model_state_bytes(148481, "fp32", "adamw", stage=3, world_size=2).device
    assert all({k: b[k] for k in ("params", "grads", "optimizer")} == pred for b in ds["bytes"])
    shapes = [tuple(p.shape) for p in models.MLP(64, 256, 1, depth=3, seed=0).parameters()]
    dim0 = sum(-(-s[0] // 2) * math.prod(s[1:]) for s in shapes)
    assert all(b["params"] == b["grads"] == 4 * dim0 for b in f2["bytes"])
    assert f2["collectives"]["all_gather"]["calls"] == 8 and 2 * f2["collectives"]["all_gather"]["elements"] == 2 * 2 * dim0


@pytest.mark.slow
def test_fsdp2_accumulates_without_sync_on_whole_gradients_and_mixed_precision_keeps_fp32_shards(launched):
    f = launched["fsdp"]
    acc, mp, f2 = f["fsdp2_accumulation"], f["fsdp2_mixed"], f["fsdp2"]
    assert acc["works"] and mp["works"], (acc.get("error"), mp.get("error"))
    first, last = acc["per_micro"]
    assert "all_reduce" not in first["collectives"] and "reduce_scatter" not in first["collectives"]
    assert first["unsharded_grad_bytes"] == 4 * 148481 and first["sharded_grad_bytes"] == 0
    assert last["unsharded_grad_bytes"] == 0 and last["sharded_grad_bytes"] == f2["bytes"][0]["grads"]
    assert first["collectives"]["all_gather"] == last["collectives"]["all_gather"]  # gathered on every micro-batch
    assert mp["compute_dtypes"] == ["bfloat16"]
    for b, b32 in zip(mp["bytes"], f2["bytes"]):
        assert b["dtypes"] == b["grad_dtypes"] == ["float32"]
        assert {k: b[k] for k in ("params", "grads", "optimizer")} == {k: b32[k] for k in ("params", "grads", "optimizer")}
    assert all(abs(a - b) / b < 2e-2 for a, b in zip(mp["losses"], f["reference_losses"]))  # bf16 compute


@pytest.mark.slow
def test_sharded_checkpoints_dcp_and_zero_to_fp32_give_back_the_whole_model(launched):
    dcp, z2f = launched["fsdp"]["fsdp2"]["dcp"], launched["fsdp"]["deepspeed"]["zero_to_fp32"]
    assert dcp["works"] and dcp["equal"] == [True, True], dcp
    assert sorted(f for f in dcp["files"] if f.endswith(".distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert z2f["works"] and z2f["equal"] and z2f["dtypes"] == ["float32"], z2f
    assert sum("optim_states" in f for f in z2f["files"]) == 2  # one optimizer partition per rank


@pytest.mark.slow
def test_each_strategys_whole_loop_trains_as_the_real_thing(launched):
    assert launched["ddp"]["loop_bitwise_vs_ddp"] == [True, True]
    assert launched["zero1"]["loop_bitwise_vs_adamw"] == [True, True]
    assert max(launched["tp"]["loop_rel"]) < 1e-5 and max(launched["pp"]["loop_rel"]) < 1e-5


# --------------------------------------------------------------------------------------------------
# 3 ranks: bitwise equality needs DDP's own recipe
# --------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_with_three_ranks_only_ddps_scaling_and_bucket_layout_give_its_bits():
    res = launch(ROOT / "tests" / "handpar_ranks.py", 3, timeout=240, stream=False)
    assert res["world_size"] == 3
    # DDP's first step uses its initial buckets; it rebuilds them in gradient-ready order, bucket_layout's order
    assert res["bucketed"]["bitwise_per_step"] == [False, True, True]
    # other positions in the ring buffer (tensor by tensor), or DDP's layout but the sum divided by 3 afterwards
    for kind in ("naive", "divide_after", "overlap", "bucketed_divide_after"):
        assert not any(res[kind]["bitwise_per_step"]), kind
    assert all(res[k]["max_rel"] < 1e-6 for k in res if k != "world_size")


# --------------------------------------------------------------------------------------------------
# float64 parameters: every buffer follows the parameters (the CPU proxy for "allocates on the GPU")
# --------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_every_strategy_follows_float64_parameters_on_two_ranks():
    res = launch(ROOT / "tests" / "handpar_float64_ranks.py", 2, timeout=240, stream=False)
    assert res["world_size"] == 2
    for rank, parts in enumerate(res["ranks"]):
        assert set(parts) == {"ddp_naive", "ddp_overlap", "ddp_bucketed", "zero1", "tp", "pp"}
        for name, got in parts.items():
            assert got["dtypes"] == ["torch.float64"], (rank, name, got)
            assert got["max_diff"] < 1e-12, (rank, name, got)  # float32 anywhere would leave ~1e-7
    assert res["ranks"][1]["pp"]["loss_is_float"]


# Code that runs on ranks: every tensor it creates names its device, so that it lands where the parameters are.
RANK_CODE = ["labkit/handpar.py", "labkit/recipes/handpar.py", "labkit/recipes/handpar_grade.py",
             "labkit/recipes/ddp.py", "labkit/recipes/allreduce.py", "labkit/recipes/zero.py"]
FACTORIES = {"empty", "zeros", "ones", "full", "rand", "randn", "randint", "arange", "tensor"}


def _bare_factories(path: Path) -> list[str]:
    import ast

    tree = ast.parse(path.read_text())
    bad = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in FACTORIES
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"
                and not any(k.arg == "device" for k in node.keywords)):
            bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: torch.{node.func.attr}(...) without device=")
    return bad


def test_rank_code_allocates_with_an_explicit_device():
    bad = [line for f in RANK_CODE for line in _bare_factories(ROOT / f)]
    assert not bad, "\n".join(bad)


def test_the_allocation_lint_catches_a_bare_factory(tmp_path):
    probe = ROOT / "build" / "lint_probe.py"
    probe.parent.mkdir(exist_ok=True)
    try:
        probe.write_text("import torch\nx = torch.empty((2, 3))\ny = torch.zeros(3, device=x.device)\n")
        assert _bare_factories(probe) == ["build/lint_probe.py:2: torch.empty(...) without device="]
    finally:
        probe.unlink()


# --------------------------------------------------------------------------------------------------
# the graders: more typical mistakes, in one launch
# --------------------------------------------------------------------------------------------------

MORE_MISTAKES = {
    "ddp-no-overlap": ("ddp", '''
def overlap_gradients(model):
    def wait():
        for p in model.parameters():
            p.grad.div_(dist.get_world_size())
            dist.all_reduce(p.grad)
    return wait
''', "no all-reduce started while backward was running"),
    "ddp-divided-twice": ("ddp", '''
def overlap_gradients(model):
    world, pending = dist.get_world_size(), []
    def hook(p):
        p.grad.div_(world * world)
        pending.append(dist.all_reduce(p.grad, async_op=True))
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)
    return lambda: [w.wait() for w in pending]
''', "half of DDP's"),
    "ddp-blocking": ("ddp", '''
def overlap_gradients(model):
    world = dist.get_world_size()
    def hook(p):
        p.grad.div_(world)
        dist.all_reduce(p.grad)  # blocks backward until every rank has reduced this gradient
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)
    return lambda: None
''', "without async_op=True"),
    "gpipe-one-at-a-time": ("gpipe", '''
def gpipe_step(stage, inputs, targets, loss_fn, act_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    m = len(inputs if first else targets)
    p = next(stage.parameters())
    total = 0.0
    for i in range(m):  # forward and backward of one micro-batch, then the next: right numbers, no pipelining
        if first:
            x = inputs[i]
        else:
            x = torch.empty(act_shape, dtype=p.dtype, device=p.device)
            dist.recv(x, rank - 1)
            x.requires_grad_(True)
        y = stage(x)
        if last:
            loss = loss_fn(y, targets[i]) / m
            loss.backward()
            total += float(loss)
        else:
            dist.send(y.detach(), rank + 1)
            grad = torch.empty_like(y)
            dist.recv(grad, rank + 1)
            y.backward(grad)
        if not first:
            dist.send(x.grad, rank - 1)
    return total if last else None
''', "backward started before every forward"),
    "ddp-wait-in-hook": ("ddp", '''
def overlap_gradients(model):
    world = dist.get_world_size()
    def hook(p):
        p.grad.div_(world)
        dist.all_reduce(p.grad, async_op=True).wait()  # asynchronous in name only
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)
    return lambda: None
''', "before backward has issued the last one"),
    "ddp-one-hook": ("ddp", '''
def overlap_gradients(model):
    world, params, pending = dist.get_world_size(), list(model.parameters()), []
    def hook(p):
        p.grad.div_(world)
        pending.append(dist.all_reduce(p.grad, async_op=True))
    params[-1].register_post_accumulate_grad_hook(hook)  # only the last layer's bias overlaps
    def wait():
        for p in params[:-1]:
            p.grad.div_(world)
            pending.append(dist.all_reduce(p.grad, async_op=True))
        for w in pending:
            w.wait()
        pending.clear()
    return wait
''', "Only 1 of the 8"),
    "gpipe-no-micro-batches": ("gpipe", '''
def gpipe_step(stage, inputs, targets, loss_fn, act_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    p = next(stage.parameters())
    m = len(inputs if first else targets)
    if first:
        x = torch.cat(inputs)
    else:
        x = torch.empty((act_shape[0] * m, *act_shape[1:]), dtype=p.dtype, device=p.device)
        dist.recv(x, rank - 1)
        x.requires_grad_(True)
    y = stage(x)
    if last:
        loss = loss_fn(y, torch.cat(targets))
        loss.backward()
    else:
        dist.send(y.detach(), rank + 1)
        grad = torch.empty_like(y)
        dist.recv(grad, rank + 1)
        y.backward(grad)
    if not first:
        dist.send(x.grad, rank - 1)
    return float(loss) if last else None
''', "1 forward(s) and 1 backward(s) for 4"),
    "gpipe-sends-late": ("gpipe", '''
def gpipe_step(stage, inputs, targets, loss_fn, act_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    p = next(stage.parameters())
    m = len(inputs if first else targets)
    ins, outs = [], []
    for i in range(m):
        if first:
            x = inputs[i]
        else:
            x = torch.empty(act_shape, dtype=p.dtype, device=p.device)
            dist.recv(x, rank - 1)
            x.requires_grad_(True)
        y = stage(x)
        ins.append(x)
        outs.append(loss_fn(y, targets[i]) / m if last else y)
    if not last:
        for y in outs:  # every forward first, then all the sends: stage 1 waits for the whole batch
            dist.send(y.detach(), rank + 1)
    for i in reversed(range(m)):
        if last:
            outs[i].backward()
        else:
            grad = torch.empty_like(outs[i])
            dist.recv(grad, rank + 1)
            outs[i].backward(grad)
        if not first:
            dist.send(ins[i].grad, rank - 1)
    return float(sum(float(y) for y in outs)) if last else None
''', "sent in this order"),
    "zero1-all-reduce": ("zero1", '''
def zero1_step(flat_param, flat_grad, shard, optimizer):
    world, rank = dist.get_world_size(), dist.get_rank()
    g = flat_grad / world
    dist.all_reduce(g)  # the whole gradient, though this rank updates only its slice
    shard.grad = g[rank * shard.numel():(rank + 1) * shard.numel()].clone()
    optimizer.step()
    dist.all_gather_single(flat_param, shard.detach())
''', "never reduce-scattered"),
    "ddp-wait-for-nothing": ("ddp", '''
def overlap_gradients(model):
    world = dist.get_world_size()
    def hook(p):
        p.grad.div_(world)
        dist.all_reduce(p.grad, async_op=True)  # started, and the work object dropped
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)
    return lambda: None
''', "never waited for"),
    "gpipe-receives-all-first": ("gpipe", '''
def gpipe_step(stage, inputs, targets, loss_fn, act_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    p = next(stage.parameters())
    m = len(inputs if first else targets)
    if first:
        xs = list(inputs)
    else:  # every micro-batch's activations received before the first forward: no overlap left
        xs = [torch.empty(act_shape, dtype=p.dtype, device=p.device) for _ in range(m)]
        for x in xs:
            dist.recv(x, rank - 1)
            x.requires_grad_(True)
    outs = []
    for i, x in enumerate(xs):
        y = stage(x)
        if last:
            y = loss_fn(y, targets[i]) / m
        else:
            dist.send(y.detach(), rank + 1)
        outs.append(y)
    for i in reversed(range(m)):
        if last:
            outs[i].backward()
        else:
            grad = torch.empty_like(outs[i])
            dist.recv(grad, rank + 1)
            outs[i].backward(grad)
        if not first:
            dist.send(xs[i].grad, rank - 1)
    return float(sum(float(y) for y in outs)) if last else None
''', "received in this order"),
    "zero1-reduce-scatter-unused": ("zero1", '''
def zero1_step(flat_param, flat_grad, shard, optimizer):
    world, rank = dist.get_world_size(), dist.get_rank()
    n = shard.numel()
    mine = torch.empty_like(shard)
    dist.reduce_scatter_single(mine, flat_grad)  # done, then not used
    g = flat_grad / world
    dist.all_reduce(g)
    shard.grad = g[rank * n:(rank + 1) * n].clone()
    optimizer.step()
    dist.all_gather_single(flat_param, shard.detach())
''', "as well as reduce-scattering"),
    "zero1-summed": ("zero1", '''
def zero1_step(flat_param, flat_grad, shard, optimizer):
    g = torch.empty_like(shard)
    dist.reduce_scatter_single(g, flat_grad)
    shard.grad = g
    optimizer.step()
    dist.all_gather_single(flat_param, shard.detach())
''', "summed"),
    "tp-g-backward-reduces": ("tp", '''
class CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x
    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad

class ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x
    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad
''', "2× too large"),
    "tp-g-forgets-forward": ("tp", '''
class CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x
    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad

class ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()
    @staticmethod
    def backward(ctx, grad):
        return grad
''', "g must all-reduce"),
}


#: Right answers written another way, graded in the same launch: each must pass.
MORE_RIGHT = {
    "ddp-futures": ("ddp", '''
def overlap_gradients(model):
    world, futures = dist.get_world_size(), []
    def hook(p):
        p.grad.div_(world)
        futures.append(dist.all_reduce(p.grad, async_op=True).get_future())  # waited through its future, as a
    for p in model.parameters():                                             # DDP comm hook's is
        p.register_post_accumulate_grad_hook(hook)
    return lambda: torch.futures.wait_all(futures)
''', None),
}


@pytest.mark.slow
def test_graders_name_more_typical_mistakes(tmp_path):
    files = []
    for name, (exercise, body, _) in {**MORE_MISTAKES, **MORE_RIGHT}.items():
        path = tmp_path / f"{name}.py"
        path.write_text("import torch\nimport torch.distributed as dist\n" + body)
        files += ["--file", f"{exercise}={path}"]
    res = launch("labkit.recipes.handpar_grade", 2, [*files, "--device", "cpu"], timeout=300, stream=False)
    judges = {"ddp": nb11._judge_ddp, "zero1": nb11._judge_zero1, "tp": nb11._judge_tp, "gpipe": nb11._judge_gpipe}
    for (name, (exercise, _, said)), graded in zip({**MORE_MISTAKES, **MORE_RIGHT}.items(), res["grades"]):
        assert graded["exercise"] == exercise
        ok, message = judges[exercise](graded["ranks"])
        if said is None:
            assert ok, (name, message)
        else:
            assert not ok and said in message, (name, message)


# --------------------------------------------------------------------------------------------------
# the graders' seam: what goes to the ranks, and what counts as not attempted
# --------------------------------------------------------------------------------------------------

def test_rank_module_keeps_definitions_and_imports_but_no_calls():
    text = nb11.rank_module(mistakes.overlap_gradients)
    assert text.startswith("from __future__ import annotations\n# Written by labkit's grader")
    assert "import torch.distributed as dist" in text and "def overlap_gradients(model):" in text
    assert "class CopyToTP(torch.autograd.Function):" in text
    compile(text, "rank_module", "exec")
    with pytest.raises(TypeError):
        nb11.rank_module(42)


CELL = """import torch
import torch.distributed as dist

class CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ...

    @staticmethod
    def backward(ctx, grad):
        \"\"\"A docstring does not count.\"\"\"
        ...

class ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ...

    @staticmethod
    def backward(ctx, grad):
        BODY

check("11.tp-conjugates", (CopyToTP, ReduceFromTP))
"""


def _cell(body: str, name: str) -> dict:
    """Define CELL's classes as a notebook cell does: code in __main__, its text only in linecache."""
    src = CELL.replace("BODY", body)
    linecache.cache[name] = (len(src), None, src.splitlines(True), name)
    ns = {"__name__": "__main__", "check": lambda *a: None}
    exec(compile(src, name, "exec"), ns)
    return ns


def test_a_stub_cell_is_not_attempted_and_launches_nothing(monkeypatch):
    monkeypatch.setattr(nb11, "_launch", lambda *a: pytest.fail("a stub must not be launched"))
    ns = _cell("...", "<cell-stub>")
    pair = (ns["CopyToTP"], ns["ReduceFromTP"])
    assert all(nb11._is_stub(c) for c in pair)
    assert evaluate("11.tp-conjugates", pair).status == "not attempted"

    def stub(model):
        """Not written yet."""
        ...

    assert evaluate("11.ddp-overlap", stub).status == "not attempted"


def test_a_filled_cell_goes_to_the_ranks_without_its_check_call(monkeypatch):
    sent = []
    monkeypatch.setattr(nb11, "_launch", lambda jobs: (sent.extend(jobs), (None, "stopped here"))[1])
    ns = _cell("return grad", "<cell-filled>")
    pair = (ns["CopyToTP"], ns["ReduceFromTP"])
    assert not nb11._is_stub(pair[1])
    verdict = evaluate("11.tp-conjugates", pair)
    assert verdict.status == "wrong" and "stopped here" in verdict.message
    (grade, text), = sent
    assert grade == "tp" and "class ReduceFromTP" in text and "check(" not in text and "return grad" in text


def test_recipes_refuse_to_start_outside_a_two_rank_torchrun_and_reject_bad_flags(tmp_path):
    for main, argv in ((recipe.main, []), (grader.main, ["--file", f"tp={tmp_path / 'x.py'}"])):
        with pytest.raises(ValueError, match="torchrun with 2 ranks"):
            main(argv)
    plain = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    for module in ("labkit.recipes.handpar", "labkit.recipes.handpar_grade"):
        helped = subprocess.run([sys.executable, "-m", module, "--help"], env=plain, capture_output=True, text=True,
                                timeout=120)
        assert helped.returncode == 0 and "usage:" in helped.stdout, helped.stderr
        out = subprocess.run([sys.executable, "-m", module, "--file", f"tp={tmp_path / 'x.py'}"] if "grade" in module
                             else [sys.executable, "-m", module], env=plain, capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and "torchrun with 2 ranks" in out.stderr and "Traceback" not in out.stderr
        assert out.stderr.strip().count("\n") == 0, out.stderr  # one line
    with pytest.raises(ValueError, match="existing .py file"):
        grader.grade("tp", str(tmp_path / "missing.py"))
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2"}
    for cmd in (["labkit.recipes.handpar", "--parts", "ddp,bogus"],
                ["labkit.recipes.handpar_grade", "--file", f"sgd={tmp_path / 'x.py'}"]):
        out = subprocess.run([sys.executable, "-m", *cmd], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and "error" in out.stderr and "Traceback" not in out.stderr, cmd


@pytest.mark.parametrize("prediction, named", [
    ({"naive": 8, "bucketed": 1, "ddp": 1}, "bucketed: you said 1 ≠ measured 3"),  # one bucket for everything
    ({"naive": 8, "bucketed": 8, "ddp": 1}, "bucketed: you said 8 ≠ measured 3"),  # buckets as if per tensor
    ({"naive": 16, "bucketed": 3, "ddp": 1}, "naive: you said 16 ≠ measured 8"),    # counting both ranks' calls
])
def test_allreduce_count_prediction_names_each_wrong_count(prediction, named, monkeypatch):
    monkeypatch.setenv("LABKIT_PROGRESS", "off")
    measured = {"naive": 8, "overlap": 8, "bucketed": 3, "ddp": 1}
    verdict = evaluate("11.allreduce-count", (prediction, measured))
    assert verdict.status == "wrong" and named in verdict.message


def test_fsdp_unsharded_grad_bytes_reads_both_torch_layouts():
    """FSDP2's state holds a list of param groups (torch >= 2.12: ``_fsdp_param_groups``) or one group
    (``_fsdp_param_group``, torch 2.11 on the GPU check's image, where notebook 11 printed None and failed). Both
    count the same held gradients; a layout with neither gives None."""
    from types import SimpleNamespace

    from torch.distributed.fsdp import FSDPModule

    from labkit.recipes import handpar as recipe

    held = [torch.zeros(10), torch.zeros(6)]
    fps = [SimpleNamespace(unsharded_accumulated_grad=held[0], _unsharded_param=None),
           SimpleNamespace(unsharded_accumulated_grad=None, _unsharded_param=SimpleNamespace(grad=held[1]))]
    group = SimpleNamespace(fsdp_params=fps)

    class Fake(FSDPModule, torch.nn.Module):
        def _get_fsdp_state(self):
            return self.fake_state

    def Fake(state, _cls=Fake):
        m = torch.nn.Module()  # FSDPModule.__new__ builds the original class: give the instance ours after
        m.__class__ = _cls
        m.fake_state = state
        return m

    for state in (SimpleNamespace(_fsdp_param_groups=[group]), SimpleNamespace(_fsdp_param_group=group)):
        assert recipe._fsdp_unsharded_grad_bytes(Fake(state)) == 64
    assert recipe._fsdp_unsharded_grad_bytes(Fake(SimpleNamespace(_fsdp_param_group=None))) == 0
    assert recipe._fsdp_unsharded_grad_bytes(Fake(SimpleNamespace())) is None
