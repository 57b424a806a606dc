"""labkit.check: ✓, hints, "not attempted yet", never raising on an answer; the registry is sound."""

from __future__ import annotations

import contextlib
import io
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from needs import finishes

from labkit import check as C
from labkit.exercises import all_exercises, get_exercise


@pytest.fixture(autouse=True)
def _fresh_kernel(tmp_path, monkeypatch):
    """Each test starts like a fresh kernel (no results, hint levels at zero), with its own progress record."""
    monkeypatch.setenv(C.PROGRESS_ENV, str(tmp_path / "progress.json"))
    C.reset_results()
    C._PROGRESS_FAILED.clear()
    yield
    C.reset_results()
    C._PROGRESS_FAILED.clear()


def test_correct_wrong_and_not_attempted(capsys):
    C.check("01.fp16-max", 65504)
    C.check("01.fp16-max", 65000)
    C.check("01.fp16-max", ...)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("✓ 01.fp16-max")
    assert out[1].startswith("✗ 01.fp16-max") and "Hint:" in out[1]
    assert out[2].startswith("…") and "not attempted yet" in out[2]
    assert C.results()["01.fp16-max"] == "not attempted"


def test_never_raises_on_bad_answers(capsys):
    for bad in [None, "abc", object(), [1, 2], {"a": 1}, float("nan"), (1, 2, 3, 4), lambda: 1 / 0]:
        for ex in all_exercises():
            C.check(ex, bad)
    lines = capsys.readouterr().out.splitlines()
    # the third wrong answer to an exercise prints its worked solution, indented, below the ✗ line
    assert lines and all(line[:1] in ("✓", "✗", "…") or line.startswith("    ") or not line for line in lines)
    assert sum(line[:1] in ("✓", "✗", "…") for line in lines) == 8 * len(all_exercises())


def test_ellipsis_inside_containers_is_not_attempted():
    assert C.evaluate("01.fp16-fields", (1, ..., 256)).status == "not attempted"
    assert C.evaluate("00.bottlenecks", {"a": ...}).status == "not attempted"
    assert C.contains_ellipsis([[...]]) and not C.contains_ellipsis([1, (2, 3)])


def test_grader_exception_is_reported_not_raised(monkeypatch):
    # a grader that converts the answer, int("x"), raises on it (01.fp16-fields' grader did, before it said so)
    _exercise(monkeypatch, grade=lambda a: tuple(int(x) for x in a) == (1, 16, 256))
    v = C.evaluate("99.x", ("x", "y", "z"))
    assert v.status == "wrong" and "raised ValueError" in v.message


def test_unknown_id_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown exercise id '01.nope'.*01.fp16-max"):
        C.check("01.nope", 1)
    with pytest.raises(TypeError):
        get_exercise(1)


def test_registry_ids_are_well_formed():
    exs = all_exercises()
    assert len(exs) >= 8
    for ex_id, ex in exs.items():
        assert ex.id == ex_id and ex_id[:2].isdigit() and ex_id[2] == "." and ex.hint and ex.prompt


def _self_referential() -> list:
    a: list = []
    a.append(a)
    return a


def _nested(depth: int) -> list:
    outer = inner = []
    for _ in range(depth):
        inner.append([])
        inner = inner[0]
    return outer


class _RaisingIter(list):
    """A container whose ``__iter__`` raises (as a learner's half-written class might)."""

    def __iter__(self):
        raise RuntimeError("boom from __iter__")


HOSTILE = {"self-referential list": _self_referential, "list nested 5000 deep": lambda: _nested(5000),
           "container whose __iter__ raises": lambda: _RaisingIter([1, 2])}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
@pytest.mark.parametrize("ex_id", sorted(all_exercises()))
def test_check_never_raises_on_hostile_answers(ex_id, kind, capsys):
    C.check(ex_id, HOSTILE[kind]())
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0][0] in "✓✗…", out
    assert C.results()[ex_id] in {"correct", "wrong", "not attempted"}


def test_contains_ellipsis_is_iterative_and_bounded():
    loop = _self_referential()
    assert not C.contains_ellipsis(loop)
    loop.append(...)
    assert C.contains_ellipsis(loop)
    assert not C.contains_ellipsis(_nested(100_000))  # no RecursionError
    deep = _nested(10)
    deep_leaf = deep
    for _ in range(10):
        deep_leaf = deep_leaf[0]
    deep_leaf.append(...)
    assert C.contains_ellipsis(deep)
    assert C.contains_ellipsis({"a": {"b": ({...},)}}) and C.contains_ellipsis(frozenset({...}))
    with pytest.raises(RuntimeError, match="boom"):
        C.contains_ellipsis(_RaisingIter([1]))
    assert C.evaluate("01.fp16-max", _RaisingIter([1])).status == "wrong"


def test_grader_output_that_cannot_be_read_is_reported_not_raised(monkeypatch):
    from labkit.exercises import Exercise

    class Ambiguous:
        def __bool__(self):
            raise RuntimeError("truth value is ambiguous")

    odd = {"bad tuple": (1, 2, 3), "ambiguous truth": Ambiguous(), "exits": SystemExit(3)}
    for name, out in odd.items():
        def grade(answer, out=out):
            if isinstance(out, BaseException):
                raise out
            return out
        ex = Exercise(id="99.odd", prompt="p", grade=grade, hint="h")
        monkeypatch.setattr(C, "get_exercise", lambda _id, ex=ex: ex)
        v = C.evaluate("99.odd", 1)
        assert v.status == "wrong" and "raised" in v.message, (name, v)


