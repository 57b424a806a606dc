"""Every exercise's grader tells its reference answer (✓) from a typical mistake (✗) and names that mistake; every
exercise has its escalating help (hint, method, solution), a kind and a wrong_why; predict-then-run exercises
compare a prediction with a measurement, and debug exercises run the learner's fixed code, with the broken snippet
the notebook shows graded as the typical mistake; every notebook's stored solution output is ✓ for every check,
and every notebook has a predict exercise."""

from __future__ import annotations

import ast
import json
import math
import re
from pathlib import Path

import pytest
import torch

from labkit import check as C
from labkit.check import NOT_GIVEN, evaluate
from labkit.exercises import all_exercises
from labkit.exercises._core import FormatSlip
from labkit.student import solution_blocks, strip_solutions

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
EXERCISES = all_exercises()
IDS = sorted(EXERCISES)
CHECK = re.compile(r"""check\(\s*["']([^"']+)["']""")
PREDICT = re.compile(r"""predict\(\s*["']([^"']+)["']""")
REVEAL = re.compile(r"""reveal\(\s*["']([^"']+)["']""")
KINDS = {"compute", "implement", "design", "recall", "predict", "debug"}
# Function exercises whose correct answer legitimately returns None (it acts on its arguments); a
# stub that returns None is still told apart there, because a stub changes nothing.
RETURNS_NOTHING = {"04.amp-step", "03.scaler-step", "09.average-grads"}
# The notebooks this content covers (08, 11, 13 and 14 bring their own exercises).
MINE = ("00", "01", "02", "03", "04", "05", "06", "07", "09", "10", "12")
# The three exercises that repeated an earlier notebook's, replaced by new ones.
REPLACED = ("04.lost-update", "10.per-rank-bytes", "12.global-batch")


@pytest.fixture(autouse=True)
def _fresh_kernel(tmp_path, monkeypatch):
    """No hint levels, predictions or progress carried from one test to the next (or into the user's record)."""
    monkeypatch.setenv("LABKIT_PROGRESS", "off")
    C.reset_results()
    yield
    C.reset_results()


def _as_typed(value):
    """An answer as a learner would type it (labkit.exercises.nb00's grade-time values are their text)."""
    return str(value) if type(value).__module__ == "labkit.exercises.nb00" else value


def _message(out) -> str:
    return out[1] if isinstance(out, tuple) else ""


def _fresh(value):
    """``value`` as a learner would type it: an equal object, not the exercise's own (check refuses labkit's)."""
    if isinstance(value, float):
        return float(repr(value))
    if isinstance(value, (tuple, list, set, frozenset)):
        return type(value)(_fresh(v) for v in value)
    if isinstance(value, dict):
        return {k: _fresh(v) for k, v in value.items()}
    return value


# --------------------------------------------------------------------------------------------- every exercise

def test_registry_covers_every_notebook():
    numbers = {p.name[:2] for p in NOTEBOOKS}
    per_nb = {n: [i for i in IDS if i.startswith(n + ".")] for n in numbers}
    assert all(len(v) >= 3 for v in per_nb.values()), per_nb


#: notebook 11's exercises whose answers run on 2 ranks under torchrun
ON_RANKS = [i for i in IDS if getattr(EXERCISES[i].grade, "runs_on_ranks", None)]


@pytest.fixture(scope="module")
def nb11_batched():
    """Notebook 11's reference and typical wrong answers graded in one launch (labkit.exercises.nb11.prefetch):
    the tests then read the remembered verdicts, one torchrun start-up instead of one per answer."""
    from labkit.exercises import nb11

    pairs = [(i, getattr(EXERCISES[i], f)) for i in ON_RANKS for f in ("reference", "wrong")]
    return nb11.prefetch(pairs), len(pairs)


def test_nb11_answers_are_graded_in_one_launch(nb11_batched):
    remembered, asked = nb11_batched
    assert ON_RANKS and asked == 2 * len(ON_RANKS)
    assert remembered == asked, "the batch launch failed: every answer would be launched alone"


