"""labkit.precision: the one name -> dtype map, the one policy table, and the AMP step, checked against torch."""

from __future__ import annotations

import ast
import copy
import math
from pathlib import Path

import pytest
import torch

from labkit import formats, memory, precision, train

ROOT = Path(__file__).resolve().parents[1]
FLOAT_DTYPES = {"float16", "bfloat16", "float32", "float64", "half", "float", "double", "float8_e4m3fn",
                "float8_e5m2"}


# --------------------------------------------------------------------------------------------------
# names and dtypes
# --------------------------------------------------------------------------------------------------


def test_every_format_name_and_alias_maps_to_torchs_dtype():
    for name, fmt in formats.FORMATS.items():
        if fmt.torch_dtype is None:
            with pytest.raises(ValueError, match="no torch dtype"):
                precision.dtype(name)
            continue
        want = getattr(torch, fmt.torch_dtype)
        assert precision.dtype(name) is want and precision.dtype_name(want) == name
        assert torch.finfo(want).bits == fmt.total_bits  # the format table and torch agree on the width
    for alias, name in formats._ALIASES.items():
        if formats.FORMATS[name].torch_dtype is not None:
            assert precision.dtype(alias) is precision.dtype(name), alias
    assert precision.dtype(torch.bfloat16) is torch.bfloat16 and precision.dtype_name("half") == "fp16"


def test_bad_names_and_types_are_refused():
    with pytest.raises(ValueError, match="unknown float format"):
        precision.dtype("fp17")
    with pytest.raises(TypeError):
        precision.dtype(16)
    with pytest.raises(ValueError):
        precision.dtype_name(torch.int8)
    with pytest.raises(ValueError, match="unknown precision policy"):
        precision.get_policy("bf17")
    with pytest.raises(TypeError):
        precision.get_policy(None)


# --------------------------------------------------------------------------------------------------
# one table, one meaning per name
# --------------------------------------------------------------------------------------------------


def test_each_name_has_one_meaning():
    bf16 = precision.get_policy("bf16")
    assert bf16.autocast_dtype == torch.bfloat16 and bf16.param_dtype == torch.float32 and not bf16.master
    assert precision.get_policy("amp") is bf16 and precision.get_policy("mixed") is precision.get_policy("bf16-master")
    for alias, name in precision.POLICY_ALIASES.items():
        assert name in precision.POLICIES and alias not in precision.POLICIES
    # train and memory use the very same objects
    assert all(train.POLICIES[n] is precision.POLICIES[n] for n in train.POLICIES)
    assert memory.get_policy("bf16") is bf16 and memory.POLICIES is precision.POLICIES
    assert set(train.POLICIES) == {n for n, p in precision.POLICIES.items() if not p.master}
    with pytest.raises(ValueError, match="master"):
        train.get_policy("bf16-master")


@pytest.mark.parametrize("name", list(precision.POLICIES))
def test_policy_bytes_follow_the_dtypes(name):
    p = precision.POLICIES[name]
    assert p.param_bytes == p.param_dtype.itemsize
    assert p.grad_bytes == (0 if p.grads is None else precision.dtype(p.grads).itemsize)
    assert p.state_bytes == precision.dtype(p.optim_state).itemsize
    assert p.master_bytes == (4 if p.master else 0) and p.fp32_grad_bytes == (4 if p.fp32_grads else 0)
    assert p.compute_dtype == (p.autocast_dtype or p.param_dtype)
    assert p.scaler == (p.name == "fp16")  # only the fp16 AMP recipe scales the loss


# --------------------------------------------------------------------------------------------------
# the AMP step against torch's own sequence
# --------------------------------------------------------------------------------------------------


def _model_and_batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model, torch.randn(32, 8, generator=g), torch.randn(32, 1, generator=g)


@pytest.mark.parametrize("loss_factor", [1.0, math.inf])  # inf: the scaled loss overflows, the step is skipped
def test_backward_update_equal_torchs_gradscaler_sequence(loss_factor):
    ours, x, y = _model_and_batch()
    theirs = copy.deepcopy(ours)
    runs = []
    for model in (ours, theirs):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        runs.append((model, opt, torch.amp.GradScaler("cpu", init_scale=2.0**10)))
    (m1, o1, s1), (m2, o2, s2) = runs
    loss1 = torch.nn.functional.mse_loss(m1(x), y) * loss_factor
    precision.backward(loss1, s1)
    info = precision.update(o1, s1, clip_grad_norm=0.5)
    loss2 = torch.nn.functional.mse_loss(m2(x), y) * loss_factor
    s2.scale(loss2).backward()
    s2.unscale_(o2)
    true_norm = float(torch.nn.utils.clip_grad_norm_(m2.parameters(), 0.5))
    s2.step(o2)
    s2.update()
    for a, b in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(a, b)  # bit-identical weights
    assert s1.get_scale() == s2.get_scale() and info.scale == 2.0**10
    assert info.skipped == (loss_factor == math.inf)
    if loss_factor == 1.0:
        assert info.grad_norm == pytest.approx(true_norm, rel=1e-6)  # the norm of the *unscaled* gradients