_leaves = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=4),
                    st.just(...), st.binary(max_size=4))
_answers = st.recursive(
    _leaves,
    lambda kids: st.one_of(st.lists(kids, max_size=4), st.tuples(kids, kids),
                           st.dictionaries(st.text(max_size=2), kids, max_size=3),
                           st.frozensets(st.one_of(st.integers(), st.text(max_size=2), st.just(...)), max_size=3)),
    max_leaves=12)


def _has_ellipsis(x) -> bool:  # the plain recursive definition, fine for hypothesis' shallow values
    if x is Ellipsis:
        return True
    if isinstance(x, dict):
        return any(_has_ellipsis(v) for v in x.values())
    if isinstance(x, (list, tuple, set, frozenset)):
        return any(_has_ellipsis(v) for v in x)
    return False


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(answer=_answers, ex_id=st.sampled_from(sorted(all_exercises())))
def test_check_never_raises_on_random_nested_answers(answer, ex_id):
    C.reset_results()  # each example is a first answer (a third wrong one would print the worked solution)
    assert C.contains_ellipsis(answer) == _has_ellipsis(answer)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        C.check(ex_id, answer)
    line = buf.getvalue()
    assert line.count("\n") == 1 and line[0] in "✓✗…"
    if _has_ellipsis(answer):
        assert line.startswith("…")


# --- escalating hints, the typical mistake, solution() -------------------------------------------------------

def _exercise(monkeypatch, **fields):
    """Register a one-off exercise 99.x (answer 42) in place of the registry's lookup."""
    from labkit.exercises import Exercise

    base = dict(id="99.x", prompt="The answer.", grade=lambda a: (a == 42, ""), hint="the nudge",
                method="the method", solution="answer = 6 * 7", wrong=41, wrong_why="41 is the off-by-one answer.")
    ex = Exercise(**{**base, **fields})
    monkeypatch.setattr(C, "get_exercise", lambda _id: ex if _id == "99.x" else get_exercise(_id))
    return ex


def _checked(*answers) -> list[str]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        for a in answers:
            C.check("99.x", a)
    return buf.getvalue().split("✗ ")[1:] if "✓" not in buf.getvalue() else buf.getvalue().splitlines()


def test_hints_escalate_nudge_then_method_then_worked_solution(monkeypatch, capsys):
    _exercise(monkeypatch)
    for answer in (1, 2, 3, 4):
        C.check("99.x", answer)
    first, second, third, fourth = capsys.readouterr().out.split("✗ ")[1:]
    assert "Hint: the nudge" in first and "method" not in first and "6 * 7" not in first
    assert "Hint 2, the method: the method" in second and "nudge" not in second and "6 * 7" not in second
    assert "The worked solution:\n    answer = 6 * 7" in third
    assert fourth == third, "after the solution, the solution again"
    C.check("99.x", 42)
    assert capsys.readouterr().out == "✓ 99.x: correct.\n"
    C.reset_results()  # a new kernel starts at the nudge again
    C.check("99.x", 5)
    assert "Hint: the nudge" in capsys.readouterr().out


def test_each_exercise_escalates_on_its_own(monkeypatch, capsys):
    _exercise(monkeypatch)
    C.check("99.x", 1)
    C.check("01.fp16-max", 1.0)
    C.check("99.x", 2)
    out = capsys.readouterr().out
    assert f"Hint: {get_exercise('01.fp16-max').hint}" in out and "Hint 2, the method: the method" in out


def test_empty_fields_are_skipped_and_a_missing_solution_points_at_the_reference(monkeypatch, capsys):
    _exercise(monkeypatch, method="")
    C.check("99.x", 1)
    C.check("99.x", 2)
    assert "The worked solution:" in capsys.readouterr().out.split("✗ ")[2]
    C.reset_results()
    _exercise(monkeypatch, solution="")
    for a in (1, 2, 3):
        C.check("99.x", a)
    third = capsys.readouterr().out.split("✗ ")[3]
    assert "Hint 2, the method: the method" in third and "reference notebook" in third
    C.reset_results()
    _exercise(monkeypatch, method="", solution="")
    C.check("99.x", 1)
    C.check("99.x", 2)
    out = capsys.readouterr().out.split("✗ ")
    assert "Hint: the nudge" in out[1] and "Hint: the nudge" in out[2] and "reference notebook" in out[2]


def test_a_raising_answer_does_not_climb_the_ladder_and_is_not_recorded(monkeypatch, capsys):
    def grade(a):
        return a() == 42
    _exercise(monkeypatch, grade=grade, wrong=NOT_GIVEN_)
    C.check("99.x", lambda: 1 / 0)
    C.check("99.x", lambda: 1 / 0)
    C.check("99.x", lambda: 1)
    C.check("99.x", lambda: 1 / 0)
    C.check("99.x", lambda: 2)
    first, second, real, raised, real2 = capsys.readouterr().out.split("✗ ")[1:]
    assert "raised ZeroDivisionError" in first and "Hint: the nudge" in first
    assert "raised ZeroDivisionError" in second and "Hint: the nudge" in second and "method" not in second
    assert "Hint: the nudge" in real, "the first real wrong answer gets the nudge, as if nothing had raised"
    assert "raised ZeroDivisionError" in raised and "Hint: the nudge" in raised, "the help of the level reached"
    assert "Hint 2, the method" in real2
    assert C.load_progress()["99.x"]["attempts"] == 2, "only the real wrong answers are recorded"