def test_nb11_prefetch_refuses_what_it_cannot_grade_and_runs_no_stub():
    from labkit.exercises import nb11

    def overlap_gradients(model):
        ...

    assert nb11.prefetch([(ON_RANKS[0], overlap_gradients)]) == 0  # a stub: not attempted, nothing launched
    assert nb11.prefetch([]) == 0
    with pytest.raises(ValueError, match="the ones run on ranks"):
        nb11.prefetch([("11.predict-nope", overlap_gradients)])
    with pytest.raises(TypeError):
        nb11.prefetch("11.gpipe")
    with pytest.raises(TypeError):
        nb11.prefetch([("11.gpipe",)])


@pytest.mark.parametrize("ex_id", IDS)
def test_reference_is_correct_and_wrong_is_wrong(ex_id, request):
    ex = EXERCISES[ex_id]
    if ex_id in ON_RANKS:
        request.getfixturevalue("nb11_batched")
    assert ex.reference is not NOT_GIVEN, f"{ex_id}: no reference answer"
    assert ex.wrong is not NOT_GIVEN, f"{ex_id}: no typical wrong answer"
    ok = evaluate(ex_id, ex.reference)
    assert ok.status == "correct", ok.message
    bad = evaluate(ex_id, ex.wrong)
    assert bad.status == "wrong", bad.message
    assert "Hint:" in bad.message and ex.hint in bad.message
    assert "raised" not in bad.message, f"{ex_id}: the typical mistake should be graded, not crash: {bad.message}"


@pytest.mark.parametrize("ex_id", IDS)
def test_every_exercise_has_escalating_help_a_kind_and_names_its_typical_mistake(ex_id):
    ex = EXERCISES[ex_id]
    assert ex.kind in KINDS, f"{ex_id}: kind {ex.kind!r}"
    for field in ("hint", "method", "solution", "wrong_why"):
        assert len(getattr(ex, field).strip()) >= 20, f"{ex_id}: {field} missing or too short"
    assert len({ex.hint, ex.method, ex.solution}) == 3, f"{ex_id}: hint, method and solution must differ"
    if not any(i.startswith(n + ".") for n in MINE for i in [ex_id]):
        return  # other notebooks' exercises: their authors hold them to their own rules
    # the grader itself recognises the typical mistake and explains it (not only labkit.check's equality test)
    out = ex.grade(_as_typed(ex.wrong))
    assert out is not None and not (out[0] if isinstance(out, tuple) else out), f"{ex_id}: wrong is not wrong"
    assert ex.wrong_why.strip() in _message(out), f"{ex_id}: the grader does not name the mistake: {out!r}"
    assert ex.wrong_why.strip() in evaluate(ex_id, ex.wrong).message


def _numbers_in(value) -> list[float]:
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, (tuple, list)):
        return [v for x in value for v in _numbers_in(x)]
    return []


