"""Tests for labkit.zero (DeepSpeed configs, partition layout, byte counting) and labkit.recipes.zero.

The recipe tests launch real DeepSpeed ZeRO runs on 2 gloo ranks (one launch, shared by the tests).
"""

from __future__ import annotations

import glob
import math
import os

import pytest
import torch

from labkit import device as dev_gate
from labkit import dist, memory, zero

deepspeed = pytest.importorskip("deepspeed")

STAGES = (0, 1, 2, 3)
SHM_GLOB = "/dev/shm/deepspeed_allreduce_buffer_*"


# --------------------------------------------------------------------------------------------------
# config / validate / explain
# --------------------------------------------------------------------------------------------------


def test_batch_triple_is_derived_and_checked():
    assert zero.batch_triple(4, 8, world_size=8) == (256, 4, 8)
    assert zero.batch_triple(4, world_size=8, train_batch_size=256) == (256, 4, 8)
    assert zero.batch_triple(4, 8, world_size=8, train_batch_size=256) == (256, 4, 8)
    with pytest.raises(ValueError, match=r"4 \* 8 \* 8 = 256"):
        zero.batch_triple(4, 8, world_size=8, train_batch_size=128)
    with pytest.raises(ValueError, match="not a multiple of micro_batch"):
        zero.batch_triple(3, world_size=2, train_batch_size=16)
    with pytest.raises(TypeError):
        zero.batch_triple(2.0, 1)  # type: ignore[arg-type]


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_config_knobs(stage, dtype):
    cfg = zero.config(stage, dtype, micro_batch=2, grad_accum=3, world_size=2,
                      initial_scale_power=12, loss_scale_window=50, hysteresis=1, min_loss_scale=0.5)
    assert cfg["train_batch_size"] == 12
    assert cfg["train_micro_batch_size_per_gpu"] == 2 and cfg["gradient_accumulation_steps"] == 3
    assert cfg["zero_optimization"]["stage"] == stage
    assert ("bf16" in cfg) == (dtype == "bf16") and ("fp16" in cfg) == (dtype == "fp16")
    if dtype == "fp16":
        assert cfg["fp16"] == {"enabled": True, "loss_scale": 0, "initial_scale_power": 12,
                               "loss_scale_window": 50, "hysteresis": 1, "min_loss_scale": 0.5}
    assert cfg["optimizer"]["params"]["torch_adam"] is True


def test_config_offload_and_reference_13b():
    cfg = zero.config(2, "bf16", offload="cpu", micro_batch=4, grad_accum=2, world_size=8,
                      overlap_comm=True, torch_adam=False)  # the seed's 13B config: train_batch_size 64
    zo = cfg["zero_optimization"]
    assert zo["offload_optimizer"]["device"] == "cpu" and zo["overlap_comm"] is True
    assert cfg["train_batch_size"] == 64 and "torch_adam" not in cfg["optimizer"]["params"]
    with pytest.raises(ValueError, match="stage >= 1"):
        zero.config(0, "bf16", offload="cpu")


@pytest.mark.parametrize("bad, exc, msg", [
    ({"stage": 4}, ValueError, "stage must be one of"),
    ({"stage": True}, TypeError, "stage must be an int"),
    ({"stage": 1, "dtype": "fp8"}, ValueError, "dtype must be one of"),
    ({"stage": 1, "offload": "gpu"}, ValueError, "offload must be one of"),
    ({"stage": 1, "micro_batch": 0}, ValueError, "micro_batch must be >= 1"),
    ({"stage": 1, "micro_batch": 4, "grad_accum": 2, "world_size": 2, "train_batch_size": 32}, ValueError,
     "inconsistent batch config"),
    ({"stage": 1, "dtype": "fp16", "hysteresis": 0}, ValueError, "hysteresis must be >= 1"),
    ({"stage": 1, "dtype": "fp16", "initial_scale_power": 80}, ValueError, "initial_scale_power"),
    ({"stage": 1, "gradient_clipping": -1.0}, ValueError, "gradient_clipping"),
    ({"stage": 1, "lr": 0.0}, ValueError, "lr must be > 0"),
])
def test_config_rejects_bad_input(bad, exc, msg):
    with pytest.raises(exc, match=msg):
        zero.config(**bad)


