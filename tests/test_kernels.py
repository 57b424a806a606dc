"""labkit.kernels, labkit.kernelbench and labkit.traffic: every reference Triton kernel against torch, in Triton's
interpreter (the mode the device gate chooses on a CPU, as in CI), and the byte counts against the model and against
what torch's ops really touch.

The numerics facts about the interpreter that notebook 08 teaches (bf16 casts truncate, bf16 arithmetic without a
conversion is nonsense) are tested here as measured, and will fail loudly if a Triton release changes them. On a
CUDA machine the same tests run the compiled kernels and check the GPU's side of each fact instead (round to nearest
even, a bf16 sum that is merely imprecise); ``make gpu-check`` adds the timings.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import torch
import torch.nn.functional as F
import triton.language as tl
from lab_env import makefile_var

from labkit import kernelbench as KB
from labkit import kernels
from labkit import traffic as T
from labkit.check import evaluate
from labkit.exercises import get_exercise

ROOT = Path(__file__).resolve().parents[1]
#: The Triton torch 2.13.0's Linux CUDA wheels declare (Requires-Dist: triton==3.7.1).
TORCH_CUDA_TRITON = "3.7.1"
MODE = kernels.setup()
K = kernels.load()


def test_the_device_gate_chooses_the_mode():
    if torch.cuda.is_available():
        assert not MODE.interpreted and MODE.device.type == "cuda" and "compiled" in str(MODE)
        assert type(K.softmax_kernel).__name__ == "JITFunction"
        return
    assert MODE.interpreted and MODE.device == torch.device("cpu")
    assert os.environ["TRITON_INTERPRET"] == "1"
    assert "interpreter" in str(MODE) and "no CUDA GPU" in str(MODE)
    assert type(K.softmax_kernel).__name__ == "InterpretedFunction"
    assert kernels.setup("cpu") is MODE and kernels.mode() is MODE


def test_a_second_mode_in_the_same_process_is_refused(monkeypatch):
    monkeypatch.setattr(kernels, "_MODE", kernels.Mode("compiled", torch.device("cpu"), "pretend"))
    with pytest.raises(ValueError, match="fresh process"):
        kernels.setup("cpu")


def test_kernels_imported_before_setup_are_redecorated_by_load():
    code = ("import os; os.environ.pop('TRITON_INTERPRET', None)\n"
            "import labkit._triton_kernels as m\n"
            "print(type(m.softmax_kernel).__name__)\n"
            "from labkit import kernels\n"
            "kernels.setup('cpu')\n"
            "print(type(kernels.load().softmax_kernel).__name__)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU's path, on any machine
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                         check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["JITFunction", "InterpretedFunction"]


def test_the_kernels_extra_pins_torchs_triton_and_make_lab_installs_it():
    """The pin is the Triton that torch 2.13.0's CUDA wheels require (tests/test_cuda_install.py resolves that
    install against the package index), so a GPU machine's install resolves and the CPU runs the same Triton."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["kernels"] == [f"triton=={TORCH_CUDA_TRITON}; sys_platform == 'linux'"]
    assert "kernels" in makefile_var("LAB_EXTRAS").split(",")
    assert kernels.triton_available() and "pip install -e '.[kernels]'" in kernels.install_hint()
    import triton

    assert triton.__version__ == TORCH_CUDA_TRITON and torch.__version__.startswith("2.13.0")


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("name", KB.NAMES)
def test_every_reference_kernel_matches_torch(name, dtype):
    for rows, cols in ((3, 7), (5, 300), (2, 1024)):
        v = KB.verify(name, rows, cols, dtype, seed=rows)
        assert v.ok, (rows, cols, v)
        assert v.rtol == (1e-5 + 2.0**-7 if dtype == "bf16" and name != "adamw" else 1e-5)


