"""Tests for labkit.train: every precision policy, metrics, clipping after unscale, atomic checkpoints
and bitwise-exact resume on the CPU."""

from __future__ import annotations

import dataclasses
import math
import os

import pytest
import torch

from labkit import data, models, train

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def task():
    return data.make_token_task("reverse", n=512, n_digits=4, vocab_size=8, seed=0)


def _model(task, seed=0):
    return models.TinyGPT(vocab_size=task.vocab_size, seq_len=task.seq_len, d_model=32, n_layers=1,
                          n_heads=2, seed=seed)


def _batches(task):
    return data.Batches(task.inputs, task.targets, batch_size=16, seed=0)


def _run(task, **kw):
    kw.setdefault("device", "cpu")
    kw.setdefault("progress", False)
    return train.train(_model(task), _batches(task), **kw)


@pytest.mark.parametrize("policy", list(train.POLICIES))
def test_every_policy_runs_and_records(task, policy):
    r = _run(task, policy=policy, steps=4)
    pol = train.get_policy(policy)
    assert r.steps == [0, 1, 2, 3] and r.policy == policy
    assert len(r.loss) == len(r.grad_norm) == len(r.scale) == len(r.skipped) == len(r.step_time) == 4
    assert all(t > 0 for t in r.step_time)
    assert next(r.model.parameters()).dtype == pol.param_dtype
    assert (r.scaler is not None) == pol.scaler
    assert r.scale[0] == (65536.0 if pol.scaler else 1.0)
    assert isinstance(r.peak_memory, int) and r.peak_memory > 0 and "CPU" in r.memory_source
    if policy != "fp16-pure":  # fp16-pure may blow up by design (Adam state in fp16)
        assert not any(math.isnan(v) for v in r.loss)


def test_custom_policy_bf16_with_scaler_and_resume(task, tmp_path):
    pol = dataclasses.replace(train.get_policy("bf16"), name="bf16+scaler", scaler=True)
    full = _run(task, policy=pol, steps=4)
    assert full.policy == "bf16+scaler" and full.scale[0] == 65536.0
    _run(task, policy=pol, steps=2, checkpoint_dir=tmp_path, checkpoint_every=2)
    resumed = _run(task, policy=pol, steps=4, checkpoint_dir=tmp_path, resume=True)
    assert resumed.loss == full.loss


def test_good_policies_learn_and_agree(task):
    res = {p: _run(task, policy=p, steps=30) for p in ("fp32", "fp16", "bf16")}
    for r in res.values():
        assert r.loss[-1] < 0.7 * r.loss[0]
    assert abs(res["fp16"].final_loss() - res["fp32"].final_loss()) < 0.1


def test_fp16_without_scaling_loses_small_gradients(task):
    def zero_fraction(policy: str) -> float:
        r = _run(task, policy=policy, steps=1, loss_weight=2.0**-14)
        g = torch.cat([p.grad.flatten() for p in r.model.parameters() if p.grad is not None])
        return float((g == 0).float().mean())

    scaled, unscaled = zero_fraction("fp16"), zero_fraction("fp16-noscale")
    assert unscaled > 0.3 and unscaled > scaled + 0.2


def test_cpu_memory_figure_shrinks_with_half_storage(task):
    full = _run(task, policy="fp32", steps=2)
    half = _run(task, policy="bf16-pure", steps=2)
    assert half.peak_memory < 0.6 * full.peak_memory


def test_fp32_runs_are_bitwise_deterministic(task):
    a, b = _run(task, steps=5), _run(task, steps=5)
    assert a.loss == b.loss
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(pa, pb)


