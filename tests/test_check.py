"""labkit.check: ✓, hints, "not attempted yet", never raising on an answer; the registry is sound."""

from __future__ import annotations

import contextlib
import io

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from labkit import check as C
from labkit.exercises import all_exercises, get_exercise


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
    assert lines and all(line[0] in "✓✗…" for line in lines)


def test_ellipsis_inside_containers_is_not_attempted():
    assert C.evaluate("01.fp16-fields", (1, ..., 256)).status == "not attempted"
    assert C.evaluate("00.bottlenecks", {"a": ...}).status == "not attempted"
    assert C.contains_ellipsis([[...]]) and not C.contains_ellipsis([1, (2, 3)])


def test_grader_exception_is_reported_not_raised():
    v = C.evaluate("01.fp16-fields", ("x", "y", "z"))
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
    assert C.contains_ellipsis(answer) == _has_ellipsis(answer)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        C.check(ex_id, answer)
    line = buf.getvalue()
    assert line.count("\n") == 1 and line[0] in "✓✗…"
    if _has_ellipsis(answer):
        assert line.startswith("…")
