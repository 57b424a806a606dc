"""labkit.sizing: the 3D-parallelism calculator, checked against labkit.memory and the formulas computed here.

Every expected number is computed in the test from its source: model states from
:func:`labkit.memory.model_state_bytes`, activations from Korthikanti et al.'s formula in exact fractions,
the bubble and the live micro-batches from their definitions, the search against a brute-force enumeration.
Pure arithmetic: no GPU, no process group.
"""

from __future__ import annotations

import inspect
import math
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from labkit import memory, sizing
from labkit.memory import GB

S70 = sizing.SHAPES["70B"]
POLICY = sizing.DEFAULT_POLICY
TINY = sizing.TransformerShape(layers=4, hidden=256, heads=8, seq_len=128, vocab=1000, name="tiny")


def paper_layer_bytes(shape: sizing.TransformerShape, b: int, t: int, sp: bool = False,
                      recompute: str = "none") -> Fraction:
    """Korthikanti et al. 2022, Table 2 per layer, written out again in exact fractions."""
    s, h, a = shape.seq_len, shape.hidden, shape.heads
    sbh = Fraction(s * b * h)
    if recompute == "full":
        return 2 * sbh / t if sp else 2 * sbh
    attention = 0 if recompute == "selective" else Fraction(5 * a * s, h * t)
    if sp:
        return sbh * (Fraction(34, t) + attention)
    return sbh * (10 + Fraction(24, t) + attention)


def states(n_params: int, *, stage: int, world_size: int, largest: int = 0, policy: str = POLICY) -> memory.ModelState:
    return memory.model_state_bytes(n_params, policy, "adam", stage=stage, world_size=world_size,
                                    largest_layer_params=largest)


# --------------------------------------------------------------------------------------------------
# contract and shapes
# --------------------------------------------------------------------------------------------------

def test_module_contract():
    assert all(hasattr(sizing, name) for name in sizing.__all__)
    for name in sizing.__all__:
        obj = getattr(sizing, name)
        if callable(obj) and getattr(obj, "__module__", "") == sizing.__name__:
            assert obj.__doc__ and obj.__doc__.rstrip().endswith("Introduced in notebook 11."), name
    assert sizing.__doc__.rstrip().endswith("Introduced in notebook 11.")
    assert memory.get_policy(POLICY).name == "bf16-master-fp32-accum"
    assert memory.bytes_per_param(POLICY, "adam") == 20


def test_70b_shape_is_the_plain_gpt_count():
    assert (S70.layers, S70.hidden, S70.heads, S70.seq_len, S70.vocab) == (80, 8192, 64, 4096, 32000)
    assert S70.n_params == 12 * 80 * 8192**2 + 32000 * 8192 == 64_686_653_440
    assert S70.n_params < memory.MODEL_PRESETS["70B"]  # documented: the GPT formula undercounts Llama's 69e9
    assert "64.69e9" in S70.describe()
    assert set(sizing.SHAPES) <= set(memory.MODEL_PRESETS)


# --------------------------------------------------------------------------------------------------
# model states are labkit.memory's
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("tp, pp, dp, zero, policy", [
    (8, 1, 8, 1, POLICY), (4, 2, 8, 2, POLICY), (8, 8, 1, 0, "bf16-master"), (2, 4, 8, 3, POLICY),
    (1, 1, 64, 3, "bf16-master-fp32-grads"), (4, 5, 3, 1, POLICY),
])
def test_model_states_are_the_memory_model_for_params_over_tp_pp(tp, pp, dp, zero, policy):
    n = tp * pp * dp
    plan = sizing.plan_3d(n, 80 * GB, tp, pp, dp, zero=zero, policy=policy, global_batch=dp * 8)
    params = math.ceil(Fraction(S70.n_params, tp * pp))
    largest = max(4 * S70.hidden**2, S70.vocab * S70.hidden) // tp  # the largest weight matrix, split by TP
    want = states(params, stage=zero, world_size=dp, largest=largest, policy=policy)
    assert plan.params_per_gpu == params
    assert plan.model_state == want
    assert plan.model_state_bytes == want.device_total
    if zero < 3:  # the gathered working set plays no part below stage 3
        assert plan.model_state == states(params, stage=zero, world_size=dp, policy=policy)


