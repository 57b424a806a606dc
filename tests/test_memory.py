"""Tests for labkit.memory: the ZeRO paper's numbers, DeepSpeed's estimators, exact tensor counts.

The model-state predictions are checked three ways: against the ZeRO paper's worked example, against
DeepSpeed 0.19.8's own estimators (``estimate_zero{2,3}_model_states_mem_needs`` and the printing
``*_all_cold`` forms), and against the exact bytes of the tensors torch allocates. The activation
estimates are checked against what autograd really saves (saved-tensor hooks).
"""

from __future__ import annotations

import itertools
import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit import memory as M
from labkit import models, zero
from labkit import widgets as W

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ----------------------------------------------------------------------------------------------------
# The ZeRO paper and the 16/18/20 conventions
# ----------------------------------------------------------------------------------------------------


def test_zero_paper_example_7_5b_on_64_gpus():
    """ZeRO paper (Rajbhandari et al. 2020), Fig. 1: Ψ = 7.5B, N_d = 64, K = 12, (2 + 2 + K)Ψ."""
    table = M.zero_table(7_500_000_000, 64, "bf16-master", "adam")
    got = {s: round(e.device_total / M.GB, 1) for s, e in table.items()}
    assert got == {0: 120.0, 1: 31.4, 2: 16.6, 3: 1.9}
    # and exactly: 7.5e9 / 64 = 117 187 500 elements per shard
    assert table[0].device_total == 16 * 7_500_000_000
    assert table[1].device_total == 4 * 7_500_000_000 + 12 * 117_187_500
    assert table[2].device_total == 2 * 7_500_000_000 + 14 * 117_187_500
    assert table[3].device_total == 16 * 117_187_500


def test_conventions_16_18_20():
    assert M.bytes_per_param("bf16-master", "adam") == 16  # ZeRO paper: 2 + 2 + K, K = 12
    assert M.k_factor("bf16-master", "adam") == 12
    assert M.bytes_per_param("bf16-master-fp32-grads", "adamw") == 18  # HF: 6 (weights) + 4 (grads) + 8
    assert M.bytes_per_param("bf16-master-fp32-accum", "adam") == 20  # DeepSpeed: 2 + 2 + 4 + 4 + 8
    assert M.bytes_per_param("fp32", "adam") == 16  # fp32 costs the same: mixed precision does not halve it
    assert M.bytes_per_param("bf16", "adam") == 16  # alias of "bf16-master"
    assert M.bytes_per_param("hf", "adam") == 18 and M.bytes_per_param("deepspeed", "adam") == 20
    assert M.bytes_per_param("bf16-master", "sgd") == 8 and M.bytes_per_param("bf16-master", "sgd-momentum") == 12
    assert M.bytes_per_param("bf16-master", "adam-8bit") == 10
    assert M.bytes_per_param("bf16-pure", "adamw") == 8
    text = M.conventions_table("adam")
    for name, total in (("bf16-master", 16), ("bf16-master-fp32-grads", 18), ("bf16-master-fp32-accum", 20)):
        (line,) = [ln for ln in text.splitlines() if ln.split()[0] == name]
        assert int(line.split()[6]) == total
    assert "ZeRO paper" in text and "HF" in text and "DeepSpeed" in text


def test_amp_keeps_fp32_state_and_adds_weight_copies():
    """Autocast keeps fp32 params, grads and Adam states, and adds 16-bit copies of the weights."""
    amp = M.model_state_bytes(10**6, "bf16", "adamw")
    fp32 = M.model_state_bytes(10**6, "fp32", "adamw")
    assert amp.device_total == fp32.device_total + 2 * 10**6
    assert amp.device["weight_copies"] == 2 * 10**6
    # Adam states + master dominate mixed precision: 12 of the 16 bytes
    mixed = M.model_state_bytes(10**6, "bf16-master", "adam")
    assert (mixed.device["master"] + mixed.device["optimizer"]) / mixed.device_total == 0.75


POLICY_NAMES = sorted(M.POLICIES)
OPT_NAMES = sorted(M.OPTIMIZERS)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 10**12), ws=st.integers(1, 1024), policy=st.sampled_from(POLICY_NAMES),
       opt=st.sampled_from(OPT_NAMES))
def test_stages_shard_what_they_should(n, ws, policy, opt):
    t = M.zero_table(n, ws, policy, opt)
    shard = -(-n // ws)
    pol = M.get_policy(policy)
    # stage 0 holds exactly bytes_per_param (+ autocast copies)
    assert t[0].device_total == (M.bytes_per_param(policy, opt) + pol.autocast_copy_bytes) * n
    # more sharding never costs more memory per rank (no gathered layer here), up to DeepSpeed's padding of
    # stages 1-2 to a multiple of 2 x world_size: at most 2 elements per rank more than ceil(n / ws)
    slack = 2 * M.bytes_per_param(policy, opt)
    for lower, higher in ((0, 1), (1, 2), (2, 3)):
        assert t[lower].device_total + slack >= t[higher].device_total, (lower, higher)
    # stage 3 (without autocast copies) holds a 1/ws shard of everything
    assert t[3].device_total - t[3].device.get("weight_copies", 0) == M.bytes_per_param(policy, opt) * shard
    if ws == 1 and n % 2 == 0:  # one rank, nothing to pad (stages 1-2 pad to 2 x world_size)
        assert len({e.device_total - e.device.get("weight_copies", 0) for e in t.values()}) == 1


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 10**12), ws=st.integers(1, 512), stage=st.sampled_from([1, 2, 3]),
       policy=st.sampled_from(["fp32", "bf16-master", "bf16-master-fp32-grads", "bf16-pure"]),
       opt=st.sampled_from(OPT_NAMES))