def test_a_format_slip_does_not_climb_the_ladder_and_is_not_recorded(capsys, tmp_path):
    from labkit.exercises._core import FormatSlip

    fp16 = get_exercise("01.fp16-max")
    C.check("01.fp16-max", "65504?")
    C.check("01.fp16-max", True)
    assert not (tmp_path / "progress.json").exists(), "a slip of form is no attempt"
    assert C.results()["01.fp16-max"] == "not attempted"
    C.check("01.fp16-max", 1.0)
    C.check("01.fp16-max", "x")
    C.check("01.fp16-max", 2.0)
    text, boolean, first, slip, second = capsys.readouterr().out.split("✗ ")[1:]
    assert "Give the value as a number, not text" in text and "Not counted" in text and "Hint" not in text
    assert "not a bool" in boolean and "Not counted" in boolean
    assert f"Hint: {fp16.hint}" in first, "the first real wrong answer still gets the nudge"
    assert "Not counted" in slip and "Hint" not in slip
    assert f"Hint 2, the method: {fp16.method}" in second
    entry = C.load_progress()["01.fp16-max"]
    assert entry["attempts"] == 2 and entry["status"] == "wrong" and not entry.get("solution_seen")
    # the graders mark slips of form explicitly, and check keeps the mark through (ok, message)
    ok, msg = fp16.grade("abc")
    assert not ok and isinstance(msg, FormatSlip)
    assert isinstance(C._outcome((False, msg))[1], FormatSlip)
    v = C.evaluate("01.e4m3-overflow", 448.0)  # a prediction handed to check(): a slip of form too
    assert v.status == "wrong" and "Not counted" in v.message and "predict(" in v.message


# --- labkit's own answers, and predictions made after the result was shown -----------------------------------

def _own_line(out: str, ex_id: str) -> None:
    assert out.count("\n") == 1 and out.startswith(f"… {ex_id}: that is labkit's own answer"), out


def test_labkit_own_reference_answer_is_marked_not_graded(capsys, tmp_path):
    for ex_id in ("01.fp16-max", "01.fp16-fields", "05.choose-format", "00.device", "01.e4m3-overflow"):
        C.check(ex_id, get_exercise(ex_id).reference)  # a float, a tuple, a dict, a value computed when graded, a pair
        _own_line(capsys.readouterr().out, ex_id)
        assert C.results()[ex_id] == "not attempted"
        entry = C.load_progress()[ex_id]
        assert entry["solution_seen"] is True and entry["status"] == "not attempted" and "attempts" not in entry
    C.check("01.e4m3-overflow", (get_exercise("01.e4m3-overflow").reference[0], 448.0))  # its prediction, re-paired
    _own_line(capsys.readouterr().out, "01.e4m3-overflow")
    C.predict("01.e4m3-overflow", get_exercise("01.e4m3-overflow").reference[0])
    _own_line(capsys.readouterr().out, "01.e4m3-overflow")
    assert C.reveal("01.e4m3-overflow", 448.0).status == "not attempted", "nothing was recorded to reveal"
    capsys.readouterr()
    # the learner's own values pass, even where Python shares the object (a small int, a str)
    C.check("01.fp16-max", float("65504"))
    C.check("06.bytes-per-param", 12)
    C.check("07.optimise-first", "aten::addmm")
    assert [ln[:1] for ln in capsys.readouterr().out.splitlines()] == ["✓", "✓", "✓"]
    assert C.load_progress()["01.fp16-max"]["solved_after_solution"] is True


def test_labkit_own_functions_and_kernels_are_marked_however_wrapped(capsys):
    import functools

    from labkit.exercises import nb09

    ref = get_exercise("09.busbw").reference

    class Jitted:  # what @triton.jit returns: an object whose .fn is the function
        def __init__(self, fn):
            self.fn = fn

        def __call__(self, *a):
            raise TypeError("launch it as kernel[grid](...)")

    class Holder:
        def busbw(self, algbw, n):
            return ref(algbw, n)

    @functools.wraps(ref)
    def decorated(algbw, n):
        return ref(algbw, n)

    own = {"the function": ref, "a partial": functools.partial(ref), "a partial of a partial":
           functools.partial(functools.partial(ref)), "a kernel-like wrapper": Jitted(ref),
           "a decorated copy": decorated, "labkit's own helper": nb09.simulate_all_reduce,
           "a KernelRef": get_exercise("08.softmax").reference}
    for what, answer in own.items():
        C.check("08.softmax" if what == "a KernelRef" else "09.busbw", answer)
        out = capsys.readouterr().out
        assert out.startswith("… ") and "labkit's own answer" in out, (what, out)
    C.check("04.resume-scaler", get_exercise("04.resume-scaler").reference[::-1])  # a new tuple of labkit's functions
    assert "labkit's own answer" in capsys.readouterr().out
    assert C.results()["09.busbw"] == "not attempted"
    # the learner's own function passes, also wrapped in a bound method of the learner's class
    C.check("09.busbw", lambda algbw, n: algbw * 2 * (n - 1) / n)
    C.check("09.busbw", Jitted(lambda algbw, n: algbw * 2 * (n - 1) / n).fn)

    class Mine:
        def busbw(self, algbw, n):
            return algbw * 2 * (n - 1) / n

    C.check("09.busbw", Mine().busbw)
    assert [ln[:1] for ln in capsys.readouterr().out.splitlines()] == ["✓", "✓", "✓"]
    assert not C._labkit_own(Holder().busbw), "a method of the learner's class that calls labkit is the learner's"
    # evaluate() grades whatever it is given: the tests and instructors grade the reference answers with it
    assert C.evaluate("09.busbw", ref).status == "correct"