def test_validate_catches_what_deepspeed_would_reject_first():
    from deepspeed.runtime.config import DeepSpeedConfig

    good = zero.config(2, "bf16", micro_batch=4, grad_accum=2, world_size=1)
    ds = DeepSpeedConfig(good)  # DeepSpeed itself accepts what config() builds
    assert ds.train_batch_size == 8 and ds.zero_optimization_stage == 2 and ds.bfloat16_config.enabled
    bad = dict(good, train_batch_size=12)
    with pytest.raises(ValueError, match="inconsistent batch config"):
        zero.validate(bad, world_size=1)
    with pytest.raises(AssertionError):  # DeepSpeed's own (terser) complaint about the same dict
        DeepSpeedConfig(bad)
    both = dict(good, fp16={"enabled": True})
    with pytest.raises(ValueError, match="both true"):
        zero.validate(both)
    with pytest.raises(ValueError, match="offload_optimizer needs stage >= 1"):
        zero.validate({"zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}})
    with pytest.raises(TypeError):
        zero.validate([("stage", 1)])  # type: ignore[arg-type]


def test_explain_covers_every_key():
    cfg = zero.config(3, "fp16", offload="cpu", world_size=2, reduce_bucket_size=1024,
                      param_persistence_threshold=0)
    cfg["some_new_key"] = 1
    text = zero.explain(cfg)
    lines = text.splitlines()
    n_keys = sum(1 for _ in zero._flatten(cfg))
    assert len(lines) == n_keys
    assert "hysteresis = 2: halve the scale only at this many overflows" in text
    assert "stage = 3: 0 = replicate all" in text
    assert "some_new_key = 1: (a key labkit.zero does not explain" in text
    assert sum("does not explain" in ln for ln in lines) == 1


# --------------------------------------------------------------------------------------------------
# partition_layout
# --------------------------------------------------------------------------------------------------


def test_partition_layout_by_hand():
    numels = [6, 2, 4]  # 12 elements; world 2: a stage-1/2 slice is 6 elements
    s0, s1, s2, s3 = (zero.partition_layout(numels, 2, s) for s in STAGES)
    assert s0 == [{"partition": 12, "padding": 0, "params": 12, "grads": 12}] * 2
    assert [r["partition"] for r in s1] == [6, 6] and [r["grads"] for r in s1] == [12, 12]
    assert [r["grads"] for r in s2] == [6, 6]  # the boundary falls between params: no overlap
    assert [r["grads"] for r in zero.partition_layout([5, 3, 4], 2, 2)] == [8, 7]  # [0,6) cuts param 2
    assert s3 == [{"partition": 6, "padding": 0, "params": 6, "grads": 6}] * 2
    odd = zero.partition_layout([3, 5], 2, 3)  # each param padded to a multiple of 2
    assert [r["partition"] for r in odd] == [5, 5] and [r["padding"] for r in odd] == [0, 2]
    pad = zero.partition_layout([7], 2, 1)  # flat buffer padded to a multiple of 2*2
    assert [r["partition"] for r in pad] == [4, 4] and [r["padding"] for r in pad] == [0, 1]
    with pytest.raises(ValueError):
        zero.partition_layout([], 2, 1)
    with pytest.raises(ValueError):
        zero.partition_layout([4], 2, 5)


def test_cut_tensors_name_the_tensor_each_boundary_cuts_and_explain_the_stage2_extra():
    assert zero.cut_tensors([6, 2, 4], 2) == []  # the boundary at 6 falls between tensors
    (cut,) = zero.cut_tensors([5, 3, 4], 2)  # slices [0, 6) and [6, 12): the boundary cuts tensor 1 after 1 element
    assert cut == {"rank": 1, "boundary": 6, "tensor": 1, "numel": 3, "below": 1}
    lay = zero.partition_layout([5, 3, 4], 2, 2)
    assert [r["grads"] - r["partition"] for r in lay] == [cut["numel"] - cut["below"], cut["below"]]
    four = zero.cut_tensors([10, 10, 4], 4)  # 24 elements, slices of 6: boundaries at 6, 12, 18
    assert [(c["rank"], c["tensor"], c["below"]) for c in four] == [(1, 0, 6), (2, 1, 2), (3, 1, 8)]
    for bad, exc in (([], ValueError), ([3, 0], ValueError), ("12", TypeError)):
        with pytest.raises(exc):
            zero.cut_tensors(bad, 2)
    with pytest.raises(ValueError):
        zero.cut_tensors([4], 0)


# --------------------------------------------------------------------------------------------------
# The recipe, for real: stages 0-3 in bf16 (+ fp16 where it computes and DeepSpeed accepts it) on 2 gloo ranks
# --------------------------------------------------------------------------------------------------

FP16 = dev_gate.computes(torch.float16, "cpu") and dev_gate.deepspeed_accepts(torch.float16)


@pytest.fixture(scope="module")
def launched():
    before = set(glob.glob(SHM_GLOB))
    runs = "0:bf16,1:bf16,2:bf16,3:bf16,1:bf16:cpu,2:bf16:cpu" + (",2:fp16" if FP16 else "")
    res = dist.launch("labkit.recipes.zero", 2,
                      ["--runs", runs, "--steps", "5", "--initial-scale-power", "24",
                       "--loss-scale-window", "2", "--hysteresis", "1"],
                      timeout=240, stream=False)
    after = set(glob.glob(SHM_GLOB))
    assert res["shm_files_left"] == []
    return res, before, after


def _run(res, stage, dtype="bf16", offload="none"):
    return next(r for r in res["runs"] if r["stage"] == stage and r["dtype"] == dtype and r["offload"] == offload)


@pytest.mark.slow
@pytest.mark.parametrize("stage", STAGES)
def test_each_stage_trains_with_identical_ranks(launched, stage):
    res, _, _ = launched
    run = _run(res, stage)
    assert res["world_size"] == 2 and res["backend"] == "gloo"
    assert len(run["checksums"]) == 2 and run["checksums"][0] == run["checksums"][1]
    assert run["param_sums"][0] == run["param_sums"][1]
    assert all(math.isfinite(x) for x in run["losses"]) and len(run["losses"]) == 5
    assert run["losses"][-1] < run["losses"][0]
    expected_opt = {0: "FP16_UnfusedOptimizer", 1: "DeepSpeedZeroOptimizer", 2: "DeepSpeedZeroOptimizer",
                    3: "DeepSpeedZeroOptimizer_Stage3"}[stage]
    assert run["optimizer"] == expected_opt


@pytest.mark.slow
def test_losses_equal_across_stages_to_bf16_rounding(launched):
    res, _, _ = launched
    ref = _run(res, 0)["losses"]
    for stage in (1, 2, 3):
        got = _run(res, stage)["losses"]
        assert got[0] == ref[0]  # same data, same init: the first loss is identical
        for a, b in zip(got, ref):
            assert abs(a - b) <= 2e-3 * abs(b), (stage, got, ref)
    # stages 0 and 1 hold different state but do the same arithmetic on the same gradients, up to the order in
    # which fp32 partial sums meet: bitwise on an AMX Xeon, 2.6e-6 apart at step 2 where bf16 is emulated (AVX2),
    # both far inside bf16's rounding (3.9e-3)
    one = _run(res, 1)["losses"]
    assert one[0] == ref[0] and abs(one[1] - ref[1]) <= 1e-5 * abs(ref[1]), (one, ref)


@pytest.mark.slow
def test_stage0_adam_prestep_is_reported_and_reset(launched):
    res, _, _ = launched
    assert _run(res, 0)["adam_prestep"] == 1 and _run(res, 0)["adam_prestep_reset"] is True
    assert all(_run(res, s)["adam_prestep"] == 0 for s in (1, 2, 3))


@pytest.mark.slow
@pytest.mark.parametrize("stage", STAGES)
def test_measured_bytes_equal_labkit_memory_prediction(launched, stage):
    res, _, _ = launched
    run = _run(res, stage)
    n = run["n_params"]
    pred = memory.model_state_bytes(n, "bf16-master", "adamw", stage=stage, world_size=2).device
    layout = zero.partition_layout(run["param_numels"], 2, stage)
    for rank, measured in enumerate(run["bytes_per_rank"]):
        b = measured["bytes"]
        assert b["params"] == pred["params"]
        assert b["master"] == pred["master"]
        assert b["optimizer"] == pred["optimizer"]
        # stage 2 accumulates whole gradient tensors for every param touching the rank's slice
        extra = 2 * (layout[rank]["grads"] - (-(-n // 2) if stage >= 2 else n))
        assert b["grads"] == pred["grads"] + extra
        assert (extra > 0) == (stage == 2)
        assert measured["model_states"] == sum(pred[k] for k in ("params", "grads", "master", "optimizer")) \
            + extra
        assert b["other"] < 200  # step counters, norms, flags


@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 2])
def test_offloaded_bytes_equal_labkit_memory_prediction(launched, stage):
    """ZeRO-Offload as DeepSpeed 0.19.8 lays it out: fp32 master 4 + Adam 8 + an fp32 gradient partition 4 B per
    shard element on the host (labkit.memory's ``host``), the 16-bit params (and at stage 1 the 16-bit grads)
    on the device. On a CPU-only machine both sides are CPU memory, so the sums are compared by category."""
    res, _, _ = launched
    run = _run(res, stage, offload="cpu")
    n = run["n_params"]
    pred = memory.model_state_bytes(n, "bf16-master", "adamw", stage=stage, world_size=2, offload_optimizer=True)
    shard = zero.partition_layout(run["param_numels"], 2, stage)[0]["partition"]
    assert pred.host == {"fp32_grads": 4 * shard, "master": 4 * shard, "optimizer": 8 * shard}
    for measured in run["bytes_per_rank"]:
        b = measured["bytes"]
        assert b["master"] == pred.host["master"] and b["optimizer"] == pred.host["optimizer"]
        assert b["params"] == pred.device["params"]
        assert b["grads"] == pred.host["fp32_grads"] + pred.device.get("grads", 0)
    assert len(set(run["checksums"])) == 1


@pytest.mark.slow
def test_gradient_accumulation_communicates_per_step_at_stages_0_1_and_per_micro_batch_at_2_3(launched):
    res, _, _ = launched
    for stage in STAGES:
        run = _run(res, stage)
        n, per_micro = run["n_params"], run["collectives_per_micro"]
        assert len(per_micro) == 2  # the recipe's default: 2 micro-batches per step
        first, last = per_micro
        reduced = [sum(c["elements"] for op, c in mb.items() if op in ("all_reduce", "reduce_scatter"))
                   for mb in per_micro]
        assert reduced[1] >= n // 2, (stage, last)  # every stage sums gradients at the step's last micro-batch
        if stage < 2:
            assert first == {}, (stage, first)  # the whole gradient is held: accumulated locally
        else:
            assert reduced[0] >= n // 2, (stage, first)  # only a slice is held: reduced on every micro-batch
        gathered = [mb.get("all_gather", {}).get("elements", 0) * 2 for mb in per_micro]
        assert gathered[0] == (gathered[1] if stage == 3 else 0)  # stage 3 gathers weights on every micro-batch
        if stage in (1, 2):
            assert gathered[1] >= n  # the updated weights, once per step


@pytest.mark.slow
def test_no_shm_files_left_behind(launched):
    _, before, after = launched
    assert after <= before


@pytest.mark.slow
def test_fp16_is_run_where_supported_and_refused_where_not(launched):
    from labkit import scaling

    res, _, _ = launched
    knobs = ("initial_scale_power", "loss_scale_window", "hysteresis")
    assert all(_run(res, 2, "bf16")[k] is None for k in knobs)  # no loss scaling in bf16
    if not FP16:  # the device gate says fp16 does not compute here: the recipe must refuse, clearly
        with pytest.raises(dist.LaunchError, match="fp16 is not supported on this device"):
            dist.launch("labkit.recipes.zero", 2, ["--runs", "2:fp16", "--steps", "1"], timeout=120,
                        stream=False)
        return
    run = _run(res, 2, "fp16")
    assert run["overflow"][0] is True  # 2**24 overflows fp16 gradients of this model
    assert {k: run[k] for k in knobs} == {"initial_scale_power": 24, "loss_scale_window": 2, "hysteresis": 1}
    replay = scaling.deepspeed_scale_sequence(run["overflow"], **{k: run[k] for k in knobs})
    assert run["loss_scales"] == replay[1:]
    assert run["skipped_steps"] == sum(run["overflow"])
    assert run["checksums"][0] == run["checksums"][1]


@pytest.mark.slow
def test_fp16_refused_by_name_on_a_capped_cpu():
    """On the laptop CPU class DeepSpeed refuses fp16; the recipe says so, naming both answers, and trains nothing."""
    cap = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "DS_ACCELERATOR": "cpu"}
    with pytest.raises(dist.LaunchError, match="fp16 is not supported on this device") as err:
        dist.launch("labkit.recipes.zero", 2, ["--runs", "2:fp16", "--steps", "1"], timeout=180, stream=False,
                    env=cap)
    assert "deepspeed_accepts says False" in str(err.value)


def test_recipe_rejects_bad_runs():
    from labkit.recipes import zero as rz

    assert rz.parse_runs("0:bf16, 2:fp16:cpu") == [(0, "bf16", "none"), (2, "fp16", "cpu")]
    for bad in ("", "4:bf16", "1:fp8", "1", "x:bf16", "1:bf16:gpu"):
        with pytest.raises(ValueError):
            rz.parse_runs(bad)


def test_shm_buffers_names_only_this_jobs_files(tmp_path, monkeypatch):
    from labkit.recipes import zero as rz

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")  # a port no real job uses
    mine = f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_1_0"
    other = f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_11_0"
    try:
        for p in (mine, other):
            open(p, "w").close()
        assert rz.shm_buffers(0) == [mine] and rz.shm_buffers() == [mine]
    finally:
        for p in (mine, other):
            if os.path.exists(p):
                os.unlink(p)


def test_a_rank_removes_only_its_own_buffer(monkeypatch):
    """What each rank runs right after init_distributed (and again on exit): unlink its own buffer, no other."""
    from labkit.recipes import zero as rz

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")  # a port no real job uses
    base = f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_"
    mine, peer, other = base + "1_0", base + "1_1", base + "11_0"
    try:
        for p in (mine, peer, other):
            open(p, "w").close()
        rz._remove_own_buffers(0)
        rz._remove_own_buffers(0)  # a second call (the exit path) is a no-op
        assert not os.path.exists(mine) and os.path.exists(peer) and os.path.exists(other)
    finally:
        for p in (mine, peer, other):
            if os.path.exists(p):
                os.unlink(p)


@pytest.mark.slow
def test_a_stop_request_ends_the_run_after_the_current_step(tmp_path, watch_processes):
    """The walltime-warning path of deepspeed.sbatch: with $LABKIT_STOP_FILE present, every rank stops after
    the first step (they agree through one all-reduce), the remaining runs are skipped, and the launch exits 0."""
    stop = tmp_path / "stop"
    stop.touch()
    with watch_processes() as w:
        res = dist.launch("labkit.recipes.zero", 2, ["--runs", "1:bf16,2:bf16", "--steps", "5", "--torch-adam"],
                          timeout=240, stream=False, env={"LABKIT_STOP_FILE": str(stop), "DS_ACCELERATOR": "cpu"})
    assert [r["stopped_at"] for r in res["runs"]] == [1] and len(res["runs"][0]["losses"]) == 1
    assert res["runs"][0]["checksums"][0] == res["runs"][0]["checksums"][1]
    assert not w.leftovers()