def test_offload_moves_the_optimizer_side_and_keeps_an_fp32_gradient_partition(n, ws, stage, policy, opt):
    """Offload moves master and optimizer states to the host unchanged; the host also keeps DeepSpeed's fp32
    gradient partition (one shard, 4 B/element), and at stage >= 2 no gradient stays on the GPU."""
    base = M.model_state_bytes(n, policy, opt, stage=stage, world_size=ws)
    off = M.model_state_bytes(n, policy, opt, stage=stage, world_size=ws, offload_optimizer=True)
    shard = zero.partition_layout([n], ws, stage)[0]["partition"]
    assert "optimizer" not in off.device and "master" not in off.device and "fp32_grads" not in off.device
    for k in ("master", "optimizer"):
        assert off.host.get(k, 0) == base.device.get(k, 0)
    assert off.host["fp32_grads"] == 4 * shard
    assert off.device.get("grads", 0) == (base.device.get("grads", 0) if stage == 1 else 0)
    assert off.device["params"] == base.device["params"]
    assert off.device_total <= base.device_total
    if stage == 3:
        both = M.model_state_bytes(n, policy, opt, stage=3, world_size=ws, offload_optimizer=True,
                                   offload_params=True)
        assert both.device_total == 0 and both.host_total == off.host_total + base.device["params"]


def test_offload_with_two_gradient_copies_keeps_the_fp32_one():
    """With fp16 and fp32 grads (DeepSpeed's 20 B/param), the offloaded shard is kept once, in fp32."""
    n, ws = 10**9, 8
    base = M.model_state_bytes(n, "bf16-master-fp32-accum", "adam", stage=2, world_size=ws)
    off = M.model_state_bytes(n, "bf16-master-fp32-accum", "adam", stage=2, world_size=ws, offload_optimizer=True)
    assert off.device == {"params": 2 * n}
    assert off.host_total == 16 * n // ws
    assert base.device_total - off.device_total - off.host_total == 2 * n // ws  # the 16-bit grad shard


def test_stage3_gathered_largest_layer():
    e = M.model_state_bytes(10**9, "bf16-master", "adam", stage=3, world_size=8, largest_layer_params=5 * 10**7)
    assert e.device["gathered"] == 4 * 5 * 10**7  # 16-bit params + their full 16-bit gradient
    e32 = M.model_state_bytes(10**9, "fp32", "adam", stage=3, world_size=8, largest_layer_params=5 * 10**7)
    assert e32.device["gathered"] == 8 * 5 * 10**7


def test_smallest_fitting_stage():
    assert M.smallest_fitting_stage(7 * 10**9, 32 * M.GB, 8) == 2  # 38.5 GB, then 26.25 GB
    assert M.smallest_fitting_stage(7 * 10**9, 40 * M.GB, 8) == 1
    assert M.smallest_fitting_stage(10**8, 80 * M.GB, 1) == 0
    assert M.smallest_fitting_stage(70 * 10**9, 80 * M.GB, 8) is None  # 140 GB even at stage 3
    assert M.smallest_fitting_stage(70 * 10**9, 80 * M.GB, 16) == 3
    assert M.smallest_fitting_stage(7 * 10**9, 40 * M.GB, 8, reserve_bytes=2 * M.GB) == 2


@pytest.mark.parametrize("kwargs, exc", [
    ({"n_params": -1}, ValueError),
    ({"n_params": 0}, ValueError),
    ({"n_params": 1.5}, ValueError),
    ({"n_params": "7B"}, TypeError),
    ({"n_params": 10, "stage": 4}, ValueError),
    ({"n_params": 10, "stage": -1}, ValueError),
    ({"n_params": 10, "stage": "2"}, ValueError),
    ({"n_params": 10, "stage": True}, ValueError),
    ({"n_params": 10, "world_size": 0}, ValueError),
    ({"n_params": 10, "policy": "fp8"}, ValueError),
    ({"n_params": 10, "optimizer": "lion"}, ValueError),
    ({"n_params": 10, "stage": 0, "offload_optimizer": True}, ValueError),
    ({"n_params": 10, "stage": 2, "offload_optimizer": True, "offload_params": True}, ValueError),
    ({"n_params": 10, "stage": 3, "offload_params": True}, ValueError),
    ({"n_params": 10, "largest_layer_params": 11}, ValueError),
])
def test_bad_inputs(kwargs, exc):
    with pytest.raises(exc):
        M.model_state_bytes(**kwargs)