def test_labkit_own_triton_kernel_is_marked(capsys):
    pytest.importorskip("triton")
    from labkit import kernels

    kernels.setup()
    C.check("08.softmax", kernels.load().softmax_kernel)
    out = capsys.readouterr().out
    assert out.startswith("… 08.softmax: that is labkit's own answer") and out.count("\n") == 1, out
    assert C.load_progress()["08.softmax"]["solution_seen"] is True


def test_a_prediction_made_after_the_result_was_shown_is_not_counted(capsys):
    ex_id = "01.e4m3-overflow"
    C.predict(ex_id, 500.0)
    assert C.reveal(ex_id, 448.0).status == "wrong"
    C.predict(ex_id, 448.0)
    late = capsys.readouterr().out.splitlines()[-1]
    assert late.startswith(f"✎ {ex_id}: prediction recorded") and "after the result was shown" in late
    v = C.reveal(ex_id, 448.0)
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "recorded after the result was shown: not counted" in out and "✓" not in out
    assert v.status == "wrong" and C.results()[ex_id] == "wrong"
    entry = C.load_progress()[ex_id]
    assert entry["status"] == "wrong" and entry["attempts"] == 1 and "solved" not in entry
    # the other way round: a right first prediction stays right whatever comes after it
    C.reset_results()
    C.predict(ex_id, 448.0)
    assert C.reveal(ex_id, 448.0).status == "correct"
    C.reveal(ex_id, 448.0)  # the measuring cell run again, on the first prediction: graded again
    C.predict(ex_id, math.inf)
    assert C.reveal(ex_id, 448.0).status == "correct" and C.results()[ex_id] == "correct"
    assert "not counted" in capsys.readouterr().out.splitlines()[-1]
    assert C.load_progress()[ex_id]["attempts"] == 3, "the first kernel's one, then two reveals of the first prediction"
    # a new kernel knows nothing of the earlier reveal
    C.reset_results()
    C.predict(ex_id, 448.0)
    assert "Now run the next cell" in capsys.readouterr().out


@pytest.mark.parametrize("ex_id, slip, then", [
    ("05.bf16-vs-tf32", "8x", 8.0),                     # text where a number is asked
    ("01.e4m3-overflow", True, 448.0),                  # a bool
    ("11.allreduce-count", {"naive": 8}, {"naive": 8, "bucketed": 3, "ddp": 1}),  # keys missing
    ("10.stage2-grads", 3, "more"),                     # a number where a word is asked
    ("11.allreduce-count", {"naive": "8", "bucketed": 3, "ddp": 1}, {"naive": 8, "bucketed": 3, "ddp": 1}),  # text
    ("04.autocast-dtypes", {"linear": "banana", "softmax": "low", "layer_norm": "low", "exp": "low",
                            "cross_entropy": "low"}, {"linear": "low", "softmax": "fp32", "layer_norm": "fp32",
                                                      "exp": "fp32", "cross_entropy": "fp32"}),
    ("08.softmax-bytes", "4x", np.int64(4)),            # a numpy number is a number
])
def test_a_prediction_in_the_wrong_form_is_answered_before_any_result_is_shown(ex_id, slip, then, capsys):
    """A format slip in predict() was recorded, then reveal() answered it with a format message while the cell
    showed the measurement, and the corrected prediction still counted: a peek at the result for free. Now the
    slip is answered at predict(), nothing is recorded, and the corrected prediction is on time."""
    C.reset_results()
    ref_result = C.get_exercise(ex_id).reference[1]
    C.predict(ex_id, slip)
    out = capsys.readouterr().out
    assert out.startswith(f"… {ex_id}: ") and "Nothing recorded" in out, out
    if ex_id == "05.bf16-vs-tf32":  # (01's message lists the choices, 448.0 among them, as its prompt does)
        assert "7.9" not in out  # nothing of the result is told
    assert ex_id not in C._PREDICTIONS and C.results()[ex_id] == "not attempted"
    assert C.reveal(ex_id, ref_result).status == "not attempted"  # nothing predicted: nothing graded
    C.predict(ex_id, then)
    assert "Now run the next cell" in capsys.readouterr().out  # not "after the result was shown"


NOT_GIVEN_ = C.NOT_GIVEN


def test_the_typical_mistake_is_named(monkeypatch, capsys):
    _exercise(monkeypatch)
    C.check("99.x", 41)
    C.check("99.x", 40)
    typical, other = capsys.readouterr().out.split("✗ ")[1:]
    assert "41 is the off-by-one answer." in typical and "Hint: the nudge" in typical
    assert "off-by-one" not in other and "Hint 2" in other


@pytest.mark.parametrize(("wrong", "answer", "same"), [
    (65536.0, 65536, True), (65536.0, 65504, False), (2.0**-8, 2.0**-8 * (1 + 1e-12), True), (1, True, False),
    (True, True, True), ("Compute", " compute ", True), ("compute", "memory", False),
    ((1, 1, 256), [1, 1, 256], True), ((1, 1, 256), (1, 16, 256), False),
    ({"a": "compute", "b": 2}, {"b": 2.0, "a": "COMPUTE"}, True), ({"a": 1}, {"a": 1, "b": 2}, False),
    ({"x", "y"}, {"Y", "x"}, True), ({"x", "y"}, {"x"}, False), ({"x", "y"}, {"x", "x2"}, False),
    ("float16", "torch.float16", True), (float("nan"), float("nan"), True), (3, "3", False),
    ([1, [2, [3]]], [1, [2, [3]]], True),
])
def test_same_answer_compares_numbers_text_and_containers(wrong, answer, same):
    assert C._same_answer(answer, wrong) is same