@pytest.mark.parametrize("ex_id", [i for i in IDS if i.startswith(MINE)])
def test_the_first_hint_does_not_give_the_answer_away(ex_id):
    """The nudge names no number of the answer (the worked solution does); it is not the method either."""
    ex = EXERCISES[ex_id]
    answer = ex.reference[0] if ex.kind == "predict" else ex.reference
    words = re.findall(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?|2\^-?\d+", ex.hint)
    for value in _numbers_in(answer):
        if value in (0.0, 1.0, 2.0) or not math.isfinite(value):
            continue
        shown = {f"{value:g}", repr(value), str(int(value)) if value.is_integer() else ""} - {""}
        if value > 0 and math.log2(value).is_integer():
            shown.add(f"2^{int(math.log2(value))}")
        assert not shown & set(words), f"{ex_id}: the hint shows the answer {value:g}: {ex.hint!r}"
    if isinstance(answer, str) and len(answer) > 3:
        assert answer not in ex.hint, f"{ex_id}: the hint contains the answer"


# A single-number exercise: its answer must wait for the last level of help, the worked solution.
# 0, 1 and 2 stand in too many sentences to test for (06.smallest-stage's answer is 2): those are left out here, and
# the test below makes sure the list of them stays that short.
SINGLE_NUMBER = [i for i in IDS if isinstance(EXERCISES[i].reference, (int, float))
                 and not isinstance(EXERCISES[i].reference, bool) and float(EXERCISES[i].reference) not in (0, 1, 2)]


def test_few_single_number_answers_are_too_common_to_search_for():
    common = [i for i in IDS if isinstance(EXERCISES[i].reference, (int, float))
              and not isinstance(EXERCISES[i].reference, bool) and i not in SINGLE_NUMBER]
    assert len(SINGLE_NUMBER) >= 15 and common == ["06.smallest-stage"], common


def _renderings(value: float) -> set[str]:
    """The usual ways a text writes ``value``: 65504, 65,504, 6.55e+04, 6.5504e4, 2^-7, 2**-7, 0.17 ..."""
    v = float(value)
    out = {f"{v:g}", repr(v), f"{v:.2g}", f"{v:.3g}", f"{v:.4g}"}
    if v.is_integer():
        out |= {str(int(v)), f"{int(v):,}"}
    mantissa, exp = f"{v:e}".split("e")
    mantissa, exp = mantissa.rstrip("0").rstrip("."), int(exp)
    out |= {f"{mantissa}e{exp}", f"{mantissa}e{exp:+03d}", f"{mantissa}e{exp:+d}"}
    if v > 0 and math.log2(v).is_integer():
        k = int(math.log2(v))
        out |= {f"2^{k}", f"2**{k}", f"2^({k})", f"2.0**{k}"}
    return out


def _shows(text: str, value: float) -> list[str]:
    """The renderings of ``value`` that stand alone in ``text`` (not part of a longer number or word)."""
    return [r for r in _renderings(value)
            if re.search(rf"(?<![\w.^*]){re.escape(r)}(?![\w]|\.\d|\^|\*\*)", text)]


def _generic_wrong(ex) -> float:
    """A wrong number that is not the typical mistake and that the grader grades (not a slip of form)."""
    ref = ex.reference
    pool = ([ref * 3 + 1, ref + 3, ref * 7 + 3] if isinstance(ref, int)
            else [ref * 7.3 + 1, ref * 3.1, ref / 5.3, ref * 4096.5, ref / 4096.5])
    for cand in pool:
        out = ex.grade(cand)
        if cand != ex.wrong and not out[0] and not isinstance(out[1], FormatSlip):
            return cand
    raise AssertionError(f"{ex.id}: no generic wrong answer among {pool}")


@pytest.mark.parametrize("ex_id", SINGLE_NUMBER)
def test_the_number_waits_for_the_worked_solution(ex_id, capsys):
    """Naming a mistake must not name the answer: the reference number (in any usual writing) is in none of the
    hint, the method and the typical mistake's explanation, nor in what check prints for the first two wrong
    answers, the typical mistake and another wrong number, in either order. The worked solution may show it."""
    ex = EXERCISES[ex_id]
    value = float(ex.reference)
    for field in ("hint", "method", "wrong_why"):
        assert not _shows(getattr(ex, field), value), f"{ex_id}: the {field} shows the answer: {getattr(ex, field)!r}"
    other = _generic_wrong(ex)
    for answers in ((ex.wrong, other), (other, ex.wrong)):
        C.reset_results()
        for answer in answers:
            C.check(ex_id, answer)
        printed = capsys.readouterr().out
        assert printed.count("✗") == 2, printed
        assert not _shows(printed, value), f"{ex_id}: a wrong answer is told the answer ({answers}): {printed}"
    C.check(ex_id, ex.wrong)  # the third wrong answer gets the worked solution, which may show it
    assert "The worked solution" in capsys.readouterr().out


def _statements(code: str) -> set[str]:
    """The statements of a worked solution, comments cut, spaces and module prefixes (tl., torch.) dropped."""
    parts = {p.split("#")[0] for line in code.splitlines() for p in line.split(";")}
    return {n for n in (_squeezed(p) for p in parts) if len(n) >= 8}


def _squeezed(text: str) -> str:
    return re.sub(r"\b(?:tl|torch|dist|labkit|device)\.", "", re.sub(r"\s+", "", text))


def _called(text: str) -> set[str]:
    """The names of the functions ``text`` calls (the last part of a dotted name), of 5 letters or more."""
    return set(re.findall(r"(?<![\w])([A-Za-z_]\w{4,})\(", text)) | set(re.findall(r"\.([A-Za-z_]\w{4,})\(", text))


def _numbers(text: str) -> set[str]:
    """Powers of two (2^8, 2.0**14), numbers of three digits or more, decimals."""
    return set(re.findall(r"\d+(?:\.\d+)?\*\*-?\d+|2\^-?\d+|\b\d{3,}(?:\.\d+)?\b|\b\d+\.\d+\b", text))


# The method texts that said the solution itself before they were rewritten to say how to get there.
METHOD_REWRITTEN = ["00.autocast-dtype", "00.device", "02.first-int", "02.lost-update", "03.scaler-step",
                    "03.static-scale", "03.update-rule", "04.amp-step", "04.fp32-island", "04.resume-scaler",
                    "05.delayed-scale", "05.fp8-roundtrip", "05.fp8-scale", "06.kept-loss", "06.zero-per-gpu",
                    "08.bias-gelu", "08.flash-attention", "08.layernorm", "08.softmax", "08.softmax-bytes",
                    "09.busbw", "11.ddp-overlap", "11.gpipe", "11.tp-conjugates", "11.zero1-step", "12.srun-header",
                    "12.tunnel"]


@pytest.mark.parametrize("ex_id", sorted({"03.static-scale", "08.flash-attention", "11.zero1-step",
                                          *METHOD_REWRITTEN}))
def test_the_method_says_how_not_what(ex_id):
    """The second level of help is the way there, not the solution: the method holds none of the worked solution's
    statements, calls none of the functions the solution calls (unless the prompt or the hint named them), and
    writes none of its numbers that the prompt does not give."""
    ex = EXERCISES[ex_id]
    method, given = _squeezed(ex.method), ex.prompt + " " + ex.hint
    said = [st for st in _statements(ex.solution) if st in method]
    assert not said, f"{ex_id}: the method states the solution's {said}"
    calls = (_called(ex.solution) & _called(ex.method)) - _called(given)
    assert not calls, f"{ex_id}: the method calls what the solution calls: {sorted(calls)}"
    numbers = (_numbers(ex.solution) & _numbers(ex.method)) - _numbers(given)
    assert not numbers, f"{ex_id}: the method writes the solution's numbers {sorted(numbers)}"


@pytest.mark.parametrize("ex_id", [i for i in IDS if not C._shared(EXERCISES[i].reference)])
def test_checking_labkit_own_reference_is_marked_not_graded(ex_id, capsys):
    """check() of the exercise's own reference object (a learner's ``get_exercise(id).reference``) is not the
    learner's answer: one "…" line says so, the grader does not run, and the result is not correct."""
    ex = EXERCISES[ex_id]
    C.check(ex_id, ex.reference)
    out = capsys.readouterr().out
    assert out.startswith(f"… {ex_id}: that is labkit's own answer") and out.count("\n") == 1, out
    assert C.results()[ex_id] == "not attempted"
    if ex.kind == "predict" and not C._shared(ex.reference[0]):
        C.predict(ex_id, ex.reference[0])
        assert "labkit's own answer" in capsys.readouterr().out


@pytest.mark.parametrize("ex_id", IDS)
def test_ellipsis_is_not_attempted(ex_id):
    v = evaluate(ex_id, ...)
    assert v.status == "not attempted" and "not attempted yet" in v.message


@pytest.mark.parametrize("ex_id", [i for i in IDS if callable(EXERCISES[i].reference)])
def test_function_stub_is_not_attempted(ex_id):
    """A student's ``def f(...): ...`` returns None: that is "not attempted yet", not a wrong answer."""

    def stub(*args, **kwargs):
        ...

    assert evaluate(ex_id, stub).status == "not attempted"


@pytest.mark.parametrize("ex_id", [i for i in IDS if not callable(EXERCISES[i].reference)])
def test_a_value_exercise_rejects_a_function(ex_id):
    assert evaluate(ex_id, lambda *a: None).status in ("wrong", "not attempted")


def test_the_mix_of_kinds():
    kinds = {i: EXERCISES[i].kind for i in IDS if i.startswith(MINE)}
    per_nb = {n: [k for i, k in kinds.items() if i.startswith(n + ".")] for n in MINE}
    assert all("predict" in v for v in per_nb.values()), {n: v for n, v in per_nb.items() if "predict" not in v}
    assert sum(k == "debug" for k in kinds.values()) >= 8
    assert not set(REPLACED) & set(IDS), "the repeated exercises are replaced, not kept"
    print({n: sorted(v) for n, v in per_nb.items()})


# --------------------------------------------------------------------------------------- predict, then run

PREDICTS = [i for i in IDS if EXERCISES[i].kind == "predict"]


@pytest.mark.parametrize("ex_id", PREDICTS)
def test_predict_exercises_compare_a_prediction_with_a_result(ex_id, capsys, monkeypatch):
    from test_check import RECORDED  # what the notebooks' launches report, for the launch-based measurements

    from labkit import dist

    monkeypatch.setattr(dist, "_RECENT", list(RECORDED))
    ex = EXERCISES[ex_id]
    for pair_ in (ex.reference, ex.wrong):
        assert isinstance(pair_, tuple) and len(pair_) == 2, f"{ex_id}: reference/wrong are (prediction, result)"
    assert ex.reference[1] == ex.wrong[1] or ex.reference[1] is ex.wrong[1], "one measurement, two predictions"
    ok, why = ex.grade(ex.reference)
    assert ok and why, f"{ex_id}: a right prediction is confirmed with an explanation"
    # the learner's path: predict (the learner's own value, equal to the reference), then the next cell reveals
    C.predict(ex_id, _fresh(ex.reference[0]))
    assert C.reveal(ex_id, ex.reference[1]).status == "correct"
    C.reset_results()  # another kernel: a second prediction in this one would come after the result was shown
    C.predict(ex_id, _fresh(ex.wrong[0]))
    bad = C.reveal(ex_id, ex.wrong[1])
    assert bad.status == "wrong" and ex.wrong_why.strip() in bad.message
    # a student copy: the prediction still `...`, and reveal before any prediction
    C.reset_results()
    C.predict(ex_id, ...)
    assert C.reveal(ex_id, ex.reference[1]).status == "not attempted"
    out = capsys.readouterr().out
    assert out.count("not attempted yet") >= 2
    # handed to check() instead of predict/reveal: graded wrong with a message, not a crash
    misused = evaluate(ex_id, ex.reference[0])
    assert misused.status == "wrong" and "raised" not in misused.message


def test_predict_graders_compare_with_the_measurement_not_a_fixed_answer():
    """The same prediction is right for one measurement and wrong for another: the grader compares."""
    flipped = 0
    for ex_id in PREDICTS:
        ex = EXERCISES[ex_id]
        pred, result = ex.reference
        wrong_pred, _ = ex.wrong
        out = ex.grade((wrong_pred, wrong_pred if not isinstance(wrong_pred, dict) else dict(wrong_pred)))
        try:
            flipped += bool(out[0])
        except (TypeError, IndexError):
            pass
    assert flipped >= len(PREDICTS) // 2


# ------------------------------------------------------------------------------------------------- debug

# notebooks 08, 11, 13 and 14 grade their debug exercises their own way (a clinic case names a cause, then a fix)
DEBUGS = [i for i in IDS if EXERCISES[i].kind == "debug" and i.startswith(MINE)]


@pytest.mark.parametrize("ex_id", DEBUGS)
def test_debug_exercises_run_the_fixed_code(ex_id):
    """The reference and the typical mistake are code; the grader runs them on fresh inputs."""
    ex = EXERCISES[ex_id]
    refs = ex.reference if isinstance(ex.reference, tuple) else (ex.reference,)
    wrongs = ex.wrong if isinstance(ex.wrong, tuple) else (ex.wrong,)
    assert all(callable(f) for f in (*refs, *wrongs))
    calls = []

    def spy(f):
        def run(*a, **k):
            calls.append(f.__name__)
            return f(*a, **k)
        return run

    spied = tuple(spy(f) for f in refs)
    assert evaluate(ex_id, spied if len(spied) > 1 else spied[0]).status == "correct"
    assert calls, f"{ex_id}: the grader never ran the learner's code"


def _notebook_cells(number: str) -> list[dict]:
    (path,) = [p for p in NOTEBOOKS if p.name.startswith(number + "_")]
    return json.loads(path.read_text())["cells"]


def _snippet_namespace() -> dict:
    from labkit import device as dev_gate
    from labkit import memory, models, zero

    return {"torch": torch, "F": torch.nn.functional, "models": models, "mem": memory, "zero": zero,
            "FP16": dev_gate.computes(torch.float16, "cpu")}


@pytest.mark.parametrize("ex_id", DEBUGS)
def test_the_broken_snippet_the_notebook_shows_is_graded_as_the_typical_mistake(ex_id):
    """The notebook shows (and runs) a broken snippet; the exercise cell asks for the fixed function(s) by the same
    name. Run the notebook's own broken definitions through the grader: ✗, naming the mistake."""
    ex = EXERCISES[ex_id]
    cells = [("".join(c["source"]), c["cell_type"]) for c in _notebook_cells(ex_id[:2])]
    i, (src, _) = next((i, c) for i, c in enumerate(cells) if re.search(rf"""check\(\s*["']{re.escape(ex_id)}""", c[0]))
    names = [n.id for n in ast.walk(ast.parse(src.split("check(")[-1].rsplit(")", 1)[0] or "None"))
             if isinstance(n, ast.Name)] or re.findall(r"^def (\w+)", src, re.M)
    broken = next(s for s, t in reversed(cells[:i]) if t == "code" and not solution_blocks(s)
                  and all(re.search(rf"^def {n}\(", s, re.M) for n in names))
    defs = [node for node in ast.parse(broken).body if isinstance(node, ast.FunctionDef) and node.name in names]
    ns = _snippet_namespace()
    exec(compile(ast.Module(body=defs, type_ignores=[]), f"<{ex_id} snippet>", "exec"), ns)
    answer = tuple(ns[n] for n in names) if len(names) > 1 else ns[names[0]]
    v = evaluate(ex_id, answer)
    assert v.status == "wrong" and ex.wrong_why.strip() in v.message, (ex_id, v.message)
    # and the student copy of the exercise cell is a stub that reports "not attempted"
    prompt = strip_solutions(src)[0]
    assert "..." in prompt and "BEGIN SOLUTION" not in prompt


def test_tuple_of_stub_functions_is_not_attempted():
    def save(path, model, opt, scaler):
        ...

    def load(path, model, opt, scaler):
        ...

    assert evaluate("04.resume-scaler", (save, load)).status == "not attempted"


def test_simulated_all_reduce_sums_like_torch_distributed():
    from labkit.exercises.nb09 import simulate_all_reduce

    def plain_sum(params, world_size, all_reduce):
        for p in params:
            all_reduce(p.grad)

    out = simulate_all_reduce(plain_sum, [[torch.tensor([1.0, 2.0])], [torch.tensor([3.0, 6.0])],
                                          [torch.tensor([5.0, 1.0])]])
    assert [r[0].tolist() for r in out] == [[9.0, 9.0]] * 3

    def avg(params, world_size, all_reduce):
        for p in params:
            all_reduce(p.grad, op=torch.distributed.ReduceOp.AVG)

    assert [r[0].tolist() for r in simulate_all_reduce(avg, [[torch.ones(2)], [torch.zeros(2)]])] == [[0.5, 0.5]] * 2

    def boom(params, world_size, all_reduce):
        raise RuntimeError("rank failed")

    with pytest.raises(RuntimeError, match="rank failed"):
        simulate_all_reduce(boom, [[torch.ones(1)], [torch.ones(1)]])
    with pytest.raises(TypeError):
        simulate_all_reduce(3, [[torch.ones(1)]])
    with pytest.raises(ValueError):
        simulate_all_reduce(plain_sum, [[torch.ones(1)], [torch.ones(2)]])


# ------------------------------------------------------------------------------------ the stored notebooks

def _exercise_cells(path: Path) -> list[tuple[list[str], str, str]]:
    """(ids, printed output, which) for every cell that checks, predicts or reveals an exercise."""
    out = []
    for c in json.loads(path.read_text())["cells"]:
        src = "".join(c["source"])
        if c["cell_type"] != "code":
            continue
        printed = "".join("".join(o.get("text", "")) for o in c.get("outputs", []) if o.get("output_type") == "stream")
        if "check(" in src and solution_blocks(src):
            out.append((CHECK.findall(src), printed, "check"))
        if PREDICT.search(src):
            out.append((PREDICT.findall(src), printed, "predict"))
        if REVEAL.search(src):
            out.append((REVEAL.findall(src), printed, "reveal"))
    return out


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_solutions_are_graded_correct(path):
    """The instructor notebook's solution passed its check when it was stored: labkit's grader and the
    notebook's solution agree, as the reference answer does; predictions were recorded, then revealed ✓."""
    cells = _exercise_cells(path)
    assert cells, f"{path.name}: no exercise cell"
    for ids, printed, which in cells:
        for ex_id in ids:
            assert ex_id in EXERCISES, f"{path.name}: unregistered id {ex_id}"
            if which == "predict":
                assert f"✎ {ex_id}: prediction recorded" in printed, f"{path.name}: {ex_id} {printed!r}"
            else:
                assert f"✓ {ex_id}: correct." in printed, f"{path.name}: stored output of {ex_id} is not ✓: {printed!r}"
        assert "✗" not in printed and "not attempted" not in printed


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.name[:2] in MINE], ids=lambda p: p.name)
def test_predict_comes_before_the_cell_that_reveals(path):
    """The prediction cell (the learner's, with a solution block) comes first; the cell that measures and reveals
    is a teaching cell whose stored output the workspace clears (tag workspace-clear), so the learner's copy does
    not show the result before the prediction."""
    from labkit.workspace import CLEAR_TAG

    cells = json.loads(path.read_text())["cells"]
    predicted = {}
    for i, c in enumerate(cells):
        src = "".join(c["source"])
        for ex_id in PREDICT.findall(src):
            assert solution_blocks(src), f"{path.name}: the prediction of {ex_id} is the learner's to fill in"
            assert EXERCISES[ex_id].kind == "predict"
            predicted[ex_id] = i
        for ex_id in REVEAL.findall(src):
            assert ex_id in predicted and predicted[ex_id] < i, f"{path.name}: {ex_id} revealed before predicted"
            assert not solution_blocks(src), f"{path.name}: the measurement of {ex_id} is no solution"
            assert CLEAR_TAG in c["metadata"].get("tags", []), f"{path.name}: {ex_id}'s result shows in the workspace"
    assert predicted, f"{path.name}: no predict-then-run exercise"


def test_every_registered_exercise_is_used_by_its_notebook():
    used = {i for p in NOTEBOOKS for ids, _, _ in _exercise_cells(p) for i in ids}
    assert set(IDS) == used, f"registered but not in a notebook: {sorted(set(IDS) - used)}"