def test_bad_inputs_elsewhere():
    with pytest.raises(ValueError, match="unknown unit"):
        M.fmt_bytes(1, "GB2")
    with pytest.raises(ValueError):
        M.smallest_fitting_stage(10, -1, 1)
    with pytest.raises(ValueError, match="offload"):
        W.memory_calculator_report(10**9, offload="disk")
    with pytest.raises(ValueError, match="preset"):
        W.memory_calculator("3B")
    with pytest.raises(ValueError, match="8-bit"):
        M.predict_torch_state(models.MLP(), "fp32", "adam-8bit")
    with pytest.raises(TypeError):
        M.gpt_activation_bytes(models.MLP().config, 2)
    with pytest.raises(ValueError, match="seq_len"):
        M.gpt_activation_bytes(models.GPTConfig(seq_len=8), 2, seq_len=9)
    with pytest.raises(ValueError, match="autocast"):
        M.gpt_activation_bytes(models.GPTConfig(), 2, autocast="fp8")
    with pytest.raises(ValueError, match="fp16 or bf16"):
        M.MasterWeightOptimizer(models.MLP().parameters())
    with pytest.raises(TypeError), M.checkpointed(torch.nn.Linear(2, 2)):
        pass


def test_sizes_past_the_limits_are_refused_at_once_saying_the_range():
    """zero_table(10**6, 2**31) listed 2**31 ranks per stage (hours, then memory); the calculator's report took
    2**40 GPUs a node, and 10**400 parameters ended in an OverflowError while formatting GB."""
    cases = [
        (lambda: M.zero_table(10**6, 2**31), "world_size must be between 1 and 1,048,576"),
        (lambda: M.model_state_bytes(10**400), "n_params must be between 1 and 1,000,000,000,000,000"),
        (lambda: M.smallest_fitting_stage(10**9, 80e9, 10**400), "world_size must be between 1 and 1,048,576"),
        (lambda: W.memory_calculator_report(10**9, gpus_per_node=2**40), "gpus_per_node must be between 1 and 1,024"),
        (lambda: W.memory_calculator_report(10**9, nodes=2**20), "at most 1,048,576 ranks, got 8 * 1048576"),
        (lambda: W.memory_calculator_report(10**400), "n_params must be between 1 and"),
        (lambda: W.memory_calculator_report(10**9, gpu_gb=10**400), "gpu_gb must be a number in (0, 10,000]"),
        (lambda: W.memory_calculator_report(10**9, gpu_gb=math.inf), "gpu_gb must be a number in (0, 10,000]"),
        (lambda: zero.partition_layout([10], 2**40, 1), "world_size must be between 1 and 1,048,576"),
    ]
    for call, match in cases:
        with pytest.raises(ValueError, match=re.escape(match)):
            call()
    # at the limits, an answer
    assert M.zero_table(10**15, 2**20)[3].device_total > 0
    assert "per GPU:" in W.memory_calculator_report(10**12, gpus_per_node=1024, nodes=1024, gpu_gb=10_000)


def test_fmt_bytes():
    assert M.fmt_bytes(31_406_250_000) == "31.41 GB"
    assert M.fmt_bytes(2**30, "GiB") == "1.00 GiB"
    assert M.fmt_bytes(1234, "B") == "1,234 B"


# ----------------------------------------------------------------------------------------------------
# DeepSpeed's estimators
# ----------------------------------------------------------------------------------------------------



@pytest.fixture(scope="module")
def ds2():
    """DeepSpeed's ZeRO-1/2 module; importing it initialises no process group (the estimators are pure)."""
    mod = pytest.importorskip("deepspeed.runtime.zero.stage_1_and_2",
                              reason="deepspeed (the 'deepspeed' extra) is not installed")
    import torch.distributed as dist

    assert not (dist.is_available() and dist.is_initialized())
    return mod


@pytest.fixture(scope="module")
def ds3():
    """DeepSpeed's ZeRO-3 module."""
    return pytest.importorskip("deepspeed.runtime.zero.stage3", reason="deepspeed is not installed")