def test_several_adamw_steps_follow_torch():
    inp = KB.make_inputs("adamw", 4, 50)
    ours = {"p": inp["p"].clone(), "m": torch.zeros_like(inp["p"]), "v": torch.zeros_like(inp["p"])}  # a fresh AdamW
    ours["p"] = torch.nn.Parameter(ours["p"])  # updated in place like a model's weight
    p = torch.nn.Parameter(inp["p"].clone())
    opt = torch.optim.AdamW([p], lr=1e-2, weight_decay=0.1, foreach=False)
    for step in range(1, 6):
        g = KB.make_inputs("adamw", 4, 50, seed=step)["g"]
        kernels.adamw_step(ours["p"], g, ours["m"], ours["v"], step, lr=1e-2, weight_decay=0.1)
        p.grad = g
        opt.step()
    assert kernels.close(ours["p"], p.detach())[0]
    assert kernels.close(ours["m"], opt.state[p]["exp_avg"])[0]
    assert kernels.close(ours["v"], opt.state[p]["exp_avg_sq"])[0]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_matches_sdpa(dtype, causal):
    for shape, bm, bn in (((1, 2, 37, 16), 16, 32), ((2, 1, 100, 32), 32, 16), ((1, 1, 16, 64), 16, 16)):
        q, k, v = (kernels.randn(*shape, seed=s, dtype=dtype) for s in (1, 2, 3))
        got = kernels.flash_attention(q, k, v, causal, block_m=bm, block_n=bn)
        want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
        assert got.dtype == q.dtype and kernels.close(got, want)[0], (shape, bm, bn)
    # the textbook version computes the same attention
    got = kernels.flash_attention_unfused(q.double(), k.double(), v.double(), causal)
    assert torch.allclose(got, want, atol=1e-12)


def _attention_16bit_tiles(q, k, v, causal, block_n=32):
    """What the compiled kernel's DOT_16BIT path computes, modelled in torch: fp32 scores from the 16-bit q and k,
    the online softmax in fp32, each probability tile rounded to v's dtype before P @ V, fp32 accumulation."""
    qf, kf, vf = q.float(), k.float(), v.float()
    n = q.shape[-2]
    m = torch.full((*q.shape[:-1], 1), -math.inf)
    row_sum = torch.zeros_like(m)
    acc = torch.zeros_like(qf)
    for start in range(0, n, block_n):
        kt, vt = kf[..., start:start + block_n, :], vf[..., start:start + block_n, :]
        s = qf @ kt.transpose(-2, -1) * q.shape[-1] ** -0.5
        if causal:
            rows = torch.arange(n)[:, None]
            cols = torch.arange(start, start + kt.shape[-2])[None, :]
            s = s.masked_fill(cols > rows, -math.inf)
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        alpha, p = torch.exp(m - m_new), torch.exp(s - m_new)
        row_sum = row_sum * alpha + p.sum(-1, keepdim=True)
        acc = acc * alpha + p.to(v.dtype).float() @ vt
        m = m_new
    return (acc / row_sum).to(v.dtype)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_tolerance_covers_the_gpus_16bit_tiles_and_only_then_widens(causal):
    """make gpu-check found notebook 08's bf16 FlashAttention outside tolerance(bf16) on an H200: rounding P to bf16
    errs by up to 2**-8 max|v| (half a bf16 ulp), not relative to the output. The GPU's arithmetic, modelled in torch, is outside
    tolerance() and inside attention_tolerance(compiled=True); in the interpreter nothing widens."""
    q, k, v = (kernels.randn(2, 2, 100, 16, seed=s, dtype="bf16") for s in (1, 2, 3))
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
    gpu_like = _attention_16bit_tiles(q, k, v, causal)
    assert not kernels.close(gpu_like, want)[0]
    assert kernels.close(gpu_like, want, tol=kernels.attention_tolerance(v, compiled=True))[0]
    assert kernels.attention_tolerance(v, compiled=False) == kernels.tolerance("bf16")
    assert kernels.attention_tolerance(v) == kernels.tolerance("bf16")  # this CPU: the interpreter
    rtol, atol = kernels.attention_tolerance(v, compiled=True)
    assert rtol == kernels.tolerance("bf16")[0] and atol == pytest.approx(1e-6 + 2**-7 * float(v.abs().max()))
    v32 = v.float()
    assert kernels.attention_tolerance(v32, compiled=True) == kernels.tolerance("fp32")  # fp32 tiles stay fp32
    with pytest.raises(TypeError, match="compiled must be"):
        kernels.attention_tolerance(v, compiled="yes")
    with pytest.raises(TypeError, match="tol must be a pair"):
        kernels.close(gpu_like, want, tol=(1e-2,))
    with pytest.raises(TypeError, match="tol must be a pair"):
        kernels.close(gpu_like, want, tol=(1e-2, -1.0))