def test_an_uneven_split_rounds_the_parameters_up():
    shape = sizing.TransformerShape(layers=3, hidden=128, heads=4, seq_len=64, vocab=1001)
    assert shape.n_params == 717_952 and shape.n_params % 3 == 1
    plan = sizing.plan_3d(6, 80 * GB, 1, 3, 2, model=shape, zero=1, global_batch=2)
    assert plan.params_per_gpu == 239_318  # ceil(717952 / 3): the GPU holding the remainder counts
    assert plan.model_state == states(239_318, stage=1, world_size=2)


def test_the_memory_model_is_called(monkeypatch):
    calls = []
    real = memory.model_state_bytes

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(memory, "model_state_bytes", spy)
    plan = sizing.plan_3d(64, 80 * GB, 4, 2, 8, zero=2)
    assert len(calls) == 1
    args, kwargs = calls[0]
    assert args[0] == plan.params_per_gpu and kwargs["stage"] == 2 and kwargs["world_size"] == 8


def test_one_gpu_is_the_single_gpu_memory_model():
    plan = sizing.plan_3d(1, 80 * GB, 1, 1, 1, model=TINY, zero=0, micro_batch=2, global_batch=6,
                          recompute="none", sequence_parallel=False)
    assert plan.model_state == memory.model_state_bytes(TINY.n_params, POLICY)  # stage 0, one rank
    assert plan.model_state_bytes == 20 * TINY.n_params
    s, b, h, a, L = TINY.seq_len, 2, TINY.hidden, TINY.heads, TINY.layers
    one_gpu_acts = L * Fraction(s * b * h) * (34 + Fraction(5 * a * s, h))  # the paper's t = 1 formula
    assert plan.activation_bytes == one_gpu_acts
    assert plan.live_micro_batches == 1 and plan.micro_batches == 3 and plan.bubble == 0
    assert plan.recompute_bytes == 0
    assert plan.total_bytes == plan.model_state_bytes + plan.activation_bytes
    assert plan.fits and plan.embedding_extra_bytes == 0


# --------------------------------------------------------------------------------------------------
# activations: Korthikanti et al. 2022
# --------------------------------------------------------------------------------------------------