SIZES = [10**8, 123_456_789, 1_300_000_000, 7 * 10**9, 13 * 10**9, 70 * 10**9]
LAYOUTS = [(1, 1), (2, 1), (4, 1), (8, 1), (16, 1), (8, 2), (8, 4), (4, 16)]  # (gpus per node, nodes)
# Our shards are ceil(Ψ/N) elements (DeepSpeed pads its flat buffers); its estimators use int(bΨ/N).
# So ours is at most (bytes per element - 1) bytes larger.
PAD = 20


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("gpn, nodes", LAYOUTS)
def test_deepspeed_zero2_gpu_matches_the_20_byte_convention(n, gpn, nodes, ds2):
    """DeepSpeed's ZeRO-2 estimator counts 2Ψ (replicated fp16 params) + 18Ψ/N, where
    18 = 2 (fp16 grads) + 4 (fp32 grads) + 4 (fp32 params) + 8 (Adam): our "bf16-master-fp32-accum" policy.
    The ZeRO paper's 16 B/param ("bf16-master") is smaller by exactly the fp32 gradient shard, 4Ψ/N."""
    N = gpn * nodes
    _, ds_gpu = ds2.estimate_zero2_model_states_mem_needs(n, gpn, nodes, cpu_offload=False)
    ours = M.model_state_bytes(n, "bf16-master-fp32-accum", "adam", stage=2, world_size=N).device_total
    assert 0 <= ours - ds_gpu < PAD + 18 * 2  # + DeepSpeed's runtime padding to 2 x N (its estimator uses N)
    paper = M.model_state_bytes(n, "bf16-master", "adam", stage=2, world_size=N).device_total
    assert abs((ours - paper) - 4 * n / N) <= 4 * 2  # the fp32 gradient shard, padded to 2 x N


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("gpn, nodes", LAYOUTS)
def test_deepspeed_zero2_offload(n, gpn, nodes, ds2):
    """With optimizer offload only the fp16 params stay on the GPU: 2Ψ, exactly as DeepSpeed says.
    DeepSpeed's CPU figure is 1.5 x max(4·N·Ψ, 16Ψ): a 1.5 safety factor on the larger of N fp32 copies
    of the model made while loading it (one per process) and the whole job's offloaded state
    (4 fp32 grads + 4 master + 8 Adam). It does not divide that state by the number of nodes; we report
    the steady state per node (16Ψ/nodes) and leave load-time copies out."""
    N = gpn * nodes
    ds_cpu, ds_gpu = ds2.estimate_zero2_model_states_mem_needs(n, gpn, nodes, cpu_offload=True)
    for policy in ("bf16-master-fp32-accum", "bf16-master-fp32-grads"):  # the fp32 grad copy is the one offloaded
        e = M.model_state_bytes(n, policy, "adam", stage=2, world_size=N, offload_optimizer=True)
        assert e.device_total == ds_gpu == 2 * n
        job_host = e.host_total * N
        assert 0 <= job_host - 16 * n < (PAD + 16 * 2) * N
        assert abs(ds_cpu - 1.5 * max(4 * N * n, job_host)) <= 1.5 * (PAD + 16 * 2) * N
        assert e.host_per_node(gpn) * nodes == job_host
    # without offload DeepSpeed's CPU figure is only the load-time fp32 model per process on a node
    ds_cpu0, _ = ds2.estimate_zero2_model_states_mem_needs(n, gpn, nodes, cpu_offload=False)
    assert ds_cpu0 == int(1.5 * 4 * n * gpn)
    assert M.model_state_bytes(n, "bf16-master-fp32-accum", "adam", stage=2, world_size=N).host_total == 0


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("gpn, nodes", LAYOUTS)
def test_deepspeed_zero3(n, gpn, nodes, ds3):
    """DeepSpeed's ZeRO-3 estimator counts 18Ψ/N per GPU (fp16 params 2 + fp32 grads 4 + fp32 params 4 +
    Adam 8: no separate fp16 gradient shard, our "bf16-master-fp32-grads" policy) plus 4 x the largest layer
    (its gathered fp16 params and full fp16 gradient). Note the inconsistency: its ZeRO-2 estimator
    counts 20 B/param, its ZeRO-3 estimator 18. With offload its CPU figure is 1.5 x the per-node state
    (zero_init=True); the offloaded gradient is the fp32 one."""
    N = gpn * nodes
    largest = min(n, 50_000_000)
    kw = {"stage": 3, "world_size": N, "largest_layer_params": largest}
    # no offload
    _, ds_gpu, ds_largest = ds3.estimate_zero3_model_states_mem_needs(n, largest, gpn, nodes, cpu_offload=False,
                                                                      cpu_offload_params=False)
    e = M.model_state_bytes(n, "bf16-master-fp32-grads", "adam", **kw)
    assert e.device["gathered"] == ds_largest == 4 * largest
    assert 0 <= e.device_total - ds_gpu < PAD
    # offload the optimizer (states, master, fp32 grads) to the CPU; the fp16 param shard stays
    ds_cpu, ds_gpu, _ = ds3.estimate_zero3_model_states_mem_needs(n, largest, gpn, nodes, cpu_offload=True,
                                                                  cpu_offload_params=False, zero_init=True)
    e = M.model_state_bytes(n, "bf16-master-fp32-grads", "adam", offload_optimizer=True, **kw)
    assert 0 <= e.device_total - ds_gpu < PAD
    assert abs(ds_cpu - 1.5 * e.host_per_node(gpn)) <= 1.5 * PAD * gpn + 1
    # offload params too: only the gathered layer stays on the GPU
    ds_cpu, ds_gpu, _ = ds3.estimate_zero3_model_states_mem_needs(n, largest, gpn, nodes, cpu_offload=True,
                                                                  cpu_offload_params=True, zero_init=True)
    e = M.model_state_bytes(n, "bf16-master-fp32-grads", "adam", offload_optimizer=True, offload_params=True, **kw)
    assert e.device_total == ds_gpu == 4 * largest
    assert abs(ds_cpu - 1.5 * e.host_per_node(gpn)) <= 1.5 * PAD * gpn + 1
    # zero_init=False: each process first builds the full fp32 model on the CPU (4Ψ per GPU on the node)
    ds_cpu_noinit, _, _ = ds3.estimate_zero3_model_states_mem_needs(n, largest, gpn, nodes, cpu_offload=True,
                                                                    cpu_offload_params=True, zero_init=False)
    assert abs(ds_cpu_noinit - 1.5 * max(4 * gpn * n, e.host_per_node(gpn))) <= 1.5 * PAD * gpn + 1


