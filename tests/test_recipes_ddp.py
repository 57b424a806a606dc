"""labkit.recipes.ddp and .allreduce under torchrun (gloo, 2 CPU ranks) and under a simulated srun.

Each torchrun launch costs ~6-10 s on 2 cores, so the launches are shared through module fixtures.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time

import pytest
import torch

from labkit import device as dev_gate
from labkit import dist, train
from labkit.dist import LaunchError, launch
from labkit.recipes import ddp

pytestmark = pytest.mark.slow

COMMON = ["--model", "mlp", "--hidden", "64", "--depth", "2", "--steps", "6", "--data-size", "512",
          "--seed", "3"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """2 ranks, batch 16, fp32, checkpoint every 2 steps: the uninterrupted run."""
    ckpt = tmp_path_factory.mktemp("ref")
    res = launch("labkit.recipes.ddp", 2, [*COMMON, "--batch", "16", "--ckpt-dir", str(ckpt),
                                           "--ckpt-every", "2"], timeout=120, stream=False)
    return res, ckpt


def test_two_gloo_ranks_have_bit_identical_gradients_and_parameters(reference):
    res, _ = reference
    assert res["world_size"] == 2 and res["backend"] == "gloo" and res["launcher"] == "torchrun"
    assert res["global_batch"] == 32 and len(res["losses"]) == 6
    assert len(set(res["grad_checksums"])) == 1 and len(set(res["param_checksums"])) == 1
    assert res["grad_sums"][0] == res["grad_sums"][1] and res["param_sums"][0] == res["param_sums"][1]
    assert all(math.isfinite(x) for x in res["losses"]) and res["losses"][-1] < res["losses"][0]
    assert res["allreduce_calls"] == [6, 6]  # one bucket, one all-reduce per step
    assert res["checkpoint_steps"] == [2, 4, 6]


def test_one_rank_with_batch_2b_equals_two_ranks_with_batch_b(reference):
    res2, _ = reference
    res1 = launch("labkit.recipes.ddp", 1, [*COMMON, "--batch", "32"], timeout=120, stream=False)
    assert res1["world_size"] == 1 and res1["global_batch"] == res2["global_batch"]
    for a, b in zip(res1["losses"], res2["losses"]):
        assert math.isclose(a, b, rel_tol=1e-5), (res1["losses"], res2["losses"])
    assert math.isclose(res1["param_sums"][0], res2["param_sums"][0], rel_tol=1e-5)
    assert res1["allreduce_calls"] == [6]


def test_crash_raises_fast_with_the_ranks_traceback_then_resume_is_bitwise_equal(reference, tmp_path, watch_processes):
    ref, ref_ckpt = reference
    args = [*COMMON, "--batch", "16", "--ckpt-dir", str(tmp_path), "--ckpt-every", "2"]
    t0 = time.monotonic()
    with watch_processes() as w, pytest.raises(LaunchError) as info:
        launch("labkit.recipes.ddp", 2, [*args, "--crash-rank", "1", "--crash-step", "3"], timeout=120,
               stream=False)
    assert time.monotonic() - t0 < 30
    assert info.value.rank == 1
    assert "RuntimeError: injected crash: rank 1 at step 3" in info.value.rank_traceback
    assert "Traceback (most recent call last)" in info.value.rank_traceback
    assert len(w.seen) >= 3 and w.leftovers() == []
    assert train.load_checkpoint(tmp_path / train.CHECKPOINT_NAME)["step"] == 2

    res = launch("labkit.recipes.ddp", 2, [*args, "--resume"], timeout=120, stream=False)
    assert res["resumed_from"] == 2 and res["start_step"] == 2
    assert res["param_checksums"] == ref["param_checksums"]
    assert res["losses"] == ref["losses"]
    a = train.load_checkpoint(ref_ckpt / train.CHECKPOINT_NAME)["model"]
    b = train.load_checkpoint(tmp_path / train.CHECKPOINT_NAME)["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_fp16_with_accumulation_keeps_scalers_in_step_and_all_reduces_once_per_step():
    if not dev_gate.computes(torch.float16, "cpu"):
        pytest.skip("this CPU cannot compute fp16 autocast")
    res = launch("labkit.recipes.ddp", 2, [*COMMON, "--batch", "8", "--accum", "3", "--precision", "fp16",
                                           "--scaler-first-rank", "0"], timeout=120, stream=False)
    assert res["precision"] == "fp16" and res["global_batch"] == 8 * 2 * 3
    # rank 0 made its GradScaler before the optimizer and the wrap, rank 1 after: the same scales and weights below
    assert res["scaler_created"] == ["before the wrap", "after the wrap"]
    assert res["micro_batches"] == 18
    assert res["allreduce_calls"] == [6, 6]  # no_sync: 6 all-reduces for 18 micro-batches
    s0, s1 = res["scaler_scales"]
    assert s0 == s1 and s0 > 0
    assert res["skipped_steps"][0] == res["skipped_steps"][1]
    assert len(set(res["param_checksums"])) == 1 and len(set(res["grad_checksums"])) == 1


def test_recipe_runs_under_srun_style_environment(tmp_path):
    """Two plain processes with SLURM_* variables, as srun starts them: no torchrun involved."""
    port = dist.find_free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env.update({"SLURM_NTASKS": "2", "SLURM_NNODES": "1", "SLURM_JOB_ID": "4242", "MASTER_PORT": str(port),
                "OMP_NUM_THREADS": "1"})
    procs = []
    try:
        for r in range(2):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "labkit.recipes.ddp", "--steps", "2", "--hidden", "32", "--depth", "1",
                 "--batch", "8", "--data-size", "64"],
                env={**env, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)},
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], outs
    res = dist.parse_result(outs[0])
    assert res is not None and dist.parse_result(outs[1]) is None  # only rank 0 reports
    assert res["launcher"] == "slurm" and res["world_size"] == 2
    assert len(set(res["param_checksums"])) == 1


def test_allreduce_benchmark_reports_busbw_as_nccl_tests_does():
    res = launch("labkit.recipes.allreduce", 2, ["--sizes", "1K,64K", "--iters", "3", "--repeats", "1",
                                                 "--warmup", "1"], timeout=120, stream=False)
    assert res["backend"] == "gloo" and res["world_size"] == 2 and res["busbw_factor"] == 1.0
    assert [r["bytes"] for r in res["rows"]] == [1024, 65536]
    for row in res["rows"]:
        assert row["correct"] is True
        assert math.isclose(row["algbw_GBps"], row["bytes"] / (row["time_us"] * 1e-6) / 1e9, rel_tol=1e-9)
        assert math.isclose(row["busbw_GBps"], row["algbw_GBps"] * 2 * (2 - 1) / 2, rel_tol=1e-12)


def test_cli_help_and_bad_flags_fail_cleanly():
    out = subprocess.run([sys.executable, "-m", "labkit.recipes.ddp", "--help"], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0
    for flag in ("--crash-rank", "--crash-step", "--accum", "--precision", "--ckpt-dir", "--resume"):
        assert flag in out.stdout
    parser = ddp.build_parser()
    for bad in (["--precision", "fp8"], ["--crash-rank", "1"], ["--resume"], ["--lr", "inf"]):
        with pytest.raises(SystemExit) as exc:  # rejected while parsing (tests/test_cli.py has the full list)
            parser.parse_args(bad)
        assert exc.value.code == 2
    args = parser.parse_args([])
    args.crash_rank = 1
    with pytest.raises(ValueError, match="go together"):
        ddp._validate(args, world=2)
    args.crash_rank, args.crash_step = 5, 1
    with pytest.raises(ValueError, match="crash-rank"):
        ddp._validate(args, world=2)
    args.crash_rank, args.crash_step, args.resume = None, None, True
    with pytest.raises(ValueError, match="ckpt-dir"):
        ddp._validate(args, world=2)
    args.resume, args.scaler_first_rank = False, 1
    with pytest.raises(ValueError, match="needs --precision fp16"):
        ddp._validate(args, world=2)
    args.precision, args.scaler_first_rank = "fp16", 2
    with pytest.raises(ValueError, match=r"--scaler-first-rank must be in \[0, 2\)"):
        ddp._validate(args, world=2)
    # a bad value stops the command before anything starts: exit status 2, one line, no traceback
    out = subprocess.run([sys.executable, "-m", "labkit.recipes.ddp", "--lr", "inf"], capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == 2 and out.stdout == "" and "Traceback" not in out.stderr
    assert out.stderr.count("\n") == 1 and "--lr" in out.stderr


SMALL = ["--model", "mlp", "--hidden", "32", "--depth", "1", "--batch", "8", "--data-size", "64", "--steps", "4"]


def _small_checkpoint(ckpt_dir, history) -> None:
    """A checkpoint at step 2 for the SMALL run, with the given history (what another writer might leave)."""
    args = ddp.build_parser().parse_args(SMALL)
    model, _, _ = ddp._build(args)
    opt = train.make_optimizer(model.parameters(), "adamw", lr=args.lr)
    train.save_checkpoint(ckpt_dir / train.CHECKPOINT_NAME, step=2, model=model, optimizer=opt, scaler=None,
                          policy=args.precision, history=history)


@pytest.mark.parametrize("history", [{}, {"loss": [0.5]}, {"loss": [0.5, None]}, {"steps": [0, 1]}],
                         ids=["no history", "too short", "not numbers", "no loss"])
def test_resume_refuses_a_history_without_a_loss_per_step(history, tmp_path):
    _small_checkpoint(tmp_path, history)
    state = train.load_checkpoint(tmp_path / train.CHECKPOINT_NAME)
    with pytest.raises(train.CheckpointError, match="no 'loss' list of 2 numbers") as info:
        ddp._resumed_losses(tmp_path / train.CHECKPOINT_NAME, state)
    assert str(tmp_path) in str(info.value) and "\n" not in str(info.value)
    assert ddp._resumed_losses(tmp_path, {**state, "history": {"loss": [0.5, 0.25]}}) == [0.5, 0.25]


def test_resume_of_a_history_without_loss_fails_in_one_line_not_a_key_error(tmp_path):
    """One plain process (a single rank, no torchrun): --resume of a checkpoint whose history lacks "loss"."""
    _small_checkpoint(tmp_path, {"steps": [0, 1]})
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID")}
    env.update({"MASTER_PORT": str(dist.find_free_port()), "OMP_NUM_THREADS": "1"})
    out = subprocess.run([sys.executable, "-m", "labkit.recipes.ddp", *SMALL, "--ckpt-dir", str(tmp_path),
                          "--resume"], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 2 and "KeyError" not in out.stderr, out.stderr[-2000:]
    lines = [ln for ln in out.stderr.splitlines() if ln.strip() and "warn" not in ln.lower()]
    assert len(lines) == 1, out.stderr[-2000:]  # one line, not a traceback
    assert lines[0].startswith("python -m labkit.recipes.ddp: error: checkpoint ") and \
        "no 'loss' list of 2 numbers" in lines[0], lines[0]


def test_checksum_detects_a_single_bit_flip():
    t = torch.linspace(-1, 1, 100)
    u = t.clone()
    u.view(torch.int32)[17] ^= 1
    assert ddp.checksum([t]) == ddp.checksum([t.clone()])
    assert ddp.checksum([t]) != ddp.checksum([u])
    assert ddp.tensor_sum([t, u]) == pytest.approx(0.0, abs=1e-5)
    with pytest.raises(TypeError):
        ddp.checksum([[1.0]])


@pytest.mark.parametrize("env, said", [
    ({"WORLD_SIZE": "abc"}, "RANK is not"),
    ({"RANK": "1"}, "WORLD_SIZE is not"),
    ({"RANK": "5", "WORLD_SIZE": "2"}, "inconsistent rank layout"),
    ({"RANK": "0", "WORLD_SIZE": "-1"}, "inconsistent rank layout"),
    ({"MASTER_PORT": "99999"}, "not a TCP port"),
])
def test_a_bad_launcher_environment_is_one_line_and_exit_status_2(env, said):
    clean = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    out = subprocess.run([sys.executable, "-m", "labkit.recipes.ddp", "--steps", "1"], env={**clean, **env},
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 2 and said in out.stderr and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.stderr.count("\n") == 1 and out.stdout == ""


def test_an_unwritable_ckpt_dir_is_refused_before_the_model_is_built(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    out = subprocess.run([sys.executable, "-m", "labkit.recipes.ddp", "--steps", "1", "--ckpt-dir",
                          str(blocker / "ckpt")], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 2 and "--ckpt-dir" in out.stderr and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert blocker.read_text() == "not a directory"  # nothing of the user's touched