def test_a_plain_function_and_a_kernel_ref_launch_like_a_kernel():
    x = kernels.randn(6, 40, scale=3.0)
    want = torch.softmax(x.double(), -1)
    undecorated = K.softmax_kernel.fn  # the Python function under @triton.jit
    for kernel in (None, K.softmax_kernel, kernels.KernelRef("softmax_kernel"), undecorated):
        assert kernels.close(kernels.softmax(x, kernel=kernel), want)[0]
    with pytest.raises(TypeError, match="launch it"):
        kernels.KernelRef("softmax_kernel")()
    with pytest.raises(ValueError, match="no kernel named"):
        kernels.softmax(x, kernel=kernels.KernelRef("no_such_kernel"))
    with pytest.raises(TypeError, match="triton.jit"):
        kernels.as_kernel(torch.nn.Linear(2, 2))
    assert kernels.source(K.softmax_kernel).startswith("@triton.jit\ndef softmax_kernel(")


def test_launchers_check_their_inputs():
    x = kernels.randn(4, 8)
    with pytest.raises(ValueError, match="bias must have"):
        kernels.bias_gelu(x, kernels.randn(7))
    with pytest.raises(ValueError, match="contiguous"):
        kernels.softmax(x.t())
    with pytest.raises(ValueError, match="'float32', 'bfloat16'"):
        kernels.softmax(x.double())
    with pytest.raises(ValueError, match="head dim"):
        kernels.flash_attention(*(kernels.randn(1, 1, 8, 12) for _ in range(3)))
    with pytest.raises(ValueError, match="power of two"):
        kernels.bias_gelu(x, kernels.randn(8), block=48)
    with pytest.raises(ValueError, match="float32"):
        kernels.adamw_step(*(kernels.randn(5, dtype="bf16") for _ in range(4)), step=1)
    with pytest.raises(TypeError):
        kernels.layernorm(x, "w", "b")
    y = kernels.softmax(x.requires_grad_())  # a kernel is no autograd op: the input is detached, not refused
    assert not y.requires_grad


def test_randn_is_the_same_on_every_machine():
    import numpy as np

    want = np.random.default_rng(5).standard_normal((3, 4), dtype=np.float32) * np.float32(2) + np.float32(1)
    assert torch.equal(kernels.randn(3, 4, seed=5, scale=2.0, shift=1.0), torch.from_numpy(want))
    assert kernels.randn(3, dtype="bf16").dtype == torch.bfloat16


def test_tolerances_are_stated_from_the_format():
    assert kernels.tolerance("fp32") == (1e-5, 1e-6)
    assert kernels.tolerance(torch.bfloat16) == (1e-5 + 2.0**-7, 1e-6)
    assert kernels.tolerance("fp16") == (1e-5 + 2.0**-10, 1e-6)
    ok, worst = kernels.close(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0 + 1e-5]))
    assert ok and 0 < worst < 1
    assert not kernels.close(torch.tensor([math.nan]), torch.tensor([1.0]))[0]


# --- bytes ---------------------------------------------------------------------------------------------------------


def _measured(fn, model, *args, **kwargs):
    """What the interpreter counts for ``fn(*args, **kwargs)``; compiled kernels cannot be watched: the model."""
    if MODE.interpreted:
        return T.triton_traffic(fn, *args, **kwargs)
    with pytest.raises(ValueError, match="interpreter"):
        T.triton_traffic(fn, *args, **kwargs)
    return model