def test_same_answer_handles_tensors_dtypes_functions_and_hostile_answers():
    import numpy as np
    import torch

    assert C._same_answer(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0]))
    assert not C._same_answer(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 3.0]))
    assert not C._same_answer(torch.ones(2), torch.ones(3)) and not C._same_answer([1.0, 2.0], torch.ones(2))
    assert C._same_answer(np.arange(3), np.arange(3)) and not C._same_answer(np.arange(3), np.arange(4))
    assert C._same_answer(torch.float16, "float16") and C._same_answer("bfloat16", torch.bfloat16)
    def f(x):
        return x
    assert not C._same_answer(f, f), "functions are the grader's to judge"
    for hostile in HOSTILE.values():
        for wrong in [(1, 2), [1], {"a": 1}, {1, 2}, 3.0, "x", torch.ones(2)]:
            assert C._same_answer(hostile(), wrong) in (True, False)

    class Weird:
        def __eq__(self, other):
            raise RuntimeError("no")

        __hash__ = object.__hash__

    assert C._same_answer(Weird(), Weird()) is False


def test_the_typical_mistake_of_a_prediction_is_its_prediction_part(monkeypatch):
    from labkit.exercises import Exercise

    ex = Exercise(id="99.p", prompt="p", grade=lambda pair: (pair[0] == pair[1], "compare"), hint="h", kind="predict",
                  reference=("B", "B"), wrong=("A", "B"), wrong_why="A is what people expect first.")
    assert C._typical(ex, ("A", "C")) and not C._typical(ex, ("C", "C")) and not C._typical(ex, "A")


def _typed(wrong):
    """The typical mistake as a learner would type it (a value computed when graded: its text)."""
    return str(wrong) if type(wrong).__module__ == "labkit.exercises.nb00" else wrong


def _a_value(wrong) -> bool:
    """Whether a typical mistake is a value (not a function, nor a tuple of functions: graders run those)."""
    parts = wrong if isinstance(wrong, (tuple, list)) else (wrong,)
    return wrong is not C.NOT_GIVEN and not any(callable(p) and not isinstance(p, type) for p in parts)


def test_registry_typical_mistakes_are_recognised():
    """Every exercise's typical mistake that a learner can type in as a value is recognised as that mistake
    (functions are judged by their graders, which run them and name the mistake)."""
    typed = {k: ex for k, ex in all_exercises().items() if _a_value(ex.wrong)}
    assert len(typed) >= 30
    missed = [k for k, ex in typed.items() if not C._typical(ex, _typed(ex.wrong))]
    assert not missed, missed
    wrong_answer = [k for k, ex in typed.items() if C._typical(ex, _typed(ex.reference))]
    assert not wrong_answer, f"the reference answer counted as the typical mistake: {wrong_answer}"


@pytest.mark.parametrize("ex_id", sorted(k for k, ex in all_exercises().items()
                                         if ex.kind in ("compute", "recall", "design") and ex.wrong_why.strip()
                                         and _a_value(ex.wrong)))
def test_registry_typical_mistakes_are_named(ex_id):
    """The typical mistake is answered with its wrong_why (the exercises whose graders are quick: the debug and
    implement exercises run code, and tests/test_exercises.py grades their mistakes already)."""
    ex = get_exercise(ex_id)
    v = C.evaluate(ex_id, _typed(ex.wrong))
    assert v.status == "wrong" and ex.wrong_why.strip() in v.message, v


def test_solution_on_request(monkeypatch, capsys, tmp_path):
    _exercise(monkeypatch)
    C.solution("99.x")
    out = capsys.readouterr().out
    assert out.startswith("99.x (The answer.) The worked solution:\n    answer = 6 * 7")
    _exercise(monkeypatch, solution="")
    C.solution("99.x")
    out = capsys.readouterr().out
    assert "No worked solution" in out and "Hint: the nudge" in out and "The method: the method" in out
    with pytest.raises(ValueError, match="unknown exercise id"):
        C.solution("01.nope")
    with pytest.raises(TypeError):
        C.solution(3)
    rec = C.load_progress()
    assert rec["99.x"]["solution_seen"] is True and rec["99.x"]["status"] == "not attempted"


# --- the progress record -------------------------------------------------------------------------------------

def test_check_records_progress_best_status_and_attempts(tmp_path, capsys):
    import json
    import stat

    path = tmp_path / "progress.json"
    C.check("01.fp16-max", ...)
    assert not path.exists(), "not attempted is no progress"
    C.check("01.fp16-max", 1.0)
    C.check("01.fp16-max", 65504)
    C.check("01.fp16-max", 2.0)   # a later wrong answer does not undo the ✓
    C.check("01.bf16-eps", 3.0)
    capsys.readouterr()
    doc = json.loads(path.read_text())
    assert doc["kind"] == "labkit-progress" and doc["format"] == 1
    fp16 = doc["exercises"]["01.fp16-max"]
    assert fp16["status"] == "correct" and fp16["attempts"] == 3 and fp16["solved"]
    assert doc["exercises"]["01.bf16-eps"]["status"] == "wrong"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not list(tmp_path.glob(".*.tmp")), "written atomically, no temporary left"
    assert C.load_progress(path) == doc["exercises"]


