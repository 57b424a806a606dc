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


# --- the microscaling formats (notebook 17): E8M0, FP6 E2M3/E3M2, FP4 E2M1 --------------------------------
# Expected values come from ml_dtypes, not from labkit.

ML_DTYPES = {"e8m0fnu": "float8_e8m0fnu", "e2m3fn": "float6_e2m3fn", "e3m2fn": "float6_e3m2fn",
             "e2m1fn": "float4_e2m1fn"}


def ml_value(bits: int, fmt: str) -> float:
    import ml_dtypes
    import numpy as np

    return float(np.array([bits], np.uint8).view(getattr(ml_dtypes, ML_DTYPES[fmt]))[0])


def same(a: float, b: float) -> bool:
    """Equal as floats, NaN equal to NaN, and the sign of zero counted."""
    return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))


def click_to(ex: BitExplorer, bits: int) -> None:
    """Reach ``bits`` from the current pattern by clicking the buttons of the bits that differ."""
    width = ex.fmt.total_bits
    for i, button in enumerate(ex.buttons):
        if (ex.bits ^ bits) >> (width - 1 - i) & 1:
            button.value = not button.value


def test_the_explorer_offers_the_microscaling_formats():
    ex = BitExplorer("fp16", 1.0)
    assert set(F.MICROSCALING_FORMATS) <= set(ex.format_picker.options)
    for name in F.MICROSCALING_FORMATS:
        ex.format_picker.value = name
        assert ex.fmt.name == name and len(ex.buttons) == ex.fmt.total_bits and ex.value == 1.0


def test_fp4_every_pattern_round_trips_through_the_bit_toggles():
    values = []
    for bits in range(16):
        ex = BitExplorer("e2m1fn", 0.0)
        assert ex.bits == 0 and len(ex.buttons) == 4
        click_to(ex, bits)
        want = ml_value(bits, "e2m1fn")
        assert ex.bits == bits and shown_bits(ex) == f"{bits:04b}", bits
        assert same(ex.value, want), (bits, ex.value, want)
        assert ex.value_label.value.startswith(f"e2m1fn {bits:#03x} = ")
        assert same(float(ex.number.value), want)  # the number box follows the clicks
        ex.set_value(0.25 if bits else 1.0)  # move away, then type the value back: the same pattern
        ex.set_value(want)
        assert ex.bits == bits and not ex.note
        values.append(want)
    assert values == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
    assert [b.tooltip for b in BitExplorer("e2m1fn").buttons] == [
        "sign bit 3", "exponent bit 2", "exponent bit 1", "mantissa bit 0"]


def test_e8m0_has_no_sign_field_and_no_zero():
    ex = BitExplorer("e8m0fnu", 1.0)
    assert len(ex.buttons) == 8 and all("lk-exponent" in b._dom_classes for b in ex.buttons)
    assert not any("lk-sign" in b._dom_classes or "lk-mantissa" in b._dom_classes for b in ex.buttons)
    assert 'title="sign"' not in ex.details.value and 'title="mantissa"' not in ex.details.value
    assert ex.bits == 0x7F and ex.value == 1.0 == ml_value(0x7F, "e8m0fnu")
    assert ex.value_label.value == "e8m0fnu 0x7f = 1" and "2^(127-127) = 1" in ex.details.value
    click_to(ex, 0xFF)
    assert math.isnan(ex.value) and math.isnan(ml_value(0xFF, "e8m0fnu"))
    assert ex.value_label.value == "e8m0fnu 0xff = nan"
    for bits in range(256):  # every pattern, through the clicks
        click_to(ex, bits)
        assert ex.bits == bits and same(ex.value, ml_value(bits, "e8m0fnu")), bits
    # 0 and negative numbers have no pattern: NaN, as ml_dtypes, and the panel says why (no exception)
    for typed, why in (("0", "has no zero"), ("-0.0", "has no zero"), ("-2", "no negative numbers"),
                       ("-inf", "no negative numbers"), ("inf", "largest value 2^127"),
                       ("1e-50", "rounds up")):
        ex.set_bits(0x7F)
        ex.number.value = typed
        assert why in ex.note and why in ex.details.value and "Could not read" not in ex.details.value, typed
        assert ex.bits == (0x00 if typed == "1e-50" else 0xFF)
        assert same(ex.value, ml_value(ex.bits, "e8m0fnu")), typed
    ex.set_value(3.0)  # a tie between 2 and 4 rounds up (to even on the significand 1.1b)
    assert ex.value == 4.0 and not ex.note