def test_torch_traffic_counts_what_each_op_touches():
    x = torch.ones(64, 100)
    t = T.torch_traffic(kernels.softmax_unfused, x)
    n, m = x.nbytes, 64 * 4
    assert [o.op for o in t.ops] == ["amax", "sub.Tensor", "exp", "sum.dim_IntList", "div.Tensor"]
    assert [(o.read, o.written) for o in t.ops] == [(n, m), (n + m, n), (n, n), (n, m), (n + m, n)]
    # views move nothing; an in-place op reads and writes; an input given twice is read once
    g = torch.ones(100)
    t = T.torch_traffic(lambda a, b: a.view(10, 10).t().mul_(2).addcmul_(b.view(10, 10), b.view(10, 10)), x[0], g)
    assert [(o.op, o.read, o.written) for o in t.ops] == [("mul_.Tensor", 400, 400), ("addcmul_", 800, 400)]
    # torch's fused AdamW: its schema marks the gradients mutable, but it writes them only with a grad_scale
    inp = KB.make_inputs("adamw", 4, 25)
    fused = T.torch_traffic(KB.run_unfused, "adamw", inp, library=True)
    assert fused.ops[-1].op == "_fused_adamw_" and fused.ops[-1].written == 3 * inp["p"].nbytes


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("name", KB.NAMES)
def test_the_interpreter_count_equals_the_model(name, dtype):
    rows, cols = 6, 70
    model = T.fused_traffic(name, rows, cols, dtype)
    measured = _measured(KB.run_fused, model, name, KB.make_inputs(name, rows, cols, dtype))
    assert (measured.read, measured.written, measured.launches) == (model.read, model.written, 1)
    unfused = T.torch_traffic(KB.run_unfused, name, KB.make_inputs(name, rows, cols, dtype))
    assert unfused.launches >= 2 and unfused.total > 1.9 * model.total
    cost = T.cost(name, rows, cols, model)
    assert cost.flops == T.FLOPS_PER_ELEMENT[name] * rows * cols and cost.bytes == model.total


def test_the_softmax_saving_is_eight_passes_against_two():
    x = KB.make_inputs("softmax", 64, 1000)["x"]
    fused = _measured(kernels.softmax, T.fused_traffic("softmax", 64, 1000), x)
    ratio = T.torch_traffic(kernels.softmax_unfused, x).total / fused.total
    assert ratio == pytest.approx(4 + 2 / 1000)
    ex = get_exercise("08.softmax-bytes")
    assert ex.reference[1] == pytest.approx(ratio, abs=0.01)