def test_resume_is_bitwise_equal_to_uninterrupted_fp32(task, tmp_path):
    full = _run(task, steps=8)
    first = _run(task, steps=5, checkpoint_dir=tmp_path, checkpoint_every=2)
    assert first.checkpoint is not None and train.load_checkpoint(first.checkpoint)["step"] == 5
    resumed = _run(task, steps=8, checkpoint_dir=tmp_path, checkpoint_every=2, resume=True)
    assert resumed.resumed_from == 5
    assert resumed.loss == full.loss and resumed.grad_norm == full.grad_norm
    for pa, pb in zip(resumed.model.parameters(), full.model.parameters()):
        assert torch.equal(pa, pb)
    for sa, sb in zip(resumed.optimizer.state.values(), full.optimizer.state.values()):
        assert torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"])
    assert [f for f in os.listdir(tmp_path) if f != train.CHECKPOINT_NAME] == []  # no temp files left


def test_resume_restores_scaler_state(task, tmp_path):
    kw = {"policy": "fp16", "scaler_kwargs": {"init_scale": 2.0**10, "growth_interval": 2}}
    full = _run(task, steps=7, **kw)
    _run(task, steps=3, checkpoint_dir=tmp_path, checkpoint_every=3, **kw)
    resumed = _run(task, steps=7, checkpoint_dir=tmp_path, checkpoint_every=3, resume=True, **kw)
    assert resumed.scale == full.scale and resumed.scale[-1] > 2.0**10  # grew, and continued identically
    assert resumed.loss == full.loss
    assert resumed.scaler.get_scale() == full.scaler.get_scale()


def test_failed_save_keeps_previous_checkpoint(task, tmp_path, monkeypatch):
    r = _run(task, steps=2, checkpoint_dir=tmp_path, checkpoint_every=2)
    before = (tmp_path / train.CHECKPOINT_NAME).read_bytes()

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(OSError, match="disk full"):
        train.save_checkpoint(tmp_path / train.CHECKPOINT_NAME, step=9, model=r.model, optimizer=r.optimizer,
                              scaler=None, policy="fp32")
    assert (tmp_path / train.CHECKPOINT_NAME).read_bytes() == before
    assert os.listdir(tmp_path) == [train.CHECKPOINT_NAME]


def test_overflow_steps_are_skipped_and_scale_halves(task):
    r = _run(task, policy="fp16", steps=16, scaler_kwargs={"init_scale": 2.0**30})
    assert r.skipped[0] and r.scale[1] == r.scale[0] / 2
    assert r.n_skipped >= 1 and not r.skipped[-1]


def test_clipping_applies_to_unscaled_gradients(task):
    clip = 1e-3
    opt = lambda params: torch.optim.SGD(params, lr=1.0)  # noqa: E731
    m0 = _model(task)
    r = _run(task, policy="fp16", steps=1, optimizer=opt, clip_grad_norm=clip)
    assert r.grad_norm[0] > 10 * clip  # so the clip was active
    delta = torch.sqrt(sum(((a.detach().float() - b.detach().float()) ** 2).sum() for a, b in zip(r.model.parameters(),
                                                                              m0.parameters())))
    assert float(delta) == pytest.approx(clip, rel=0.02)  # clipped true gradient, not the scaled one


def test_bad_arguments(task, tmp_path):
    with pytest.raises(ValueError, match="unknown precision policy"):
        _run(task, policy="fp8")
    with pytest.raises(ValueError, match="checkpoint_dir"):
        _run(task, steps=1, resume=True)
    with pytest.raises(ValueError, match="steps"):
        _run(task, steps=-1)
    with pytest.raises(ValueError, match="optimizer"):
        _run(task, steps=1, optimizer="lion")
    _run(task, steps=2, checkpoint_dir=tmp_path, checkpoint_every=1)
    with pytest.raises(ValueError, match="policy"):
        _run(task, steps=3, policy="bf16", checkpoint_dir=tmp_path, resume=True)
    with pytest.raises(FileNotFoundError):
        train.load_checkpoint(tmp_path / "nope.pt")