def test_activation_bytes_are_the_paper_formula():
    # 70B, t = 8, b = 2, no SP, no recomputation: s·b·h·(10 + 24/t + 5·a·s/(h·t))
    by_hand = 4096 * 2 * 8192 * (10 + Fraction(24, 8) + Fraction(5 * 64 * 4096, 8192 * 8))
    assert by_hand == 4096 * 2 * 8192 * 33
    assert sizing.layer_activation_bytes("70B", 2, 8) == by_hand
    plan = sizing.plan_3d(64, 80 * GB, 8, 4, 2, micro_batch=2, global_batch=64, recompute="none",
                          sequence_parallel=False)
    assert plan.act_per_layer == by_hand
    assert plan.micro_batches == 16 and plan.live_micro_batches == 4
    assert plan.activation_bytes == (80 // 4) * by_hand * 4
    assert plan.activations.tokens == 4096 * 2


@pytest.mark.parametrize("t", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_sequence_parallel_divides_the_replicated_part_by_t(t, recompute):
    s, b, h = S70.seq_len, 3, S70.hidden
    no_sp = sizing.layer_activation_bytes(S70, b, t, False, recompute)
    sp = sizing.layer_activation_bytes(S70, b, t, True, recompute)
    assert no_sp == paper_layer_bytes(S70, b, t, False, recompute)
    assert sp == paper_layer_bytes(S70, b, t, True, recompute)
    assert no_sp - sp == 10 * s * b * h - Fraction(10 * s * b * h, t)


@pytest.mark.parametrize("t, sp", [(1, False), (4, False), (8, True), (2, True)])
def test_recomputation_modes(t, sp):
    s, b, h, a = S70.seq_len, 2, S70.hidden, S70.heads
    none = sizing.layer_activation_bytes(S70, b, t, sp, "none")
    selective = sizing.layer_activation_bytes(S70, b, t, sp, "selective")
    full = sizing.layer_activation_bytes(S70, b, t, sp, "full")
    assert none - selective == Fraction(5 * a * s * s * b, t)  # the attention scores are dropped
    assert full == (Fraction(2 * s * b * h, t) if sp else 2 * s * b * h)  # only the layer input stays
    plan = sizing.plan_3d(8 * t, 80 * GB, t, 2, 4, micro_batch=b, global_batch=64, recompute="selective",
                          sequence_parallel=sp)
    assert plan.act_per_layer == selective and plan.activations.per_layer == none
    assert plan.recompute_bytes == none - selective  # one layer recomputed during its backward
    assert plan.total_bytes == plan.model_state_bytes + plan.activation_bytes + none - selective


# --------------------------------------------------------------------------------------------------
# the pipeline: live micro-batches and the bubble
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("pp, m", [(1, 1), (1, 8), (4, 2), (4, 4), (4, 16), (8, 64)])
def test_live_micro_batches_1f1b_vs_gpipe(pp, m):
    assert sizing.live_micro_batches(pp, m, "1f1b") == min(pp, m)
    assert sizing.live_micro_batches(pp, m, "GPipe") == m
    assert sizing.live_micro_batches(pp, m) == min(pp, m)  # 1F1B by default


def test_gpipe_keeps_every_micro_batch():
    kw = dict(global_batch=32, recompute="full")
    f1b = sizing.plan_3d(64, 80 * GB, 8, 4, 2, schedule="1f1b", **kw)
    gpipe = sizing.plan_3d(64, 80 * GB, 8, 4, 2, schedule="gpipe", **kw)
    assert f1b.micro_batches == gpipe.micro_batches == 16
    assert (f1b.live_micro_batches, gpipe.live_micro_batches) == (4, 16)
    assert gpipe.activation_bytes == 4 * f1b.activation_bytes
    assert gpipe.activation_bytes == 20 * paper_layer_bytes(S70, 1, 8, True, "full") * 16
    assert gpipe.bubble == f1b.bubble  # the same bubble: 1F1B saves memory, not time


@pytest.mark.parametrize("pp, dp, B, bubble", [(4, 2, 24, Fraction(3, 15)), (1, 8, 64, 0), (8, 1, 8, Fraction(7, 15)),
                                                (2, 4, 4096, Fraction(1, 1024 + 1))])
def test_bubble_is_p_minus_1_over_m_plus_p_minus_1(pp, dp, B, bubble):
    plan = sizing.plan_3d(8 * pp * dp, 80 * GB, 8, pp, dp, global_batch=B)
    m = B // dp
    assert plan.micro_batches == m
    assert plan.bubble == pytest.approx(float(Fraction(pp - 1, m + pp - 1)))
    assert plan.bubble == pytest.approx(float(bubble))


def test_first_and_last_stage_hold_the_embedding():
    plan = sizing.plan_3d(64, 80 * GB, 4, 4, 4)
    heavy = (20 * 12 * 8192**2 + 32000 * 8192) // 4
    assert plan.heaviest_stage_params == heavy
    assert heavy - plan.params_per_gpu == pytest.approx(32000 * 8192 / 4 * (1 - 1 / 4), abs=1)
    want = states(heavy, stage=1, world_size=4).device_total - plan.model_state_bytes
    assert plan.embedding_extra_bytes == want > 0
    assert sizing.plan_3d(64, 80 * GB, 8, 1, 8).embedding_extra_bytes == 0


# --------------------------------------------------------------------------------------------------
# the 70B example: 64 GPUs of 80 GB
# --------------------------------------------------------------------------------------------------

def test_70b_pure_data_parallel_needs_zero3():
    P = S70.n_params
    zero0 = states(P, stage=0, world_size=64).device_total
    assert zero0 == 20 * P > 80 * GB  # 1.29 TB of model states on every GPU
    plan0 = sizing.plan_3d(64, 80 * GB, 1, 1, 64, zero=0)
    assert plan0.model_state_bytes == zero0 and not plan0.fits

    largest = max(4 * 8192**2, 32000 * 8192)
    zero3 = states(P, stage=3, world_size=64, largest=largest).device_total
    assert zero3 < 80 * GB  # sharded 64 ways the model states fit ...
    plan3 = sizing.plan_3d(64, 80 * GB, 1, 1, 64, zero=3)
    assert plan3.model_state_bytes == zero3
    # ... but one GPU's activations of 80 whole layers do not, unless every layer is recomputed
    assert plan3.activation_bytes == 80 * paper_layer_bytes(S70, 1, 1, True, "selective") > 80 * GB - zero3
    assert not plan3.fits
    assert sizing.plan_3d(64, 80 * GB, 1, 1, 64, zero=3, recompute="full").fits


def _brute_force_fitting(n: int, gpu: float, per_node: int = 8, **kw) -> set[tuple[int, int, int]]:
    found = set()
    for tp in range(1, per_node + 1):
        for pp in range(1, n + 1):
            for dp in range(1, n + 1):
                if tp * pp * dp != n or per_node % tp:
                    continue
                try:
                    plan = sizing.plan_3d(n, gpu, tp, pp, dp, gpus_per_node=per_node, **kw)
                except ValueError:
                    continue
                if plan.fits:
                    found.add((tp, pp, dp))
    return found


def test_search_70b_on_64_gpus_of_80gb():
    plans = sizing.search_plans(64, 80 * GB)
    assert plans and all(p.fits and p.tp * p.pp * p.dp == 64 and p.tp <= 8 for p in plans)
    assert {(p.tp, p.pp, p.dp) for p in plans} == _brute_force_fitting(64, 80 * GB)
    first = plans[0]
    assert first.model_parallel == min(p.model_parallel for p in plans)
    assert (first.tp, first.pp, first.dp) == (8, 1, 8)  # the notebook's answer with the default settings
    # nothing with a smaller model-parallel degree fits
    for tp, pp, dp in [(1, 1, 64), (2, 1, 32), (1, 2, 32), (4, 1, 16), (2, 2, 16), (1, 4, 16)]:
        assert not sizing.plan_3d(64, 80 * GB, tp, pp, dp).fits
    keys = [(p.model_parallel, p.bubble, p.total_bytes, p.tp) for p in plans]
    assert keys == sorted(keys)


def test_search_options():
    every = sizing.search_plans(64, 80 * GB, fitting_only=False)
    fitting = sizing.search_plans(64, 80 * GB)
    assert [p.fits for p in every] == sorted((p.fits for p in every), reverse=True)
    assert every[: len(fitting)] == fitting and len(every) > len(fitting)
    assert sizing.search_plans(64, 1 * GB) == []
    # a bigger reserve removes the tightest plans; a bigger micro-batch multiplies the activations
    tight = sizing.search_plans(64, 80 * GB, reserve_bytes=10 * GB)
    assert {(p.tp, p.pp) for p in tight} < {(p.tp, p.pp) for p in fitting}
    assert all(p.total_bytes <= 80 * GB for p in tight)
    # global batch 100 has no multiple of b·dp for dp = 8, 16, 32, 64: those layouts are skipped
    assert all(100 % p.dp == 0 for p in sizing.search_plans(64, 80 * GB, global_batch=100, fitting_only=False))
    # a TP group must fit a node evenly: with 6 GPUs per node, tp = 4 is left out though 4 <= 6
    shape = sizing.TransformerShape(layers=4, hidden=1536, heads=12, seq_len=256, vocab=5000)
    every6 = sizing.search_plans(48, 80 * GB, model=shape, gpus_per_node=6, global_batch=48, fitting_only=False)
    assert {p.tp for p in every6} == {1, 2, 3, 6}
    # 16 GPUs per node allow tp = 16 (64 heads), which then appears
    assert any(p.tp == 16 for p in sizing.search_plans(64, 80 * GB, gpus_per_node=16))


# --------------------------------------------------------------------------------------------------
# groups and the printed breakdown
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("tp, pp, dp", [(2, 3, 4), (8, 1, 8), (1, 4, 1), (8, 2, 4)])
def test_parallel_groups_partition_the_ranks(tp, pp, dp):
    g = sizing.parallel_groups(tp, pp, dp)
    n = tp * pp * dp
    for kind, size in (("tp", tp), ("pp", pp), ("dp", dp)):
        assert sorted(r for grp in g[kind] for r in grp) == list(range(n)), kind
        assert all(len(grp) == size for grp in g[kind]) and len(g[kind]) == n // size
    assert all(grp == list(range(grp[0], grp[0] + tp)) for grp in g["tp"])  # consecutive ranks
    if 8 % tp == 0:
        assert all(len({r // 8 for r in grp}) == 1 for grp in g["tp"])  # inside one node of 8
    assert all(grp[1] - grp[0] == tp for grp in g["dp"] if dp > 1)
    assert all(grp[1] - grp[0] == tp * dp for grp in g["pp"] if pp > 1)


def test_lines_print_the_breakdown_in_gb():
    plan = sizing.plan_3d(64, 80 * GB, 8, 2, 4)
    text = str(plan)
    assert text.splitlines() == plan.lines()
    ms = next(line for line in plan.lines() if line.startswith("model states"))
    assert "ZeRO-1 over dp=4" in ms and f"{plan.model_state_bytes / 1e9:,.2f} GB" in ms
    total = next(line for line in plan.lines() if line.startswith("total"))
    want = (plan.model_state_bytes + plan.activation_bytes + plan.recompute_bytes) / 1e9
    assert f"{want:,.2f} GB of 80.00 GB: fits" in total
    assert "tp=8 x pp=2 x dp=4" in text and "inside a node" in text and "bubble" in text
    bad = sizing.plan_3d(64, 80 * GB, 1, 1, 64, zero=0)
    assert "does NOT fit" in str(bad)
    assert "ACROSS nodes" in str(sizing.plan_3d(64, 80 * GB, 16, 1, 4))


# --------------------------------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(n_gpus=48, tp=3, pp=1, dp=16), ValueError, r"tp must divide the number of attention heads \(64\), got 3"),
    (dict(tp=8, pp=2, dp=2), ValueError, r"tp\*pp\*dp must equal the number of GPUs \(64\), got 8\*2\*2 = 32"),
    (dict(n_gpus=24, tp=8, pp=3, dp=1), ValueError, r"pp must divide the number of layers \(80\), got 3"),
    (dict(global_batch=1020), ValueError, r"global_batch must be a multiple of micro_batch\*dp = 1\*8 = 8"),
    (dict(tp=-8), ValueError, "tp must be >= 1"),
    (dict(micro_batch=0), ValueError, "micro_batch must be >= 1"),
    (dict(tp=True), TypeError, "tp must be a number"),
    (dict(tp="8"), TypeError, "tp must be a number"),
    (dict(zero=True), TypeError, "zero must be an int"),
    (dict(zero=4), ValueError, "ZeRO stage 0, 1, 2 or 3"),
    (dict(sequence_parallel="yes"), TypeError, "sequence_parallel must be True or False"),
    (dict(recompute="some"), ValueError, "recompute must be one of"),
    (dict(recompute=None), TypeError, "recompute must be a str"),
    (dict(schedule="interleaved"), ValueError, "schedule must be one of"),
    (dict(policy="fp32"), ValueError, "16-bit activations"),
    (dict(policy="nope"), ValueError, "unknown precision policy"),
    (dict(optimizer="lion"), ValueError, "unknown optimizer"),
    (dict(gpu_bytes=0), ValueError, "gpu_bytes must be a finite number > 0"),
    (dict(gpu_bytes=float("nan")), ValueError, "gpu_bytes"),
    (dict(gpu_bytes="80GB"), TypeError, "gpu_bytes must be a number"),
    (dict(reserve_bytes=-1), ValueError, "reserve_bytes"),
    (dict(model="huge"), ValueError, "no shape for model 'huge'"),
    (dict(model="1B"), ValueError, "MODEL_PRESETS has it as a parameter count only"),
    (dict(model=70), TypeError, "model must be a TransformerShape"),
    (dict(n_gpus=2**40, tp=1, pp=1, dp=2**40), ValueError, "n_gpus must be <="),
])
def test_plan_3d_rejects_bad_input(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        sizing.plan_3d(**kwargs)


def test_other_functions_reject_bad_input():
    with pytest.raises(ValueError, match=r"heads \(60\) must divide hidden \(8192\)"):
        sizing.TransformerShape(80, 8192, 60, 4096, 32000)
    with pytest.raises(TypeError, match="layers must be an int"):
        sizing.TransformerShape(80.0, 8192, 64, 4096, 32000)
    with pytest.raises(ValueError, match="seq_len must be >= 1"):
        sizing.TransformerShape(80, 8192, 64, -1, 32000)
    with pytest.raises(ValueError, match=r"tp must divide the number of attention heads \(64\), got 3"):
        sizing.layer_activation_bytes("70B", 1, 3)
    with pytest.raises(TypeError):
        sizing.live_micro_batches(4, "16")
    with pytest.raises(ValueError, match="schedule"):
        sizing.live_micro_batches(4, 16, "zb")
    with pytest.raises(ValueError, match="dp must be >= 1"):
        sizing.parallel_groups(1, 1, 0)
    with pytest.raises(ValueError, match="tp\\*pp\\*dp must be <="):
        sizing.parallel_groups(2**10, 2**10, 2**10)
    with pytest.raises(ValueError, match="n_gpus must be >= 1"):
        sizing.search_plans(0)
    with pytest.raises(TypeError, match="fitting_only"):
        sizing.search_plans(fitting_only="no")
    with pytest.raises(ValueError, match="ZeRO stage"):
        sizing.search_plans(zero=5)
    with pytest.raises(ValueError, match="16-bit"):
        sizing.search_plans(policy="fp32")


def test_huge_but_valid_numbers_stay_exact():
    plans = sizing.search_plans(micro_batch=1e300, global_batch=1e300, reserve_bytes=0.5, fitting_only=False)
    assert plans and not any(p.fits for p in plans)
    assert all(isinstance(p.total_bytes, int) for p in plans)
    assert sizing.plan_3d(reserve_bytes=0.5).reserve_bytes == 1


_JUNK = st.one_of(st.none(), st.booleans(), st.integers(-3, 10**6), st.floats(allow_nan=True),
                  st.text(max_size=4), st.lists(st.integers(), max_size=2), st.sampled_from(["70B", "7B", "1f1b"]))
_FUNCS = {name: getattr(sizing, name) for name in ("plan_3d", "search_plans", "layer_activation_bytes",
                                                   "live_micro_batches", "parallel_groups", "TransformerShape")}


@settings(max_examples=150, deadline=None, derandomize=True, phases=[Phase.generate],
          suppress_health_check=list(HealthCheck))
@given(name=st.sampled_from(sorted(_FUNCS)), data=st.data())
def test_junk_arguments_raise_type_or_value_error(name, data):
    fn = _FUNCS[name]
    params = [p for p in inspect.signature(fn).parameters.values() if p.kind is not p.VAR_KEYWORD]
    chosen = data.draw(st.lists(st.sampled_from(params), unique_by=lambda p: p.name, max_size=4))
    kwargs = {p.name: data.draw(_JUNK) for p in chosen}
    try:
        fn(**kwargs)
    except (TypeError, ValueError):
        pass