def test_flash_attention_never_stores_the_score_matrix():
    q, k, v = (kernels.randn(1, 2, 128, 16, seed=s) for s in (1, 2, 3))
    if MODE.interpreted:
        flash = T.triton_traffic(kernels.flash_attention, q, k, v, block_m=32)
        assert flash.launches == 1 and flash.read == 3 * q.nbytes and flash.written == q.nbytes
        assert flash.requested == q.nbytes * (1 + 2 * 128 // 32 + 1)  # Q once, K and V once per query block, O
    naive = T.torch_traffic(kernels.flash_attention_unfused, q, k, v)
    scores = 2 * 128 * 128 * 4
    assert max(o.written for o in naive.ops) == scores and naive.total > 4 * scores


def test_traffic_needs_the_interpreter_and_reports_bad_calls(monkeypatch):
    with pytest.raises(ValueError, match="failed on these arguments"):
        T.torch_traffic(torch.nn.Linear(2, 2), torch.ones(3))
    monkeypatch.setattr(kernels, "_MODE", kernels.Mode("compiled", torch.device("cpu"), "pretend"))
    with pytest.raises(ValueError, match="interpreter"):
        T.triton_traffic(lambda: None)


# --- the interpreter is not the hardware (measured, notebook 08 section 4) ---------------------------------------


def test_the_interpreter_truncates_bf16_casts():
    x = kernels.randn(4096, seed=0)
    got, want = kernels.cast(x, torch.bfloat16), x.to(torch.bfloat16)
    if not MODE.interpreted:  # compiled: the GPU's cvt.rn rounds to nearest even, as torch
        assert torch.equal(got, want)
        return
    ulps = (got.view(torch.int16).int() - want.view(torch.int16).int()).abs()
    assert 0 < int((ulps > 0).sum()) < 4096 and int(ulps.max()) == 1
    assert torch.equal(got, (x.view(torch.int32) & -65536).view(torch.float32).to(torch.bfloat16))
    assert torch.equal(kernels.cast(x, torch.float16), x.to(torch.float16))  # fp16 goes through NumPy: nearest


def test_bf16_arithmetic_without_a_conversion_is_nonsense_in_the_interpreter():
    xb = kernels.randn(1000, seed=3, shift=3.0, dtype="bf16")
    exact = float(xb.double().sum())
    assert kernels.kernel_sum(xb) == pytest.approx(exact, rel=1e-6)
    if MODE.interpreted:
        assert abs(kernels.kernel_sum(xb, upcast=False) - exact) > exact
    else:  # a real bf16 sum: imprecise, not nonsense
        assert kernels.kernel_sum(xb, upcast=False) == pytest.approx(exact, rel=0.05)


def test_race_leaves_the_interpreter_out():
    times = KB.race("softmax", 32, 64, repeats=2, compile=False)
    want = {"eager unfused", "eager library"} | (set() if MODE.interpreted else {"triton"})
    assert set(times) == want and all(t > 0 for t in times.values())


# --- the exercises' graders: the diagnosis names the mistake ----------------------------------------------------


@pytest.mark.parametrize(("ex_id", "words"), [("08.bias-gelu", "mask"), ("08.softmax", "row max"),
                                             ("08.layernorm", "bf16"), ("08.flash-attention", "old max")])
def test_each_grader_names_its_typical_mistake(ex_id, words):
    ex = get_exercise(ex_id)
    bad = evaluate(ex_id, ex.wrong)
    assert bad.status == "wrong" and words in bad.message


def _softmax_store_unmasked(x_ptr, y_ptr, n_cols, row_stride, BLOCK: tl.constexpr):
    """Right values, but the store has no mask: the last row writes past the end of the output."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * row_stride + offs, mask=offs < n_cols, other=float("-inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * row_stride + offs, (e / tl.sum(e, axis=0)).to(y_ptr.dtype.element_ty))


def _quiet(x_ptr, b_ptr, y_ptr, n, n_cols, BLOCK: tl.constexpr):
    """Stores nothing yet: the learner has not written it."""
    pid = tl.program_id(0)  # noqa: F841


def test_graders_catch_writes_past_the_end_and_unwritten_kernels():
    v = evaluate("08.softmax", _softmax_store_unmasked)  # a plain function: the grader decorates it
    assert v.status == "wrong" and "mask" in v.message
    assert evaluate("08.bias-gelu", _quiet).status == "not attempted"
    assert evaluate("08.bias-gelu", K.bias_gelu_kernel).status == "correct"


def test_adamw_torch_keeps_the_step_where_the_step_runs():
    """Eager single/foreach: the step counter on the host, as torch keeps it; capturable (compiled, on a GPU) on the
    parameters' device; capturable on a CPU is refused with the reason."""
    ins = KB.make_inputs("adamw", 4, 8)
    kernels.adamw_torch(**ins, impl="single")()
    with pytest.raises(ValueError, match="CUDA"):
        kernels.adamw_torch(**ins, impl="single", capturable=True)
    with pytest.raises(TypeError):
        kernels.adamw_torch(**ins, impl="single", capturable="yes")


# --- issue 31: int64 offsets, the one-block row cap, FlashAttention's traffic, notebook 16's kernels -------------


@pytest.mark.parametrize("name", ["bias_gelu_kernel", "softmax_kernel", "layernorm_kernel", "adamw_kernel",
                                  "flash_attention_kernel", "matmul_kernel", "softmax_looped_kernel",
                                  "flash_fwd_kernel", "flash_bwd_kernel", "layernorm_bwd_kernel"])
def test_reference_kernels_compute_offsets_in_int64(name):
    """program_id and integer arguments are int32: an offset past 2**31 elements wraps unless cast first."""
    src = kernels.source(getattr(K, name))
    assert ".to(tl.int64)" in src or "tl.cast(row, tl.int64)" in src
    assert "row_stride.to(" not in src  # row_stride == 1 is compiled as a constexpr, which has no .to()
    assert int(torch.tensor(69_999, dtype=torch.int32) * 40_000) < 0  # what the cast prevents


def test_one_block_rows_are_capped_where_registers_would_spill():
    assert kernels.MAX_ROW_BLOCK == 16384
    with pytest.raises(ValueError, match="spill"):
        kernels.softmax(torch.zeros(1, kernels.MAX_ROW_BLOCK + 1))
    with pytest.raises(ValueError, match="spill"):
        kernels.layernorm(torch.zeros(1, 65536), torch.ones(65536), torch.zeros(65536))
    x = kernels.randn(1, kernels.MAX_ROW_BLOCK, seed=2)
    assert kernels.close(kernels.softmax(x), torch.softmax(x.double(), -1))[0]


@pytest.mark.parametrize(("n", "bm"), [(64, 16), (64, 32), (100, 16), (100, 64), (128, 32), (37, 16)])
def test_flash_attentions_requests_follow_the_quadratic_formula(n, bm):
    """Q and O once, K and V once per query block: N d b (2 + 2 cdiv(N, BLOCK_M)), quadratic in N."""
    q, k, v = (kernels.randn(1, 2, n, 16, seed=s) for s in (1, 2, 3))
    want = T.flash_requested(n, 16, bm, heads=2)
    assert want == 2 * n * 16 * 4 * (2 + 2 * math.ceil(n / bm))
    if MODE.interpreted:
        assert T.triton_traffic(kernels.flash_attention, q, k, v, block_m=bm).requested == want
    with pytest.raises(ValueError):
        T.flash_requested(0, 16, 16)
    with pytest.raises(TypeError):
        T.flash_requested(64, 16.0, 16)


def test_triton_strays_needs_the_interpreter_and_a_callable(monkeypatch):
    with pytest.raises(TypeError):
        T.triton_strays("softmax")
    monkeypatch.setattr(kernels, "_MODE", kernels.Mode("compiled", torch.device("cpu"), "pretend"))
    with pytest.raises(ValueError, match="compute-sanitizer"):
        T.triton_strays(lambda: None)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_tiled_matmul_matches_torch_on_odd_shapes(dtype):
    """Tolerance: K * 2**-24 * (|A| @ |B|) per element (fp32 accumulation), plus one bf16 ulp for a bf16 output."""
    for m, k, n in ((33, 70, 47), (1, 5, 3), (100, 37, 65), (64, 64, 64)):
        a, b = kernels.randn(m, k, seed=m, dtype=dtype), kernels.randn(k, n, seed=n, dtype=dtype)
        c = kernels.matmul(a, b)
        assert c.dtype == a.dtype and kernels.matmul_close(c, a, b)[0], (m, k, n)
        bt = kernels.randn(n, k, seed=k, dtype=dtype).t()  # a strided view, no copy
        assert kernels.matmul_close(kernels.matmul(a, bt), a, bt)[0]
        own = kernels.matmul(a, b, kernel=K.matmul_kernel, blocks=(16, 32, 16), group_m=2)
        assert kernels.matmul_close(own, a, b)[0]
    with pytest.raises(ValueError, match="a.shape"):
        kernels.matmul(kernels.randn(3, 4), kernels.randn(5, 2))
    with pytest.raises(ValueError, match="same dtype"):
        kernels.matmul(kernels.randn(3, 4, dtype="bf16"), kernels.randn(4, 2))
    with pytest.raises(TypeError, match="blocks"):
        kernels.matmul(a, b, kernel=K.matmul_kernel, blocks=32)
    ok, worst = kernels.matmul_close(c + 1e-3, a, b)
    assert not ok and worst > 1


def test_matmul_configs_are_the_tuned_set_compiled_and_one_in_the_interpreter():
    configs = kernels.matmul_configs()
    assert len(configs) == (1 if MODE.interpreted else len(kernels.MATMUL_CONFIGS))
    assert all({"BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M"} <= set(c.kwargs) for c in configs)
    assert {c["num_stages"] for c in kernels.MATMUL_CONFIGS} >= {3, 4}


def test_the_looped_softmax_takes_rows_past_one_block_and_reads_twice():
    x = kernels.randn(3, 20_000, seed=3, scale=4.0)
    assert kernels.close(kernels.softmax_looped(x, block=4096), torch.softmax(x.double(), -1))[0]
    xb = kernels.randn(5, 300, seed=4, dtype="bf16")
    assert kernels.close(kernels.softmax_looped(xb, block=128), torch.softmax(xb.double(), -1))[0]
    if MODE.interpreted:
        xs = kernels.randn(4, 3000, seed=4)
        assert T.triton_traffic(kernels.softmax_looped, xs, block=1024).requested == 3 * xs.nbytes


@pytest.mark.parametrize("causal", [False, True])
def test_flash_forward_saves_the_logsumexp_and_stops_at_the_diagonal(causal):
    for shape, bm, bn in (((1, 2, 37, 16), 16, 16), ((2, 1, 100, 32), 32, 16), ((1, 1, 64, 16), 16, 32)):
        q, k, v = (kernels.randn(*shape, seed=s) for s in (1, 2, 3))
        o, lse = kernels.flash_attention_fwd(q, k, v, causal, block_m=bm, block_n=bn)
        n = shape[2]
        s = (q.double() @ k.double().transpose(-1, -2)) * shape[3] ** -0.5
        if causal:
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
        want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
        assert kernels.close(o, want)[0] and kernels.close(lse, torch.logsumexp(s, -1))[0], shape
    if MODE.interpreted:  # causal: query block i loads (i + 1) key tiles
        q, k, v = (kernels.randn(1, 1, 64, 16, seed=s) for s in (1, 2, 3))
        keys = sum(min((i + 1) * 16, 64) if causal else 64 for i in range(4))
        got = T.triton_traffic(kernels.flash_attention_fwd, q, k, v, causal).requested
        assert got == 4 * (2 * 64 * 16 + 2 * keys * 16 + 64)


@pytest.mark.parametrize("causal", [False, True])
def test_flash_backward_matches_torchs_gradients_and_gradcheck(causal):
    q, k, v = (kernels.randn(2, 2, 40, 16, seed=s).requires_grad_() for s in (4, 5, 6))
    ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
    do = kernels.randn(2, 2, 40, 16, seed=7)
    kernels.FlashAttention.apply(q, k, v, causal).backward(do)
    F.scaled_dot_product_attention(*ref, is_causal=causal).backward(do.double())
    for mine, theirs in zip((q, k, v), ref, strict=True):
        assert kernels.close(mine.grad, theirs.grad)[0]
    t64 = [kernels.randn(1, 1, 24, 16, seed=s).double().requires_grad_() for s in (8, 9, 10)]
    assert torch.autograd.gradcheck(lambda *t: kernels.FlashAttention.apply(*t, causal, 16, 16), t64,
                                    fast_mode=True)


def test_layernorm_backward_matches_torch_gradcheck_and_is_deterministic():
    x, w, b = kernels.randn(7, 30, seed=7), kernels.randn(30, seed=8, shift=1.0), kernels.randn(30, seed=9)
    x64, w64, b64 = (t.double().requires_grad_() for t in (x, w, b))
    assert torch.autograd.gradcheck(lambda *t: kernels.LayerNorm.apply(*t, 1e-5), (x64, w64, b64), fast_mode=True)
    dy = kernels.randn(7, 30, seed=10)
    F.layer_norm(x64, [30], w64, b64, 1e-5).backward(dy.double())
    _, mean, rstd = kernels.layernorm(x, w, b)
    for groups in (1, 3, 8):  # more groups than rows: some partial rows stay zero
        dx, dw, db = kernels.layernorm_bwd(x, w, mean, rstd, dy, groups=groups)
        for got, want in ((dx, x64.grad), (dw, w64.grad), (db, b64.grad)):
            assert kernels.close(got, want)[0], groups
    again = kernels.layernorm_bwd(x, w, mean, rstd, dy, groups=3)
    assert all(torch.equal(a, b_) for a, b_ in zip(kernels.layernorm_bwd(x, w, mean, rstd, dy, groups=3), again,
                                                   strict=True))
    with pytest.raises(ValueError, match="dy must be shaped"):
        kernels.layernorm_bwd(x, w, mean, rstd, dy[:3])
