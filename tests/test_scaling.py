"""labkit.scaling: DynamicLossScaler against torch.amp.GradScaler("cpu"), fractions, DeepSpeed's rule."""

from __future__ import annotations

import math
import random
import types

import numpy as np
import pytest
import torch

from labkit import scaling
from labkit.scaling import DynamicLossScaler

N_SEQUENCES = 240


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _random_knobs(rng: random.Random) -> dict:
    return {
        "init_scale": rng.choice([2.0**16, 2.0**24, 1.0, 3.0, 1e-3, 2.0**100, 12345.678]),
        "growth_factor": rng.choice([2.0, 2.0, 1.5, 3.0, 1.0001]),
        "backoff_factor": rng.choice([0.5, 0.5, 0.25, 0.7, 0.1]),
        "growth_interval": rng.choice([1, 2, 3, 5, 10, 2000]),
    }


def _run_pair(knobs: dict, pattern: list[str], seed: int):
    """Drive GradScaler and DynamicLossScaler through the same steps; return both traces."""
    traces = []
    for make in (lambda: torch.amp.GradScaler("cpu", **knobs), lambda: DynamicLossScaler(**knobs)):
        scaler = make()
        gen = torch.Generator().manual_seed(seed)
        w = torch.nn.Parameter(torch.randn(5, generator=gen))
        b = torch.nn.Parameter(torch.zeros(3))
        opt = torch.optim.SGD([w, b], lr=0.1)
        taken: list[int] = []
        opt.register_step_post_hook(lambda o, a, k, taken=taken: taken.append(1))
        scales, skipped, params = [], [], []
        for i, kind in enumerate(pattern):
            opt.zero_grad()
            x = torch.randn(5, generator=gen)
            loss = (w * x).sum() + b.sum() * 0.5
            scaler.scale(loss).backward()
            if kind != "ok":
                target = w if i % 2 else b
                bad = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}[kind]
                target.grad[i % target.numel()] = bad
            if i % 3 == 0:  # sometimes unscale explicitly (as before clipping), sometimes let step() do it
                scaler.unscale_(opt)
            before = len(taken)
            scales.append(scaler.get_scale())
            scaler.step(opt)
            scaler.update()
            skipped.append(len(taken) == before)
            params.append(torch.cat([w.detach(), b.detach()]).clone())
        scales.append(scaler.get_scale())
        traces.append((scales, skipped, params))
    return traces


@pytest.mark.parametrize("chunk", range(4))
def test_same_scales_and_skips_as_gradscaler(chunk: int) -> None:
    per = N_SEQUENCES // 4
    n_skips = 0
    for seq in range(chunk * per, (chunk + 1) * per):
        rng = random.Random(seq)
        knobs = _random_knobs(rng)
        p_bad = rng.choice([0.0, 0.05, 0.2, 0.5, 0.9])
        pattern = [rng.choice(["inf", "-inf", "nan"]) if rng.random() < p_bad else "ok"
                   for _ in range(rng.randint(5, 40))]
        (ts, tk, tp), (ms, mk, mp) = _run_pair(knobs, pattern, seed=seq)
        assert ms == ts, f"sequence {seq}, knobs {knobs}: scales differ"
        assert mk == tk, f"sequence {seq}: skipped steps differ"
        assert mk == [k != "ok" for k in pattern]
        for a, b in zip(tp, mp):  # same unscale arithmetic, so bit-identical parameters
            assert torch.equal(a, b), f"sequence {seq}: parameters differ"
        n_skips += sum(mk)
    assert n_skips > 100  # the sequences really exercise the backoff path


def test_scale_collapse_matches_gradscaler_down_to_zero() -> None:
    """A loss that keeps producing inf: the float32 scale walks through subnormals to exactly 0."""
    knobs = {"init_scale": 2.0**16, "growth_interval": 1}
    (ts, tk, _), (ms, mk, _) = _run_pair(knobs, ["inf"] * 170, seed=0)
    assert ms == ts and all(mk) and all(tk)
    assert 0.0 < ms[16 + 126 + 10] < 2.0**-126  # a float32 subnormal scale on the way down
    assert ms[-1] == 0.0
    mine = DynamicLossScaler(**knobs)
    for _ in range(170):
        mine.update(found_inf=True)
    assert mine.get_scale() == 0.0
    # ... and it never comes back: 0 * 2 is still 0
    assert scaling.simulate_scales([True] * 170 + [False] * 10, growth_interval=1)[-1] == 0.0
    # min_scale is the floor GradScaler lacks
    assert scaling.simulate_scales([True] * 170, min_scale=1.0)[-1] == 1.0


