"""labkit.check: ✓, hints, "not attempted yet", never raising on an answer; the registry is sound."""

from __future__ import annotations

import pytest

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