@pytest.mark.parametrize(("fmt", "top"), [("e2m3fn", 7.5), ("e3m2fn", 28.0)])
def test_fp6_max_is_reachable_by_clicks_and_saturates(fmt, top):
    ex = BitExplorer(fmt, 0.0)
    click_to(ex, 0b011111)
    assert ex.value == top == ml_value(0b011111, fmt) and ex.value_label.value == f"{fmt} 0x1f = {top:g}"
    assert "None" in ex.details.value  # nothing above max
    for bits in range(64):
        click_to(ex, bits)
        assert same(ex.value, ml_value(bits, fmt)), (fmt, bits)
    ex.number.value = "1000"
    assert ex.value == top and "saturates" in ex.note
    ex.number.value = "-inf"
    assert ex.value == -top and "saturates" in ex.note


def test_nan_where_a_format_has_none():
    ex = BitExplorer("e2m1fn", 1.5)
    ex.number.value = "nan"  # FP4 has no NaN: the bits stay, the panel says why
    assert ex.value == 1.5 and "has no NaN" in ex.details.value
    ex = BitExplorer("fp16", math.nan)
    ex.format_picker.value = "e3m2fn"
    assert ex.value == 0.0 and "has no NaN" in ex.note and "showing 0" in ex.note
    assert BitExplorer("e2m3fn", math.nan).value == 0.0
    ex.format_picker.value = "e8m0fnu"  # 0 in E8M0: NaN
    assert math.isnan(ex.value) and "has no zero" in ex.note


def test_overflow_notes_tell_rounding_from_overflow():
    ex = BitExplorer("fp16", 1.0)
    ex.set_value(65519)
    assert ex.value == 65504 and not ex.note  # rounds down to max: no overflow
    ex.set_value(65520)
    assert ex.value == math.inf and "becomes inf" in ex.note
    ex.format_picker.value = "e4m3fn"
    ex.set_value(464)
    assert ex.value == 448 and not ex.note
    ex.set_value(500)
    assert math.isnan(ex.value) and "becomes NaN" in ex.note
    ex.set_bits(0x38)
    assert not ex.note and "<b>beyond" not in ex.details.value


def test_a_format_switch_closes_the_old_buttons():
    """Else their models pile up in the kernel and in the notebook's saved widget state."""
    ex = BitExplorer("fp16", 1.0)
    old = ex.buttons
    ex.format_picker.value = "e8m0fnu"
    assert all(b.comm is None and b.layout.comm is None and b.style.comm is None for b in old)
    assert all(b.comm is not None for b in ex.buttons) and ex.bit_box.children == tuple(ex.buttons)
    ex.buttons[0].value = True  # the new buttons work: 0x7F (1.0) with its top bit set is 0xFF, NaN
    assert ex.bits == 0xFF and math.isnan(ex.value)


def test_set_value_from_code_shows_the_value_held_in_the_number_box():
    ex = BitExplorer("fp16", 1.0)
    ex.set_value(65520)                     # rounds to inf in fp16: the box must not keep 1.0 (or show nan)
    assert ex.number.value == "inf" and ex.value_label.value.endswith("= inf")
    ex.number.value = "0.1"                 # typed: the learner's text stays
    assert ex.number.value == "0.1" and ex.bits == 0x2E66