def _parse_cold(text: str) -> list[tuple[float, float, str]]:
    rows = re.findall(r"^\s*([\d.]+)GB \|\s*([\d.]+)GB \| (.*)$", text, flags=re.MULTILINE)
    # Under Python >= 3.11 DeepSpeed 0.19.8 prints the enum as "OffloadDeviceEnum.cpu" (f"{enum:4}"
    # formats a str-mixin enum by name there); only the label is affected, not the numbers.
    return [(float(c), float(g), re.sub(r"OffloadDeviceEnum\.|\s", "", opts))
            for c, g, opts in rows]


@pytest.mark.parametrize("n, gpn, nodes", [(7 * 10**9, 8, 1), (13 * 10**9, 8, 2), (1_300_000_000, 4, 1)])
def test_deepspeed_all_cold_tables(n, gpn, nodes, capsys, ds2, ds3):
    """The printing ``*_all_cold`` forms show the same figures in GiB; read them back and compare."""
    N = gpn * nodes
    ds2.estimate_zero2_model_states_mem_needs_all_cold(n, gpn, nodes)
    rows = _parse_cold(capsys.readouterr().out)
    assert [r[2] for r in rows] == ["offload_optimizer=cpu", "offload_optimizer=none"]
    off = M.model_state_bytes(n, "bf16-master-fp32-accum", "adam", stage=2, world_size=N, offload_optimizer=True)
    on = M.model_state_bytes(n, "bf16-master-fp32-accum", "adam", stage=2, world_size=N)
    assert rows[0][1] == pytest.approx(off.device_total / M.GiB, abs=0.006)
    assert rows[1][1] == pytest.approx(on.device_total / M.GiB, abs=0.006)
    assert rows[0][0] == pytest.approx(1.5 * max(4 * N * n, off.host_total * N) / M.GiB, abs=0.006)

    largest = 10**8
    ds3.estimate_zero3_model_states_mem_needs_all_cold(n, largest, gpn, nodes)
    rows = _parse_cold(capsys.readouterr().out)
    assert len(rows) == 6
    kw = {"stage": 3, "world_size": N, "largest_layer_params": largest}
    expect = {
        "offload_param=cpu,offload_optimizer=cpu,zero_init=1":
            M.model_state_bytes(n, "bf16-master-fp32-grads", "adam", offload_optimizer=True, offload_params=True, **kw),
        "offload_param=none,offload_optimizer=cpu,zero_init=1":
            M.model_state_bytes(n, "bf16-master-fp32-grads", "adam", offload_optimizer=True, **kw),
        "offload_param=none,offload_optimizer=none,zero_init=1":
            M.model_state_bytes(n, "bf16-master-fp32-grads", "adam", **kw),
    }
    by_opts = {r[2]: r for r in rows}
    for opts, e in expect.items():
        cpu, gpu, _ = by_opts[opts]
        assert gpu == pytest.approx(e.device_total / M.GiB, abs=0.006)
        if e.host_total:
            assert cpu == pytest.approx(1.5 * e.host_per_node(gpn) / M.GiB, abs=0.006)


# ----------------------------------------------------------------------------------------------------
# Exact tensor bytes: prediction vs measurement
# ----------------------------------------------------------------------------------------------------

SMALL = models.GPTConfig(d_model=32, n_layers=2, n_heads=2)


def _one_step(policy: str, opt: str, *, autocast: bool = False):
    torch.manual_seed(0)
    model = models.TinyGPT(SMALL, seed=0)
    if policy.startswith("bf16-master") or policy == "bf16-pure":
        model = model.to(torch.bfloat16)
    if policy.startswith("bf16-master"):
        o = M.MasterWeightOptimizer(model.parameters(), opt, policy, lr=1e-3)
    else:
        o = {"adamw": lambda p: torch.optim.AdamW(p, lr=1e-3), "adam": lambda p: torch.optim.Adam(p, lr=1e-3),
             "sgd": lambda p: torch.optim.SGD(p, lr=0.1),
             "sgd-momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
             "adafactor": torch.optim.Adafactor}[opt](model.parameters())
    idx = torch.randint(0, SMALL.vocab_size, (4, SMALL.seq_len))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = models.lm_loss(model(idx).float(), idx)
    loss.backward()
    o.step()
    return model, o


