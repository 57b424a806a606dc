"""labkit.widgets.BitExplorer: clicking a bit and typing a number update the shown value and bits."""

from __future__ import annotations

import math

import pytest

from labkit import formats as F
from labkit.widgets import BitExplorer, _parse_number


def shown_bits(ex: BitExplorer) -> str:
    return "".join(b.description for b in ex.buttons)


def test_click_a_bit_updates_value_label():
    ex = BitExplorer("fp16", 1.0)
    assert shown_bits(ex) == "0011110000000000" and ex.value_label.value == "fp16 0x3c00 = 1"
    ex.buttons[6].value = True  # the first mantissa bit: 1.5
    assert ex.value == 1.5 and ex.value_label.value == "fp16 0x3e00 = 1.5" and ex.number.value == "1.5"
    ex.buttons[0].value = True  # sign
    assert ex.value == -1.5


def test_type_a_number_updates_bits():
    ex = BitExplorer("bf16", 1.0)
    ex.number.value = "0.1"
    assert shown_bits(ex) == f"{F.encode(0.1, 'bf16'):016b}"
    ex.number.value = "2^-24"
    assert ex.value == 2**-24
    ex.number.value = "not a number"
    assert "Could not read" in ex.details.value and ex.value == 2**-24


def test_switch_format_keeps_value_rounded():
    ex = BitExplorer("fp32", 0.1)
    ex.format_picker.value = "e4m3fn"
    assert len(ex.buttons) == 8 and ex.value == F.round_to(0.1, "e4m3fn")
    ex.set_value(1000)
    assert math.isnan(ex.value)  # E4M3FN overflow, ml_dtypes rule


def test_repr_is_short_and_stable():
    ex = BitExplorer("fp16", 2.0)
    assert repr(ex) == "BitExplorer(format='fp16', bits=0x4000, value=2.0)"
    assert ex._repr_mimebundle_()["text/plain"] == repr(ex)


def test_bad_input():
    with pytest.raises(ValueError):
        BitExplorer("fp64")
    with pytest.raises(ValueError):
        BitExplorer("fp16").toggle_bit(16)
    assert _parse_number("-inf") == -math.inf and _parse_number("2**3") == 8