def test_autocast_op_table_measured_on_cpu():
    table = train.autocast_op_dtypes("cpu", torch.bfloat16)
    assert set(table) == set(train.CUDA_AUTOCAST_REFERENCE) == set(train.AUTOCAST_OPS)
    for op in ("matmul", "linear", "bmm"):
        assert table[op] == (torch.float32, torch.bfloat16)  # autocast casts matmuls down
    assert table["cross_entropy"][1] == torch.float32  # CPU autocast keeps losses in fp32
    assert table["relu"] == (torch.bfloat16, torch.bfloat16)
    # torch 2.13 CPU autocast does not upcast softmax/layer_norm, unlike CUDA autocast
    assert table["softmax"][1] == torch.bfloat16 and train.CUDA_AUTOCAST_REFERENCE["softmax"] == "fp32"
    with pytest.raises(ValueError):
        train.autocast_op_dtypes("cpu", torch.float32)


def test_loss_curves_plot_marks_divergence():
    import matplotlib

    matplotlib.use("Agg")
    from labkit import plots

    ax = plots.loss_curves({"ok": [2.0, 1.0, 0.5], "bad": [2.0, float("nan"), float("nan")]})
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["ok", "bad (non-finite from step 1)"]
    ax = plots.loss_curves({"later": ([5, 6, 7], [1.0, float("inf"), 0.5])})
    assert ax.get_legend().get_texts()[0].get_text() == "later (non-finite from step 6)"
    with pytest.raises(ValueError):
        plots.loss_curves({})


# --- exercises of notebook 04: the graders accept the reference and reject the classic mistakes ---

def _evaluate(ex_id, answer):
    from labkit.check import evaluate

    return evaluate(ex_id, answer).status


def test_exercise_amp_step():
    from labkit.exercises import nb04
    from labkit.models import lm_loss

    assert _evaluate("04.amp-step", nb04.reference_amp_step) == "correct"

    def clip_before_unscale(model, opt, scaler, x, y, dtype):
        opt.zero_grad()
        with torch.autocast(device_type="cpu", dtype=dtype):
            loss = lm_loss(model(x), y)
        scaler.scale(loss).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()

    def plain_step(model, opt, scaler, x, y, dtype):
        opt.zero_grad()
        with torch.autocast(device_type="cpu", dtype=dtype):
            loss = lm_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        scaler.update()

    assert _evaluate("04.amp-step", clip_before_unscale) == "wrong"
    assert _evaluate("04.amp-step", plain_step) == "wrong"
    assert _evaluate("04.amp-step", ...) == "not attempted"


def test_exercise_pick_dtype_island_and_resume():
    from labkit.exercises import nb04

    assert _evaluate("04.pick-dtype", nb04.reference_pick_amp) == "correct"
    assert _evaluate("04.pick-dtype", lambda caps: ("fp16", True)) == "wrong"
    assert _evaluate("04.fp32-island", nb04.reference_island_softmax) == "correct"
    naive = lambda s: torch.exp(s) / torch.exp(s).sum(-1, keepdim=True)  # noqa: E731
    assert _evaluate("04.fp32-island", naive) == "wrong"
    naive_island = lambda s: (torch.exp(s.float()) / torch.exp(s.float()).sum(-1, keepdim=True)).to(s.dtype)  # noqa: E731
    assert _evaluate("04.fp32-island", naive_island) == "wrong", "fp32 without the max only moves the overflow to 88.7"
    # 04.resume-scaler runs the learner's save/load on a real run: a checkpoint of whole objects cannot be read
    # back with weights_only=True, and one without the optimizer state is caught too
    from labkit.check import evaluate

    def save_objects(path, model, opt, scaler):
        torch.save({"model": model, "opt": opt, "scaler": scaler}, path)

    def load_nothing(path, model, opt, scaler):
        return

    assert "weights_only" in evaluate("04.resume-scaler", (save_objects, load_nothing)).message

    def save_no_opt(path, model, opt, scaler):
        torch.save({"model": model.state_dict(), "scaler": scaler.state_dict()}, path)

    def load_no_opt(path, model, opt, scaler):
        ckpt = torch.load(path, weights_only=True)
        model.load_state_dict(ckpt["model"])
        scaler.load_state_dict(ckpt["scaler"])

    assert "optimizer" in evaluate("04.resume-scaler", (save_no_opt, load_no_opt)).message