@pytest.mark.parametrize("policy, opt", [
    ("fp32", "adamw"), ("fp32", "sgd"), ("fp32", "sgd-momentum"), ("fp32", "adafactor"), ("bf16", "adamw"),
    ("bf16-pure", "adam"), ("bf16-master", "adamw"), ("bf16-master-fp32-grads", "adamw"), ("bf16-master-fp32-accum", "adamw"),
    ("bf16-master", "sgd-momentum"), ("bf16-master", "adafactor"),
])
def test_predicted_state_equals_measured_tensor_bytes(policy, opt):
    model, o = _one_step(policy, opt, autocast=policy == "bf16")
    measured = M.measure_model_state(model, o)
    assert measured == M.predict_torch_state(model, policy, opt)
    # and the per-parameter model agrees up to torch's 4-byte step counters and Adafactor's factoring
    n = models.count_parameters(model)
    if opt not in ("adafactor",):
        steps = 4 * len(list(model.parameters())) if M.get_optimizer(opt).step_tensor else 0
        assert sum(measured.values()) == M.bytes_per_param(policy, opt) * n + steps


def test_16_18_20_measured_on_real_tensors():
    """The three conventions are three real memory layouts of the same training step."""
    totals = {}
    for policy in ("bf16-master", "bf16-master-fp32-grads", "bf16-master-fp32-accum"):
        model, o = _one_step(policy, "adamw")
        n = models.count_parameters(model)
        steps = 4 * len(list(model.parameters()))
        totals[policy] = (sum(M.measure_model_state(model, o).values()) - steps) / n
    assert totals == {"bf16-master": 16.0, "bf16-master-fp32-grads": 18.0, "bf16-master-fp32-accum": 20.0}


def test_master_weight_optimizer_matches_fp32_adamw():
    """All three policies update the masters exactly like AdamW on fp32 copies fed the converted grads."""
    masters = {}
    for policy in ("bf16-master", "bf16-master-fp32-grads", "bf16-master-fp32-accum"):
        torch.manual_seed(0)
        model = models.MLP(8, 16, 2, depth=2, seed=0).to(torch.bfloat16)
        ref = [p.detach().float().clone().requires_grad_(True) for p in model.parameters()]
        ref_opt = torch.optim.AdamW(ref, lr=1e-2)
        o = M.MasterWeightOptimizer(model.parameters(), "adamw", policy, lr=1e-2)
        for step in range(3):
            x = torch.randn(5, 8, generator=torch.Generator().manual_seed(step)).bfloat16()
            model(x).float().pow(2).mean().backward()
            for r, p in zip(ref, model.parameters()):
                r.grad = p.grad.float()
            o.step()
            ref_opt.step()
            o.zero_grad()
            for r, m, p in zip(ref, o.masters, model.parameters()):
                assert torch.equal(r, m)
                assert torch.equal(p, m.bfloat16())
        masters[policy] = [m.clone() for m in o.masters]
    a, b, c = masters.values()
    assert all(torch.equal(x, y) and torch.equal(y, z) for x, y, z in zip(a, b, c))


def test_tensor_bytes_counts_shared_storage_once():
    x = torch.zeros(10, 10)
    assert M.tensor_bytes([x, x.t(), x[2:5], x.view(-1)]) == 400
    assert M.tensor_bytes([x, torch.zeros(3, dtype=torch.float16)]) == 406


# ----------------------------------------------------------------------------------------------------
# Activations: estimates vs saved-tensor hooks
# ----------------------------------------------------------------------------------------------------


def _ctx(autocast):
    if autocast is None:
        return torch.autocast("cpu", enabled=False)
    return torch.autocast("cpu", dtype={"bf16": torch.bfloat16, "fp16": torch.float16}[autocast])


def _saved(model, run, checkpoint):
    if checkpoint:
        with M.checkpointed(model):
            out, saved = M.measure_saved_tensors(run, model.parameters())
    else:
        out, saved = M.measure_saved_tensors(run, model.parameters())
    return out, saved


@pytest.mark.parametrize("softmax", models.SOFTMAX_IMPLS)
@pytest.mark.parametrize("autocast", [None, "bf16", "fp16"])
@pytest.mark.parametrize("checkpoint", [False, True])
def test_gpt_activation_estimate_matches_saved_tensors(softmax, autocast, checkpoint):
    cfg = models.GPTConfig(d_model=32, n_heads=4, n_layers=3, softmax=softmax)
    model = models.TinyGPT(cfg, seed=0)
    for batch, t in ((4, 12), (3, 7)):
        idx = torch.randint(0, cfg.vocab_size, (batch, t), generator=torch.Generator().manual_seed(batch))

        def run(idx=idx):
            with _ctx(autocast):
                return model(idx)

        out, saved = _saved(model, run, checkpoint)
        est = M.gpt_activation_bytes(cfg, batch, t, autocast=autocast, checkpointing=checkpoint)
        assert (saved.activations, saved.weight_copies) == (est.activations, est.weight_copies)
        if autocast and not checkpoint:  # every Linear weight is saved as a 16-bit copy; LayerNorm keeps its fp32 weight and bias
            ln = sum(p.numel() * 4 for m in model.modules() if isinstance(m, torch.nn.LayerNorm)
                     for p in m.parameters())
            assert saved.params == ln
        del out