def test_collapsed_scale_poisons_the_weights_in_both() -> None:
    """At scale 0, a clean step's gradients are 0, unscaling gives 0 * inf = NaN, and the step is taken."""
    out = []
    for scaler in (torch.amp.GradScaler("cpu", init_scale=1.0), DynamicLossScaler(init_scale=1.0)):
        w = torch.nn.Parameter(torch.ones(3))
        opt = torch.optim.SGD([w], lr=0.1)
        for _ in range(160):
            opt.zero_grad()
            scaler.scale((w * math.inf).sum()).backward()
            scaler.step(opt)
            scaler.update()
        assert scaler.get_scale() == 0.0 and torch.equal(w.detach(), torch.ones(3))
        opt.zero_grad()
        scaler.scale((w * 2.0).sum()).backward()
        scaler.step(opt)
        scaler.update()
        out.append(w.detach().clone())
    assert torch.isnan(out[0]).all() and torch.isnan(out[1]).all()


def test_growth_stops_at_float32_max() -> None:
    s = scaling.simulate_scales([False] * 300, init_scale=1.0, growth_interval=1)
    assert s[127] == 2.0**127 and s[-1] == 2.0**127  # 2**128 would be inf in float32
    gs = torch.amp.GradScaler("cpu", init_scale=2.0**127, growth_interval=1)
    w = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([w], lr=0.0)
    gs.scale(w.sum()).backward()
    gs.step(opt)
    gs.update()
    assert gs.get_scale() == 2.0**127


def test_simulate_scales_doc_example() -> None:
    assert scaling.simulate_scales([False, True, False], init_scale=8.0, growth_interval=2) == [8.0, 8.0, 4.0, 4.0]
    assert scaling.simulate_scales([False, False], init_scale=8.0, growth_interval=2) == [8.0, 8.0, 16.0]


def test_state_dict_round_trips_with_gradscaler() -> None:
    mine = DynamicLossScaler(init_scale=1024.0, growth_interval=7)
    for f in [False, False, True, False, False]:
        mine.update(found_inf=f)
    gs = torch.amp.GradScaler("cpu")
    gs.load_state_dict(mine.state_dict())
    assert gs.get_scale() == 512.0 and gs.get_growth_interval() == 7
    assert gs.state_dict()["_growth_tracker"] == 2
    back = DynamicLossScaler()
    back.load_state_dict(gs.state_dict())
    assert back.state_dict() == {**mine.state_dict(), "min_scale": 0.0}
    # the restored scaler continues exactly like the original
    assert [back.update(found_inf=False) for _ in range(6)] == [mine.update(found_inf=False) for _ in range(6)]


def test_unscale_rules() -> None:
    w = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=1.0)
    s = DynamicLossScaler(init_scale=4.0)
    s.scale(w.sum()).backward()
    assert torch.equal(w.grad, torch.full((2,), 4.0))
    assert s.unscale_(opt) is False
    assert torch.equal(w.grad, torch.ones(2))
    with pytest.raises(RuntimeError, match="already been called"):
        s.unscale_(opt)
    assert s.step(opt) is True
    s.update()
    assert s.history[-1] == scaling.ScaleEvent(0, 4.0, False, 4.0)
    with pytest.raises(RuntimeError, match="update"):
        s.update()
    h = torch.nn.Parameter(torch.ones(2, dtype=torch.float16))
    h.grad = torch.ones(2, dtype=torch.float16)
    with pytest.raises(ValueError, match="FP16 gradients"):
        s.unscale_(torch.optim.SGD([h], lr=1.0))


