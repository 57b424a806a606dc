"""labkit._validate: the shared checks behind the fuzz test's hostile values (issue 22, low items).

A repr for error messages that never raises and stays short, whole numbers in a range without an OverflowError,
and a refusal of sparse and meta tensors where dense code needs values.
"""

from __future__ import annotations

import math

import pytest
import torch

from labkit import _validate as V


def _deep_list(depth: int) -> list:
    x: list = []
    for _ in range(depth):
        x = [x]
    return x


class _BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr today")


def test_safe_repr_is_short_and_never_raises():
    deep = _deep_list(100_000)
    with pytest.raises(RecursionError):
        repr(deep)  # what an f"{x!r}" in an error message did
    assert V.safe_repr(deep) == "[[[[...]]]]"
    deep_dict: dict = {}
    for _ in range(100_000):
        deep_dict = {"x": deep_dict}
    assert V.safe_repr(deep_dict).startswith("{'x': {'x':")
    assert V.safe_repr(10**5000) == "<an int of 16610 bits>"  # repr() raises ValueError past 4,300 digits
    assert V.safe_repr(-(10**400)) == "<an int of 1329 bits>"
    assert V.safe_repr(2**64) == "18446744073709551616"
    assert V.safe_repr(_BadRepr()).startswith("<_BadRepr instance at 0x")  # reprlib's own fallback
    assert V.safe_repr("x" * 1000, limit=20) == "'" + "x" * 16 + "..."
    assert V.safe_repr(list(range(100))) == "[0, 1, 2, 3, 4, 5, ...]"
    assert V.safe_repr("fp16") == "'fp16'" and V.safe_repr(None) == "None" and V.safe_repr(1.5) == "1.5"
    for value in (deep, 10**5000, _BadRepr(), "y" * 10**6, torch.ones(1000, 1000)):
        assert len(V.safe_repr(value)) <= 160


def test_check_int_compares_and_never_converts():
    assert V.check_int("n", 5, 1, 10) == 5 and V.check_int("n", 10**400, 0) == 10**400
    for value, exc, match in [(True, TypeError, "n must be an int, got bool"), (1.0, TypeError, "got float"),
                              ("3", TypeError, "got str"), (0, ValueError, "n must be between 1 and 10, got 0"),
                              (10**400, ValueError, "between 1 and 10, got <an int of 1329 bits>"),
                              (-(2**64), ValueError, "n must be >= 1")]:
        with pytest.raises(exc, match=match):
            V.check_int("n", value, 1, 10 if value != -(2**64) else None)


@pytest.mark.filterwarnings("ignore:Sparse:UserWarning")  # torch's notes on sparse invariants and CSR's beta state
def test_check_dense_refuses_sparse_and_meta_tensors():
    t = torch.ones(3)
    assert V.check_dense("x", t) is t
    with pytest.raises(TypeError, match="x must be a dense tensor, got a sparse_coo one"):
        V.check_dense("x", torch.sparse_coo_tensor([[0, 2]], [1.0, 2.0], (3,)))
    with pytest.raises(TypeError, match="sparse_csr"):
        V.check_dense("x", torch.eye(3).to_sparse_csr())
    with pytest.raises(ValueError, match="x is a meta tensor"):
        V.check_dense("x", torch.empty(3, device="meta"))
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got list"):
        V.check_dense("x", [1.0])


def test_limits_are_what_their_documentation_says():
    assert V.MAX_MODEL_PARAMS * 4 == 80 * 10**9  # fp32 weights filling one 80 GB GPU
    assert V.MAX_WORLD_SIZE == 1_048_576 and V.MAX_DEPTH == 10_000 and V.MAX_PREDICTED_PARAMS == 10**15
    assert V.mlp_param_count(16, 256, 1, 3) == 17 * 256 + 2 * 257 * 256 + 257
    assert math.isclose(V.mlp_param_count(16, 65536, 1, 2) / 1e9, 4.296, rel_tol=1e-3)