def test_gpt_checkpointing_per_block_recompute_is_one_block():
    """The peak with checkpointing adds one recomputed block: what a plain forward of that block saves."""
    cfg = models.GPTConfig(n_layers=4)
    model = models.TinyGPT(cfg, seed=0)
    x = torch.randn(8, cfg.seq_len, cfg.d_model, requires_grad=True)
    _, saved = M.measure_saved_tensors(lambda: model.blocks[0](x), model.parameters())
    est = M.gpt_activation_bytes(cfg, 8, checkpointing=True)
    assert saved.activations == est.per_layer
    assert est.peak == est.saved + est.per_layer
    full = M.gpt_activation_bytes(cfg, 8)
    assert est.saved < full.saved / 3
    assert full.per_token_per_layer == full.per_layer / (8 * cfg.seq_len)


@pytest.mark.parametrize("activation", ["relu", "gelu", "tanh"])
@pytest.mark.parametrize("autocast", [None, "bf16"])
@pytest.mark.parametrize("checkpoint", [False, True])
@pytest.mark.parametrize("depth", [0, 1, 3])
def test_mlp_activation_estimate_matches_saved_tensors(activation, autocast, checkpoint, depth):
    model = models.MLP(16, 32, 3, depth=depth, activation=activation, seed=0)
    x = torch.randn(5, 16)

    def run():
        with _ctx(autocast):
            return model(x)

    _, saved = _saved(model, run, checkpoint)
    est = M.mlp_activation_bytes(model, 5, autocast=autocast, checkpointing=checkpoint)
    assert (saved.activations, saved.weight_copies) == (est.activations, est.weight_copies)


def test_mlp_checkpointing_saves_nothing_for_relu_and_halves_gelu():
    for act, ratio in (("relu", 1.0), ("gelu", 0.5)):
        cfg = models.MLP(64, 256, 1, depth=6, activation=act).config
        plain = M.mlp_activation_bytes(cfg, 32)
        ck = M.mlp_activation_bytes(cfg, 32, checkpointing=True)
        hidden_plain = plain.activations - 4 * 32 * 64
        hidden_ck = ck.activations - 4 * 32 * 64
        assert hidden_ck == ratio * hidden_plain


def test_checkpointed_restores_the_model_and_keeps_gradients():
    for model, inp in ((models.TinyGPT(seed=0), torch.randint(0, 12, (2, 12))),
                       (models.MLP(16, 32, 2, depth=3, activation="gelu", seed=0), torch.randn(4, 16))):
        before = [n for n, _ in model.named_parameters()]
        model(inp).float().sum().backward()
        ref = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        with M.checkpointed(model) as m:
            out = m(inp)
            out.float().sum().backward()
        assert [n for n, _ in model.named_parameters()] == before
        for r, p in zip(ref, model.parameters()):
            torch.testing.assert_close(p.grad, r, rtol=0, atol=0)


def test_saved_tensors_dedups_and_classifies():
    w = torch.nn.Parameter(torch.randn(4, 4))
    x = torch.randn(3, 4, requires_grad=True)

    def run():
        h = x @ w  # saves x and w
        return (h * h).sum()  # saves h (twice: counted once)

    _, s = M.measure_saved_tensors(run, [w])
    assert s.params == 64 and s.activations == 48 + 48 and s.weight_copies == 0

    def run_amp():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return (x @ w).float().sum()

    _, s = M.measure_saved_tensors(run_amp, [w])
    assert s.weight_copies == 32 and s.params == 0 and s.by_dtype == {"bfloat16": 24}


# ----------------------------------------------------------------------------------------------------
# The calculator
# ----------------------------------------------------------------------------------------------------


def test_calculator_report_seed_example():
    """The seeds' setup: 13B on 8 x A100-80GB, ZeRO-2, bf16 with fp32 master, optimizer offload."""
    line = W.memory_calculator_report(13 * 10**9, 8, 1, stage=2, offload="optimizer", policy="bf16-master", gpu_gb=80)
    assert line.startswith("per GPU: 26.00 GB of model states on a 80 GB GPU: fits, 54.00 GB left")
    assert line.endswith("CPU per node: 208.00 GB")  # 16 B/param: fp32 grad partition + fp32 master + Adam
    no_off = W.memory_calculator_report(13 * 10**9, 8, 1, stage=0, offload="none", gpu_gb=80)
    assert "does NOT fit" in no_off and "208.00 GB" in no_off


def test_calculator_speaks_the_notebooks_language():
    from labkit import i18n
    try:
        i18n.set_language("zh")
        line = W.memory_calculator_report(13 * 10**9, 8, 1, stage=2, offload="optimizer", gpu_gb=80)
        over = W.memory_calculator_report(13 * 10**9, 8, 1, stage=0, offload="none", gpu_gb=80)
    finally:
        i18n.set_language(None)
    assert re.search("[\u4e00-\u9fff]", line) and "per GPU" not in line and "does NOT fit" not in over
    assert all(n in line for n in ("26.00 GB", "54.00 GB", "208.00 GB")) and "放不下" in over