def test_a_recorded_history_never_changes_what_a_new_kernel_prints(monkeypatch, capsys):
    _exercise(monkeypatch)
    C.check("99.x", 1)
    C.check("99.x", 2)
    C.check("99.x", 3)
    capsys.readouterr()
    assert C.load_progress()["99.x"]["attempts"] == 3
    C.reset_results()  # a new kernel, same record: it starts at the nudge
    C.check("99.x", 4)
    out = capsys.readouterr().out
    assert "Hint: the nudge" in out and "worked solution" not in out


def test_where_the_record_lives(tmp_path, monkeypatch):
    from labkit.workspace import MARKER, PROGRESS_FILE

    monkeypatch.delenv(C.PROGRESS_ENV)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    other = tmp_path / "anywhere"
    other.mkdir()
    assert C.progress_path(other) == tmp_path / "state" / "labkit" / "progress.json"
    ws = tmp_path / "co" / "work"
    (ws / "sub").mkdir(parents=True)
    (ws / MARKER).write_text("{}")
    assert C.progress_path(ws) == ws / PROGRESS_FILE and C.progress_path(ws / "sub") == ws / PROGRESS_FILE
    ref = tmp_path / "co" / "notebooks"
    for d in (ref, tmp_path / "co" / "labkit" / "exercises", tmp_path / "co" / "tools" / "nbsrc"):
        d.mkdir(parents=True)
    assert C.progress_path(ref) is None, "the reference notebooks record nothing"
    for lang in ("zh", "ja"):  # any translated edition's language folder is reference notebooks too
        (ref / lang).mkdir()
        assert C.progress_path(ref / lang) is None, lang
    (ref / "zh" / "deeper").mkdir()
    assert C.progress_path(ref / "zh" / "deeper") is not None, "only notebooks/ and its language folders"
    monkeypatch.setenv(C.PROGRESS_ENV, str(tmp_path / "mine.json"))
    assert C.progress_path(ws) == tmp_path / "mine.json" and C.progress_path(ref) is None
    monkeypatch.setenv(C.PROGRESS_ENV, "off")
    assert C.progress_path(ws) is None
    with pytest.raises(TypeError):
        C.progress_path(3)


def test_record_in_a_workspace_and_per_user(tmp_path, monkeypatch, capsys):
    import stat

    from labkit.workspace import MARKER, PROGRESS_FILE

    monkeypatch.delenv(C.PROGRESS_ENV)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    ws = tmp_path / "work"
    ws.mkdir()
    (ws / MARKER).write_text("{}")
    monkeypatch.chdir(ws)
    C.check("01.fp16-max", 65504)
    assert C.load_progress(ws / PROGRESS_FILE)["01.fp16-max"]["status"] == "correct"
    monkeypatch.chdir(tmp_path)
    C.check("01.bf16-eps", 2.0**-7)
    user = tmp_path / "state" / "labkit" / "progress.json"
    assert list(C.load_progress(user)) == ["01.bf16-eps"]
    assert stat.S_IMODE(user.parent.stat().st_mode) == 0o700 and stat.S_IMODE(user.stat().st_mode) == 0o600
    ref = tmp_path / "co" / "notebooks"
    for d in (ref, tmp_path / "co" / "labkit" / "exercises", tmp_path / "co" / "tools" / "nbsrc"):
        d.mkdir(parents=True)
    monkeypatch.chdir(ref)
    before = user.read_bytes()
    C.check("01.e4m3-max", 448.0)
    assert user.read_bytes() == before and not list(ref.iterdir())
    C.progress()
    assert "record no progress" in capsys.readouterr().out


def test_a_foreign_or_unwritable_record_is_left_alone_and_said_once(tmp_path, monkeypatch, capsys):
    foreign = tmp_path / "package.json"
    foreign.write_text('{"name": "not mine"}')
    monkeypatch.setenv(C.PROGRESS_ENV, str(foreign))
    C.check("01.fp16-max", 65504)
    C.check("01.fp16-max", 1.0)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("✓") and lines[2].startswith("✗")
    assert "not saved" in lines[1] and sum("not saved" in ln for ln in lines) == 1
    assert foreign.read_text() == '{"name": "not mine"}'
    with pytest.raises(ValueError, match="not a labkit progress record"):
        C.load_progress(foreign)


def test_concurrent_kernels_lose_no_record(tmp_path):
    """Two kernels checking at the same moment (two notebooks open) both land in the record."""
    import subprocess
    import sys

    path = tmp_path / "progress.json"
    code = ("import sys; from labkit import check as C\n"
            "ids = sorted(C.all_exercises())[int(sys.argv[1])::2]\n"
            "for i in ids: C.check(i, C.get_exercise(i).reference)\n")  # graded, or marked labkit's: recorded
    env = {**__import__("os").environ, C.PROGRESS_ENV: str(path)}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(k)], env=env, stdout=subprocess.DEVNULL)
             for k in (0, 1)]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    assert set(C.load_progress(path)) == set(all_exercises())