def test_update_without_scaler_and_weight():
    m1, x, y = _model_and_batch(1)
    m2 = copy.deepcopy(m1)
    o1, o2 = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (m1, m2))
    precision.backward(torch.nn.functional.mse_loss(m1(x), y), weight=0.25)
    info = precision.update(o1)
    (torch.nn.functional.mse_loss(m2(x), y) * 0.25).backward()
    o2.step()
    assert all(torch.equal(a, b) for a, b in zip(m1.parameters(), m2.parameters()))
    assert info.scale == 1.0 and not info.skipped
    with pytest.raises(ValueError):
        precision.update(o1, clip_grad_norm=0)
    with pytest.raises(TypeError):
        precision.backward(1.0)


# --------------------------------------------------------------------------------------------------
# written once: no other name -> dtype map, no other AMP step
# --------------------------------------------------------------------------------------------------


def _sources():
    for path in sorted((ROOT / "labkit").rglob("*.py")):
        yield path, path.read_text()
    for path in sorted((ROOT / "tools" / "nbsrc").glob("*.py")):  # notebook sources: drop IPython magics
        text = "\n".join("" if ln.lstrip().startswith("%") else ln for ln in path.read_text().splitlines())
        yield path, text


def _is_torch_dtype(node):
    return (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "torch"
            and node.attr in FLOAT_DTYPES)


def dtype_maps(tree):
    """Dict literals from str keys to torch dtypes, dtype -> str dicts, and `torch.X if s == "..." else torch.Y`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            pairs = list(zip(node.keys, node.values))
            if any(isinstance(k, ast.Constant) and isinstance(k.value, str) and _is_torch_dtype(v) for k, v in pairs) \
                    or any(_is_torch_dtype(k) and isinstance(v, ast.Constant) for k, v in pairs if k is not None):
                found.append(node.lineno)
        if isinstance(node, ast.IfExp) and _is_torch_dtype(node.body) and _is_torch_dtype(node.orelse):
            compares_a_name = [n for n in ast.walk(node.test) if isinstance(n, ast.Compare) and any(
                isinstance(c, ast.Constant) and isinstance(c.value, str) for c in [n.left, *n.comparators])]
            if compares_a_name:
                found.append(node.lineno)
    return found


def test_one_name_to_dtype_map():
    offenders = {}
    for path, text in _sources():
        lines = dtype_maps(ast.parse(text))
        if lines and path.name != "precision.py":
            offenders[str(path.relative_to(ROOT))] = lines
    assert not offenders, f"string <-> dtype maps outside labkit/precision.py: {offenders}"


def test_the_dtype_map_scan_finds_maps():
    code = 'A = {"bf16": torch.bfloat16}\nB = {torch.float16: "fp16"}\nC = torch.float16 if n == "fp16" else torch.bfloat16\n'
    assert dtype_maps(ast.parse(code)) == [1, 2, 3]


# A (scaled) backward, unscale_ or scaler.step outside the one AMP step. Allowed: the step itself, the scaler
# that implements GradScaler's methods, and an exercise's deliberately wrong answer.
ALLOWED_AMP = {("precision.py", "backward"), ("precision.py", "update"), ("scaling.py", "step"),
               ("nb04.py", "_clip_before_unscale")}


def amp_step_sites(tree, filename):
    sites = []

    def visit(node, func):
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else func
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute):
                attr, target = child.func.attr, child.func.value
                scaled_backward = attr == "backward" and isinstance(target, ast.Call) \
                    and isinstance(target.func, ast.Attribute) and target.func.attr == "scale"
                scaler_call = attr in {"unscale_"} or (attr == "step" and isinstance(target, ast.Name)
                                                         and "scaler" in target.id)
                if (scaled_backward or scaler_call) and (filename, func) not in ALLOWED_AMP:
                    sites.append((filename, func, child.lineno))
            visit(child, name)

    visit(tree, None)
    return sites


# exercise modules whose debug graders write a step beside the learner's (a broken one and a reference)
DEBUG_GRADERS = {"nb03.py", "nb04.py"}


def test_the_amp_step_is_written_once():
    sites = []
    for path, text in _sources():
        if path.parent.name == "nbsrc":
            continue  # notebooks teach the step (and the learner writes it); labkit must not repeat it
        if path.parent.name == "cases" and path.parent.parent.name == "clinic":
            continue  # the clinic's broken runs: each writes its own (wrong) step, on purpose, for the learner to read
        if path.parent.name == "exercises" and path.name in DEBUG_GRADERS:
            continue  # debug exercises run the broken step and the fixed one, to grade the learner's fix
        sites += amp_step_sites(ast.parse(text), path.name)
    assert not sites, f"AMP step code outside labkit.precision: {sites}"


def test_the_amp_scan_finds_a_copy():
    code = "def f(scaler, opt, loss):\n    scaler.scale(loss).backward()\n    scaler.unscale_(opt)\n    scaler.step(opt)\n"
    assert [s[2] for s in amp_step_sites(ast.parse(code), "x.py")] == [2, 3, 4]