def test_calculator_widget_updates_with_stage():
    pytest.importorskip("ipywidgets")
    w = W.memory_calculator("7B", gpus_per_node=8, nodes=1, stage=0, offload="none", gpu_gb=80)
    assert repr(w) == "MemoryCalculator()"
    assert "lk-memcalc" in w._dom_classes and "lk-mem-result" in w.result._dom_classes
    assert "lk-mem-stage" in w.controls["stage"]._dom_classes
    seen = []
    for s in (0, 1, 2, 3):
        w.controls["stage"].value = s
        seen.append(w.result.value)
        assert seen[-1] == W.memory_calculator_report(7 * 10**9, 8, 1, s, "none", "bf16-master", "adam", 80.0)
    assert len(set(seen)) == 4
    assert "does NOT fit" in seen[0] and "fits" in seen[3]
    w.controls["preset"].value = "70B"
    assert w.controls["billions"].value == 70
    w.controls["billions"].value = 2.5
    assert w.controls["preset"].value == "custom"
    assert w.result.value == W.memory_calculator_report(2_500_000_000, 8, 1, 3, "none", "bf16-master", "adam", 80.0)
    w.controls["stage"].value = 0
    w.controls["offload"].value = "optimizer"
    assert w.result.value.startswith("invalid setup")


def test_module_contract():
    assert all(hasattr(M, name) for name in M.__all__)
    for name in M.__all__:
        obj = getattr(M, name)
        if callable(obj) and getattr(obj, "__module__", "") == M.__name__ and obj.__doc__:
            assert "Introduced in notebook 06." in obj.__doc__, name
    assert math.isclose(M.GB, 1e9) and M.GiB == 1024**3
    assert list(itertools.islice(M.MODEL_PRESETS, 4)) == ["1B", "7B", "13B", "70B"]


@pytest.mark.parametrize("policy, opt", [("fp32", "sgd-momentum"), ("bf16-pure", "adamw"), ("bf16-master", "adam"),
                                         ("bf16-master-fp32-grads", "adafactor")])
def test_setup_training_matches_prediction(policy, opt):
    model, o = M.setup_training(models.MLP(8, 16, 2, depth=2, seed=0), policy, opt, lr=1e-2)
    want = torch.float32 if policy == "fp32" else torch.bfloat16
    assert all(p.dtype == want for p in model.parameters())
    model(torch.randn(4, 8).to(want)).float().sum().backward()
    o.step()
    assert M.measure_model_state(model, o) == M.predict_torch_state(model, policy, opt)
    with pytest.raises(ValueError):
        M.setup_training(models.MLP(), "fp32", "adam-8bit")
    with pytest.raises(ValueError):
        M.setup_training(models.MLP(), "fp32", "adam", lr=0)


def test_process_rss_sees_a_large_allocation():
    before = M.process_rss()
    if before is None:
        pytest.skip("no /proc/self/statm on this platform")
    x = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
    grew = M.process_rss() - before
    assert 0.5 * x.nbytes < grew < 2 * x.nbytes


def test_memory_bars_plot():
    import matplotlib

    matplotlib.use("Agg")
    from labkit import plots

    ax = plots.memory_bars({"fp32": {"params": 4, "grads": 4, "optimizer": 8},
                            "bf16-master": {"params": 2, "grads": 2, "master": 4, "optimizer": 8}})
    assert [t.get_text() for t in ax.texts] == ["16", "16"]
    assert len(ax.patches) == 2 * 4  # 4 categories x 2 setups (a missing category is a 0-height bar)
    assert sorted(p.get_height() for p in ax.patches) == [0, 2, 2, 4, 4, 4, 8, 8]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["params", "grads", "master", "optimizer"]
    with pytest.raises(ValueError, match="unknown memory categories"):
        plots.memory_bars({"x": {"weights": 1}})


def test_graph_saved_bytes_matches_the_saved_tensor_hooks_and_drops_after_backward():
    cfg = models.GPTConfig(vocab_size=12, seq_len=12)
    model = models.TinyGPT(cfg, seed=0)
    x = torch.randint(0, 12, (8, 12))
    loss, saved = M.measure_saved_tensors(lambda: models.lm_loss(model(x), x), model.parameters())
    assert M.graph_saved_bytes(loss, exclude=model.parameters()) == saved.activations + saved.weight_copies
    assert M.graph_saved_bytes(loss) == saved.activations + saved.weight_copies + saved.params
    loss.backward()
    assert M.graph_saved_bytes(loss) == 0  # backward freed them; the graph nodes remain while `loss` lives
    assert M.graph_saved_bytes(loss.detach()) == 0
    with torch.no_grad():
        assert M.graph_saved_bytes(models.lm_loss(model(x), x)) == 0
    with pytest.raises(TypeError):
        M.graph_saved_bytes(3.0)  # type: ignore[arg-type]
