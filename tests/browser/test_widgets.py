"""The notebooks' widgets, driven in a real browser: each check reads the text the learner sees.

Expected values come from numpy/ml_dtypes, not from labkit, so a wrong decode in labkit fails here too.
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

from labdriver import Lab, NotebookRun, notebook_by_number

pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
from playwright.sync_api import expect  # noqa: E402

LABEL = re.compile(r"^(?P<fmt>\w+) 0x(?P<hex>[0-9a-f]+) = (?P<value>\S+)$")
NP_DTYPES = {"fp16": (np.float16, np.uint16), "bf16": (ml_dtypes.bfloat16, np.uint16),
             "e4m3fn": (ml_dtypes.float8_e4m3fn, np.uint8), "e5m2": (ml_dtypes.float8_e5m2, np.uint8)}


def _notebook(number: str) -> str:
    name = notebook_by_number(number)
    if name is None:
        pytest.skip(f"notebook {number} has not landed yet")
    return name


def bits_of(x: float, fmt: str) -> int:
    """The bit pattern of ``x`` rounded to ``fmt`` (numpy / ml_dtypes cast, round to nearest even)."""
    dtype, utype = NP_DTYPES[fmt]
    return int(np.array(x, dtype=np.float64).astype(dtype).view(utype))


def value_of(bits: int, fmt: str) -> float:
    """The value of the pattern ``bits`` in ``fmt`` (numpy / ml_dtypes view)."""
    dtype, utype = NP_DTYPES[fmt]
    return float(np.array(bits, dtype=utype).view(dtype))


class Explorer:
    """The bit explorer's parts in the page: bit buttons, number box, format picker, value label."""

    def __init__(self, run: NotebookRun) -> None:
        self.root = run.code_cell_with("widgets.bit_explorer(").locator(".jp-OutputArea")
        self.bits = self.root.locator(".lk-bit")
        self.value = self.root.locator(".lk-value")
        self.number = self.root.locator(".lk-number input")
        self.picker = self.root.locator(".widget-dropdown select")

    def shows(self, fmt: str, bits: int, width: int) -> float:
        """Wait until the label shows ``fmt`` and ``bits``, check the buttons; return the shown value."""
        digits = (width + 3) // 4
        expect(self.value).to_have_text(re.compile(rf"^{fmt} 0x{bits:0{digits}x} = "))
        expect(self.bits).to_have_count(width)
        expect(self.bits).to_have_text(list(format(bits, f"0{width}b")))
        pressed = self.root.locator(".lk-bit.mod-active")
        expect(pressed).to_have_count(bin(bits).count("1"))
        match = LABEL.match(self.value.inner_text().strip())
        assert match, self.value.inner_text()
        return float(match["value"])


@pytest.mark.notebook("01")
def test_bit_explorer_clicks_and_typing(lab: Lab) -> None:
    """Clicking bits changes the decoded value correctly; typing a number sets the right bits."""
    run = lab.run_notebook(_notebook("01"))
    ex = Explorer(run)
    expect(ex.root.locator(".lk-bits")).to_be_visible()
    assert ex.shows("fp16", 0x3C00, 16) == 1.0

    # Click the sign bit, then the least significant mantissa bit.
    ex.root.locator(".lk-bit.lk-sign").click()
    assert ex.shows("fp16", 0xBC00, 16) == value_of(0xBC00, "fp16") == -1.0
    ex.bits.nth(15).click()
    assert ex.shows("fp16", 0xBC01, 16) == value_of(0xBC01, "fp16") == -1.0009765625
    # The top exponent bit of -1.0009765625 gives the all-ones exponent with a mantissa: NaN.
    ex.bits.nth(1).click()
    expect(ex.value).to_have_text(re.compile(r"^fp16 0xfc01 = (-)?nan$", re.I))
    ex.bits.nth(1).click()
    ex.bits.nth(0).click()
    assert ex.shows("fp16", 0x3C01, 16) == value_of(0x3C01, "fp16")

    # Type numbers (Enter commits): the bits follow, rounded to nearest even.
    for text, x in (("65504", 65504.0), ("0.1", 0.1), ("2^-24", 2.0**-24), ("-3.14159", -3.14159)):
        ex.number.fill(text)
        ex.number.press("Enter")
        want = bits_of(x, "fp16")
        assert ex.shows("fp16", want, 16) == value_of(want, "fp16")

    # Another format: bf16 keeps the value, rounded, with 8 exponent bits.
    ex.number.fill("0.1")
    ex.number.press("Enter")
    ex.shows("fp16", bits_of(0.1, "fp16"), 16)
    ex.picker.select_option("bf16")
    want = bits_of(0.1, "bf16")
    assert want == 0x3DCD
    assert ex.shows("bf16", want, 16) == value_of(want, "bf16")
    expect(ex.root.locator(".lk-bit.lk-exponent")).to_have_count(8)
    ex.bits.nth(15).click()
    assert ex.shows("bf16", want ^ 1, 16) == value_of(want ^ 1, "bf16")