@pytest.mark.parametrize("kwargs", [
    {"init_scale": 0.0}, {"init_scale": math.inf}, {"growth_factor": 1.0}, {"backoff_factor": 1.0},
    {"backoff_factor": 0.0}, {"growth_interval": 0}, {"min_scale": -1.0}, {"min_scale": 2.0**20},
])
def test_bad_knobs_raise_value_error(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        DynamicLossScaler(**kwargs)


def test_bad_types_raise_type_error() -> None:
    with pytest.raises(TypeError):
        DynamicLossScaler(growth_interval=2.5)
    with pytest.raises(TypeError):
        DynamicLossScaler().scale(1.0)
    with pytest.raises(TypeError):
        DynamicLossScaler().update(found_inf="yes")


# ---- fractions and static scales ---------------------------------------------------------------


def test_underflow_fraction_boundaries_fp16() -> None:
    tiny = 2.0**-24  # smallest fp16 subnormal
    vals = [tiny, tiny / 2, tiny * 0.51, 2.0**-14, 2.0**-15, 0.0]
    # tiny/2 is a tie and rounds to even (0); tiny*0.51 rounds up to tiny; 0 is not counted
    assert scaling.underflow_fraction(vals, "fp16") == 1 / 5
    assert scaling.underflow_fraction(vals, "fp16", to="subnormal") == 4 / 5
    assert scaling.underflow_fraction(vals, "fp16", scale=2.0) == 0.0
    assert scaling.underflow_fraction(vals, "bf16") == 0.0
    assert scaling.underflow_fraction([0.0, 0.0], "fp16") == 0.0


def test_underflow_fraction_agrees_with_a_plain_cast() -> None:
    g = torch.randn(10_000, generator=torch.Generator().manual_seed(0)) * 1e-6
    for fmt, dt in [("fp16", torch.float16), ("bf16", torch.bfloat16), ("e5m2", torch.float8_e5m2)]:
        expected = int(((g.to(dt).float() == 0) & (g != 0)).sum()) / g.numel()
        assert scaling.underflow_fraction(g, fmt) == expected
    assert 0.01 < scaling.underflow_fraction(g, "fp16") < 0.05  # |N(0,1)| < 0.03 about 2.4 % of the time


def test_overflow_fraction() -> None:
    vals = np.array([65504.0, 65519.0, 65520.0, 1e6, -1e6, 1.0])
    assert scaling.overflow_fraction(vals, "fp16") == 3 / 6
    assert scaling.overflow_fraction(vals, "bf16") == 0.0
    assert scaling.overflow_fraction([1.0], "fp16", scale=2.0**16) == 1.0
    assert scaling.overflow_fraction([448.0, 464.0, 465.0], "e4m3fn") == 1 / 3
    with pytest.raises(ValueError):
        scaling.overflow_fraction([1.0], "fp16", scale=0.0)
    with pytest.raises(ValueError):
        scaling.overflow_fraction([1.0], "fp12")
    with pytest.raises(TypeError):
        scaling.overflow_fraction(["a"], "fp16")


def test_safe_scale_powers_are_exact() -> None:
    g = torch.randn(5000, generator=torch.Generator().manual_seed(1)) * 1e-7
    lo, hi = scaling.safe_scale_powers(g, "fp16")
    for k in (lo, hi, (lo + hi) // 2):
        assert scaling.underflow_fraction(g, "fp16", 2.0**k) == 0.0
        assert scaling.overflow_fraction(g, "fp16", 2.0**k) == 0.0
    assert scaling.underflow_fraction(g, "fp16", 2.0 ** (lo - 1)) > 0
    assert scaling.overflow_fraction(g, "fp16", 2.0 ** (hi + 1)) > 0
    assert scaling.choose_scale_power(g, "fp16") == (lo + hi) // 2
    lo_n, _ = scaling.safe_scale_powers(g, "fp16", to="subnormal")
    assert lo + 10 <= lo_n <= lo + 11  # normals start 10 binades above fp16's smallest subnormal
    assert scaling.underflow_fraction(g, "fp16", 2.0**lo_n, to="subnormal") == 0.0
    assert scaling.underflow_fraction(g, "fp16", 2.0 ** (lo_n - 1), to="subnormal") > 0
    # values spanning more binades than fp16 has: no static scale works
    assert scaling.safe_scale_powers([1e-30, 1.0], "fp16") is None
    with pytest.raises(ValueError, match="no scale"):
        scaling.choose_scale_power([1e-30, 1.0], "fp16")
    with pytest.raises(ValueError):
        scaling.safe_scale_powers([0.0], "fp16")


def test_grad_values() -> None:
    m = torch.nn.Linear(3, 2)
    with pytest.raises(ValueError, match="backward"):
        scaling.grad_values(m)
    m(torch.ones(1, 3)).sum().backward()
    v = scaling.grad_values(m)
    assert v.shape == (8,) and v.dtype == torch.float32


# ---- a real fp16 run --------------------------------------------------------------------------


def _tiny_run(scaler, emulate: bool, steps: int = 30):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    x = torch.randn(64, 8)
    y = torch.randn(64, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    return scaling.train_with_scaler(model, torch.nn.functional.mse_loss, lambda s: (x, y), opt, scaler,
                                     steps, emulate=emulate)


@pytest.mark.parametrize("emulate", [False, True])
def test_train_with_scaler_backs_off_then_grows(emulate: bool) -> None:
    from labkit import device as dev_gate

    if not emulate and not dev_gate.computes(torch.float16, "cpu"):
        pytest.skip("this CPU has no fp16 autocast; the emulated run covers the path")
    mine = _tiny_run(DynamicLossScaler(init_scale=2.0**30, growth_interval=5), emulate)
    ref = _tiny_run(torch.amp.GradScaler("cpu", init_scale=2.0**30, growth_interval=5), emulate)
    assert mine["scale"] == ref["scale"] and mine["skipped"] == ref["skipped"]
    assert mine["skipped"][0] and not mine["skipped"][-1]  # 2**30 overflows fp16 gradients at first
    first_ok = mine["skipped"].index(False)
    assert mine["scale"][first_ok] < 2.0**30
    assert max(mine["scale"][first_ok:]) > mine["scale"][first_ok]  # and grows back after clean steps
    assert all(math.isfinite(v) for v in mine["loss"])


# ---- DeepSpeed ---------------------------------------------------------------------------------


def test_deepspeed_config_mapping() -> None:
    cfg = scaling.deepspeed_fp16_config(DynamicLossScaler(init_scale=2.0**12, growth_interval=500))
    assert cfg == {"enabled": True, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 500,
                   "hysteresis": 1, "consecutive_hysteresis": False, "min_loss_scale": 1.0}
    assert scaling.deepspeed_fp16_config(torch.amp.GradScaler("cpu"))["initial_scale_power"] == 16
    kw = scaling.scaler_kwargs_from_deepspeed(cfg)
    assert kw == {"init_scale": 4096.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 500,
                  "min_scale": 1.0}
    DynamicLossScaler(**kw)
    with pytest.raises(ValueError, match="power of two"):
        scaling.deepspeed_fp16_config(DynamicLossScaler(init_scale=1000.0))
    with pytest.raises(ValueError, match="growth_factor"):
        scaling.deepspeed_fp16_config(DynamicLossScaler(growth_factor=4.0))
    with pytest.raises(ValueError, match="hysteresis"):
        scaling.scaler_kwargs_from_deepspeed({"loss_scale": 0})  # DeepSpeed's default hysteresis is 2
    with pytest.raises(ValueError, match="static"):
        scaling.scaler_kwargs_from_deepspeed({"loss_scale": 128, "hysteresis": 1})
    with pytest.raises(ValueError, match="unknown"):
        scaling.scaler_kwargs_from_deepspeed({"loss_scale_windw": 10})


def test_deepspeed_config_is_accepted_by_deepspeed() -> None:
    pc = pytest.importorskip("deepspeed.runtime.precision_config")
    cfg = scaling.deepspeed_fp16_config(DynamicLossScaler(init_scale=2.0**8, growth_interval=50))
    parsed = pc.DeepSpeedFP16Config(**cfg)
    assert parsed.initial_dynamic_scale() == 2.0**8 and parsed.loss_scale_window == 50
    assert parsed.hysteresis == 1 and parsed.loss_scale == 0


@pytest.fixture
def ds_loss_scaler(monkeypatch):
    ls = pytest.importorskip("deepspeed.runtime.fp16.loss_scaler")
    # update_scale() asks deepspeed.comm for the rank (to log on rank 0); no process group here.
    monkeypatch.setattr(ls, "dist", types.SimpleNamespace(get_rank=lambda: 1))
    return ls


def test_deepspeed_rule_matches_deepspeed(ds_loss_scaler) -> None:
    for seq in range(200):
        rng = random.Random(1000 + seq)
        kw = {"initial_scale_power": rng.choice([4, 8, 16]), "loss_scale_window": rng.choice([1, 2, 3, 7]),
              "hysteresis": rng.choice([1, 2, 3]), "consecutive_hysteresis": rng.choice([False, True]),
              "min_loss_scale": rng.choice([1.0, 0.25, 4.0])}
        p = rng.choice([0.05, 0.3, 0.6])
        flags = [rng.random() < p for _ in range(rng.randint(5, 60))]
        ds = ds_loss_scaler.DynamicLossScaler(
            init_scale=2.0 ** kw["initial_scale_power"], scale_window=kw["loss_scale_window"],
            min_scale=kw["min_loss_scale"], delayed_shift=kw["hysteresis"],
            consecutive_hysteresis=kw["consecutive_hysteresis"])
        expected, raised = [ds.cur_scale], False
        for f in flags:
            try:
                ds.update_scale(f)
            except Exception as exc:
                assert "minimum" in str(exc)
                raised = True
                break
            expected.append(ds.cur_scale)
        if raised:
            with pytest.raises(RuntimeError, match="min_loss_scale"):
                scaling.deepspeed_scale_sequence(flags, **kw)
            assert scaling.deepspeed_scale_sequence(flags[: len(expected) - 1], **kw) == expected
        else:
            assert scaling.deepspeed_scale_sequence(flags, **kw) == expected


def test_deepspeed_window_is_one_step_later_than_gradscaler() -> None:
    clean = [False] * 12
    gs = scaling.simulate_scales(clean, init_scale=16.0, growth_interval=4)
    ds = scaling.deepspeed_scale_sequence(clean, initial_scale_power=4, loss_scale_window=4, hysteresis=1)
    assert gs.index(32.0) == 4  # GradScaler: grown after 4 clean steps
    assert ds.index(32.0) == 5  # DeepSpeed: after window + 1
    assert ds.index(64.0) == 9  # then every window steps
    # with hysteresis 2, one isolated overflow does not halve the scale
    assert scaling.deepspeed_scale_sequence([False, True, False], initial_scale_power=4)[-1] == 16.0
    assert scaling.simulate_scales([False, True, False], init_scale=16.0)[-1] == 8.0


# ---- the exercises of notebooks 02 and 03 -----------------------------------------------------


@pytest.mark.parametrize("ex_id,right,wrongs", [
    ("02.underflows", [True, False, False, False, True], [[True] * 5, [False] * 5, [True, True, False, False, True]]),
    ("02.ulp-1000", 0.5, [1.0, 0.25, 2.0**-10]),
    ("02.first-int", 2049, [2048, 2050, 65504]),
    ("02.lost-update", 2.0**-10, [2.0**-11, 2.0**-9, 1e-5]),
    ("03.static-scale", 2.0**8, [2.0**7, 2.0**22, -1.0]),
    ("03.predict-scale", 512.0, [1024.0, 256.0, 2048.0]),
    ("03.deepspeed-config",
     {"enabled": True, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 500, "hysteresis": 1},
     [{"enabled": True, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 500},
      {"enabled": True, "loss_scale": 4096, "hysteresis": 1},
      {"enabled": True, "loss_scale": 0, "initial_scale_power": 4096, "loss_scale_window": 500, "hysteresis": 1},
      {"enabled": True, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 501, "hysteresis": 1},
      # the article's floor of 2^10: GradScaler has none, and with it every gradient above ~64 overflows for good
      {"enabled": True, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 500, "hysteresis": 1,
       "min_loss_scale": 1024}]),
])
def test_exercise_graders(ex_id: str, right, wrongs) -> None:
    from labkit.check import evaluate

    assert evaluate(ex_id, right).status == "correct"
    for w in wrongs:
        assert evaluate(ex_id, w).status == "wrong", w


def test_update_rule_grader_runs_the_learners_function() -> None:
    from labkit.check import evaluate

    def right(scale, tracker, found_inf):
        if found_inf:
            return scale / 2, 0
        return (scale * 2, 0) if tracker + 1 == 3 else (scale, tracker + 1)

    def off_by_one(scale, tracker, found_inf):  # grows one clean step late, as DeepSpeed's window does
        if found_inf:
            return scale / 2, 0
        return (scale * 2, 0) if tracker + 1 == 4 else (scale, tracker + 1)

    assert evaluate("03.update-rule", right).status == "correct"
    v = evaluate("03.update-rule", off_by_one)
    assert v.status == "wrong" and "one clean step late" in v.message  # the mistake, named (nb03._LATE_WHY)
    assert evaluate("03.update-rule", ...).status == "not attempted"


def test_exercises_reference_and_typical_mistake() -> None:
    from labkit.check import evaluate
    from labkit.exercises import all_exercises

    mine = {k: e for k, e in all_exercises().items() if k.startswith(("02.", "03."))}
    assert len(mine) >= 8
    for k, e in mine.items():
        assert evaluate(k, e.reference).status == "correct", k
        assert evaluate(k, e.wrong).status == "wrong", k
    assert evaluate("03.update-rule", lambda s, t, f: None).status == "not attempted"  # a stub


# --------------------------------------------------------------------------------------------------
# Checkpoint interchange with GradScaler, collapsed scales included (issue 15, bug 1)
# --------------------------------------------------------------------------------------------------


def _gradscaler_run(scaler, pattern):
    """Drive a GradScaler through overflow flags with a one-weight model; return the scale after each update."""
    w = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=0.0)
    out = []
    for bad in pattern:
        opt.zero_grad()
        scaler.scale((w * (math.inf if bad else 1.0)).sum()).backward()
        scaler.step(opt)
        scaler.update()
        out.append(scaler.get_scale())
    return out


@pytest.mark.parametrize("scale", [0.0, 2.0**-149, 2.0**-130, 1.0, 2.0**24])
def test_state_interchanges_with_gradscaler_both_ways(scale):
    knobs = {"growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2}
    pattern = [True, False, False, True, False, False, False]
    # GradScaler -> DynamicLossScaler
    gs = torch.amp.GradScaler("cpu", init_scale=1.0, **knobs)
    state = gs.state_dict()
    state.update(scale=scale, _growth_tracker=1)
    gs.load_state_dict(state)
    mine = scaling.DynamicLossScaler()
    mine.load_state_dict(gs.state_dict())
    assert mine.get_scale() == gs.get_scale() == scale
    theirs = _gradscaler_run(gs, pattern)
    ours = [mine.update(found_inf=bad) for bad in pattern]
    assert ours == theirs
    # DynamicLossScaler -> GradScaler
    back = torch.amp.GradScaler("cpu", **knobs)
    back.load_state_dict(mine.state_dict())
    assert back.get_scale() == mine.get_scale() and back.state_dict()["_growth_tracker"] == mine.state_dict()["_growth_tracker"]


def test_a_scale_collapsed_by_update_round_trips():
    mine = scaling.DynamicLossScaler(init_scale=2.0**-148, growth_interval=1000)
    for _ in range(3):  # 2^-148 -> 2^-149 -> 0 (float32 underflow) -> 0
        mine.update(found_inf=True)
    assert mine.get_scale() == 0.0
    gs = torch.amp.GradScaler("cpu")
    gs.load_state_dict(mine.state_dict())  # GradScaler accepts it ...
    again = scaling.DynamicLossScaler()
    again.load_state_dict(gs.state_dict())  # ... and so do we, now
    assert again.get_scale() == gs.get_scale() == 0.0
    with pytest.raises(ValueError, match=">= 0"):
        again.load_state_dict({**mine.state_dict(), "scale": -1.0})
    with pytest.raises(ValueError):
        again.load_state_dict({**mine.state_dict(), "scale": math.nan})


def test_the_deepspeed_knobs_table_has_every_knob_in_the_notebooks_language() -> None:
    from labkit import i18n
    en = scaling.deepspeed_knobs_markdown().splitlines()
    assert len(en) == 2 + len(scaling.DEEPSPEED_KNOBS) and all(ln.count("|") == 6 for ln in en)
    assert all(f"`{r['deepspeed']}`" in ln and r["note"] in ln for r, ln in zip(scaling.DEEPSPEED_KNOBS, en[2:]))
    try:
        i18n.set_language("zh")
        zh = scaling.deepspeed_knobs_markdown().splitlines()
    finally:
        i18n.set_language(None)
    assert zh[1:] != en[1:] and all(ln.count("|") == 6 for ln in zh)
    assert [ln.split("|")[1:5] for ln in zh[2:]] == [ln.split("|")[1:5] for ln in en[2:]]  # keys and defaults kept