def test_progress_view_and_command_line(tmp_path, capsys):
    import json
    import subprocess
    import sys

    C.check("01.fp16-max", 1.0)
    C.check("01.fp16-max", 65504)
    C.check("02.first-int", 1)
    capsys.readouterr()
    C.progress()
    out = capsys.readouterr().out
    assert f"recorded in {tmp_path / 'progress.json'}" in out
    line01 = next(ln for ln in out.splitlines() if ln.startswith("01 "))
    assert "1 of " in line01 and "✓ 01.fp16-max" in line01
    assert "✗ 02.first-int" in out and f"Solved 1 of {len(all_exercises())} exercises." in out
    cli = subprocess.run([sys.executable, "-m", "labkit", "progress", "--file", str(tmp_path / "progress.json")],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0 and "✓ 01.fp16-max" in cli.stdout, cli.stderr
    js = subprocess.run([sys.executable, "-m", "labkit", "progress", "--json"], capture_output=True, text=True,
                        timeout=120)
    assert json.loads(js.stdout)["exercises"]["01.fp16-max"]["status"] == "correct"
    (tmp_path / "bad.json").write_text("[]")
    bad = subprocess.run([sys.executable, "-m", "labkit", "progress", "--file", str(tmp_path / "bad.json")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "not a labkit progress record" in bad.stderr
    with pytest.raises(TypeError):
        C.format_progress({"01.fp16-max": "correct"})


def _record_text(entry: str) -> str:
    return '{"kind": "labkit-progress", "format": 1, "exercises": {"01.fp16-max": ' + entry + '}}'


DAMAGED = {
    "infinite attempts": lambda: _record_text('{"status": "wrong", "attempts": Infinity}'),
    "overflowing attempts": lambda: _record_text('{"status": "wrong", "attempts": 1e400}'),
    "a list as status": lambda: _record_text('{"status": ["correct"], "attempts": 1}'),
    "a string as attempts": lambda: _record_text('{"status": "wrong", "attempts": "many"}'),
    "200,000 deep": lambda: _record_text("[" * 200_000 + "]" * 200_000),
    "valid but 2 MB": lambda: _record_text('{"status": "wrong", "attempts": 1, "note": "' + "x" * (2 << 20) + '"}'),
}


@pytest.mark.parametrize("kind", list(DAMAGED))
def test_a_damaged_record_is_left_alone_said_once_and_never_breaks_check(kind, tmp_path, capsys):
    path = tmp_path / "progress.json"
    path.write_text(DAMAGED[kind]())
    before = path.read_bytes()
    finishes(lambda: [C.check("01.fp16-max", 65504), C.check("01.fp16-max", 1.0)], timeout=10)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("✓") and lines[-1].startswith("✗") and len(lines) == 3, lines
    assert "not saved" in lines[1] and ("left as it is" in lines[1] or "not touching it" in lines[1]), lines
    assert path.read_bytes() == before, "the record is never rewritten"
    with pytest.raises(ValueError, match=str(path)):
        C.load_progress(path)


def test_a_fifo_at_the_record_path_never_blocks(tmp_path, capsys):
    import os

    path = tmp_path / "progress.json"
    os.mkfifo(path)
    finishes(lambda: C.check("01.fp16-max", 65504), fifo=path)
    out = capsys.readouterr().out
    assert out.startswith("✓") and "not saved" in out and "not a regular file" in out
    with pytest.raises(ValueError, match="not a regular file"):
        finishes(lambda: C.load_progress(path), fifo=path)


def test_the_progress_command_reports_a_damaged_record_in_one_line(tmp_path):
    import subprocess
    import sys

    deep = tmp_path / "deep.json"
    deep.write_text(DAMAGED["200,000 deep"]())
    cli = subprocess.run([sys.executable, "-m", "labkit", "progress", "--file", str(deep)],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 2 and cli.stderr.count("\n") == 1 and "Traceback" not in cli.stderr, cli.stderr
    assert "nests deeper" in cli.stderr


@pytest.mark.parametrize(("ex_id", "answer", "said"), [
    ("13.lr-cause", "zz", "Answer with the letter of one cause"),
    ("13.lr-cause", 3, "Answer with the letter of one cause"),
    ("13.lr-fix", 0.2, "Give the fix as a dict"),
    ("13.lr-fix", {"lr": 0.2, "batch_per_rank": 16}, "Change exactly one setting"),
    ("13.lr-fix", {"lrr": 0.2}, "unknown setting 'lrr'"),
    ("13.lr-fix", {"lr": "0.2"}, "takes a float"),
])
def test_the_clinics_slips_of_form_run_nothing_and_do_not_climb(capsys, tmp_path, ex_id, answer, said):
    """An answer to a clinic exercise in the wrong form is told so, is not a wrong try, and no case runs for it."""
    v = C.evaluate(ex_id, answer)
    assert v.status == "wrong" and said in v.message and "Not counted" in v.message, v.message
    assert "Hint" not in v.message
    assert C.results().get(ex_id, "not attempted") == "not attempted"


def _fresh(value):
    """An equal value that is a new object (a learner's, not labkit's reference object)."""
    if isinstance(value, float):
        return float(repr(value))
    if isinstance(value, str):
        return "".join(list(value))
    if isinstance(value, (tuple, list, set, frozenset)):
        return type(value)(_fresh(v) for v in value)
    if isinstance(value, dict):
        return {_fresh(k): _fresh(v) for k, v in value.items()}
    return value


MEASURED = {"01.e4m3-overflow": 3.0, "02.fp16-weight": 3.0, "03.collapse": 3.0, "12.late-sbatch": (60, 2),
            "14.solve-precision": {"fp64", "fp32", "bf16"}, "13.lr-predict": "the same",
            "09.allreduce-count": 48, "10.stage2-grads": "equal",
            "11.allreduce-count": {"naive": 1, "overlap": 1, "bucketed": 1, "ddp": 1},
            "04.autocast-dtypes": {"linear": "fp32", "softmax": "low", "layer_norm": "low", "exp": "low",
                                   "cross_entropy": "low"},
            "05.bf16-vs-tf32": 3.0, "06.amp-saved": 3.0, "00.matmul-vs-add": "add",
            "07.launch-overhead": "2000 tiny adds", "08.softmax-bytes": 3.0, "17.outlier-spread": 31.0}
_CALLS = {"naive": 8, "overlap": 8, "bucketed": 3, "ddp": 1}
#: What rank 0 of each notebook's launch reports, as labkit.dist.launch records it (the launch-based measurements
#: read it; the stored notebooks, under nbval, check them against the real launches).
RECORDED = [
    ("labkit.recipes.ddp", 2, ("--accum", "4", "--precision", "fp16"), {"allreduce_calls": [12, 12]}),
    ("labkit.recipes.ddp", 2, ("--accum", "1", "--precision", "fp16"), {"allreduce_calls": [3, 3]}),  # a look-alike
    ("labkit.recipes.zero", 2, ("--runs", "2:bf16"), {"runs": [{"stage": 2, "offload": "none", "dtype": "bf16",
                                                               "n_params": 11,
                                                               "bytes_per_rank": [{"bytes": {"grads": 14}}] * 2}]}),
    ("labkit.recipes.zero", 2, ("--runs", "0:bf16"), {"runs": [{"stage": 0, "offload": "none", "dtype": "bf16"}]}),
    ("labkit.recipes.handpar", 2, ("--device", "cpu"),
     {"ddp": {"collectives": {k: {"all_reduce": {"calls": v}} for k, v in _CALLS.items()}}}),
]


@pytest.fixture()
def recorded_launches(monkeypatch):
    from labkit import dist

    monkeypatch.setattr(dist, "_RECENT", list(RECORDED))


def test_the_exercises_that_measure_themselves_are_the_ones_listed_here():
    from labkit.exercises import all_exercises

    have = {i for i, ex in all_exercises().items() if ex.measure is not None}
    assert have == set(MEASURED), have ^ set(MEASURED)
    assert all(all_exercises()[i].kind == "predict" for i in have)


@pytest.mark.parametrize("ex_id", sorted(MEASURED))
def test_reveal_grades_its_own_measurement_not_the_value_handed_to_it(capsys, tmp_path, recorded_launches, ex_id):
    """predict(…, right); reveal(…, something else): the verdict is on labkit's measurement (so a prediction cannot
    be made right by handing reveal the predicted value), and one line names the value that was handed in."""
    ex = get_exercise(ex_id)
    right_prediction, measured = ex.reference
    C.predict(ex_id, _fresh(right_prediction))  # the learner's own object, equal to labkit's
    v = C.reveal(ex_id, MEASURED[ex_id])
    out = capsys.readouterr().out
    assert v.status == "correct", out
    assert "the cell handed reveal()" in out and "the verdict uses the measurement" in out, out
    C.reset_results()
    wrong_prediction = _fresh(ex.wrong[0])
    C.predict(ex_id, wrong_prediction)
    v = C.reveal(ex_id, wrong_prediction)  # handing reveal the prediction does not make it right
    assert v.status == "wrong", capsys.readouterr().out


def test_before_its_launch_has_run_a_launch_based_reveal_grades_nothing(capsys, tmp_path, monkeypatch):
    """No launch, no measurement: reveal grades nothing (not the value handed in) and keeps the prediction."""
    from labkit import dist

    monkeypatch.setattr(dist, "_RECENT", [])
    C.predict("09.allreduce-count", 3.0)
    v = C.reveal("09.allreduce-count", 3)
    assert v.status == "not attempted" and "has not run in this kernel" in capsys.readouterr().out
    monkeypatch.setattr(dist, "_RECENT", list(RECORDED))
    assert C.reveal("09.allreduce-count", 3).status == "wrong", "the kept prediction is graded once it can be"


def test_a_measurement_that_fails_grades_nothing(capsys, tmp_path, monkeypatch):
    import dataclasses

    def broken():
        raise OSError("no such file")

    ex = dataclasses.replace(get_exercise("12.late-sbatch"), measure=broken)
    monkeypatch.setattr(C, "_predict_exercise", lambda exercise_id: ex)
    C.predict("12.late-sbatch", (30, None))
    v = C.reveal("12.late-sbatch", (30, None))
    assert v.status == "not attempted" and "could not repeat the experiment" in capsys.readouterr().out


def test_launch_records_what_rank_0_reported(tmp_path, monkeypatch):
    """labkit.dist.launch keeps a copy of the newest results, by module, ranks and arguments, for the measurements."""
    from labkit import dist

    monkeypatch.setattr(dist, "_RECENT", [])
    monkeypatch.setattr(dist, "_launch_or_replay", lambda *a, **k: {"n": len(dist._RECENT)})
    first = dist.launch("labkit.recipes.ddp", args=["--accum", "4"])
    dist.launch("labkit.recipes.ddp", args=["--steps", "2"])
    first["n"] = 99  # the cell's dict, edited: the record keeps what the ranks reported
    assert dist._last_result("labkit.recipes.ddp") == {"n": 1}
    assert dist._last_result("labkit.recipes.ddp", lambda n, argv, r: dist._has_option(argv, "--accum", "4")) == {"n": 0}
    assert dist._last_result("labkit.recipes.ddp", lambda n, argv, r: n == 3) is None
    assert dist._last_result("labkit.recipes.zero") is None
