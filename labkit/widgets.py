"""Interactive widgets for the notebooks; ipywidgets is imported only when a widget is built.

Introduced in notebook 01.
"""

from __future__ import annotations

import html
import math
from typing import Any

from labkit import formats as F

__all__ = ["FIELD_COLORS", "BitExplorer", "bit_explorer"]

FIELD_COLORS = {"sign": "#ef9a9a", "exponent": "#a5d6a7", "mantissa": "#90caf9"}
EXPLORER_FORMATS = ("fp32", "tf32", "fp16", "bf16", "e4m3fn", "e5m2")
_ON_COLORS = {"sign": "#e53935", "exponent": "#43a047", "mantissa": "#1e88e5"}
# ToggleButton styles have no button_color, so the explorer colours its bits with a stylesheet: pale when the
# bit is 0, strong when it is 1 (JupyterLab marks a pressed ToggleButton with .mod-active).
EXPLORER_CSS = "<style>" + "".join(
    f".lk-bits .lk-bit.lk-{k} {{background-color: {FIELD_COLORS[k]}; color: #222;}}"
    f".lk-bits .lk-bit.lk-{k}.mod-active {{background-color: {_ON_COLORS[k]}; color: white; font-weight: bold;}}"
    for k in FIELD_COLORS) + "</style>"


def _parse_number(text: str) -> float:
    t = text.strip().lower().replace("−", "-")
    if t in {"inf", "+inf", "infinity"}:
        return math.inf
    if t in {"-inf", "-infinity"}:
        return -math.inf
    if t == "nan":
        return math.nan
    if t.startswith(("2^", "2**")):
        return 2.0 ** float(t.split("^" if "^" in t else "**", 1)[1].strip("()"))
    return float(t)


class BitExplorer:
    """Pick a format, click bits or type a number, and see sign/exponent/mantissa, the value and its ulp.

    The state lives in ``bits``; ``set_value``, ``set_bits`` and ``toggle_bit`` change it the same way
    the widget's buttons and text box do, so tests can drive it without a browser.
    Introduced in notebook 01.
    """

    def __init__(self, fmt: str = "fp16", value: float = 1.0) -> None:
        import ipywidgets as W

        self.fmt = F.get_format(fmt)
        if self.fmt.name not in EXPLORER_FORMATS:
            raise ValueError(f"the explorer shows {', '.join(EXPLORER_FORMATS)}; got {self.fmt.name}")
        self.bits = F.encode(value, self.fmt)
        self._busy = False
        self.format_picker = W.Dropdown(options=list(EXPLORER_FORMATS), value=self.fmt.name, description="format")
        self.number = W.Text(value=repr(float(value)), description="number", continuous_update=False,
                             placeholder="e.g. 0.1, 65504, 2^-24, inf")
        self.number.add_class("lk-number")
        self.value_label = W.Label()
        self.value_label.add_class("lk-value")
        self.details = W.HTML()
        self.details.add_class("lk-details")
        self.bit_box = W.HBox(layout=W.Layout(flex_flow="row wrap"))
        self.bit_box.add_class("lk-bits")
        self.format_picker.observe(self._on_format, names="value")
        self.number.observe(self._on_number, names="value")
        self.widget = W.VBox([W.HTML(EXPLORER_CSS), W.HBox([self.format_picker, self.number]), self.bit_box,
                              self.value_label, self.details])
        self._build_buttons()
        self._refresh()

    # --- state changes (used by the widgets' callbacks and by tests) ---
    def set_bits(self, bits: int) -> None:
        """Show the pattern ``bits`` of the current format."""
        F.decode(bits, self.fmt)  # validates
        self.bits = int(bits)
        self._refresh(update_number=True)

    def toggle_bit(self, position: int) -> None:
        """Flip bit ``position`` (0 = least significant), as clicking its button does."""
        if not 0 <= position < self.fmt.total_bits:
            raise ValueError(f"bit position must be in [0, {self.fmt.total_bits}), got {position}")
        self.set_bits(self.bits ^ (1 << position))

    def set_value(self, value: float) -> None:
        """Round ``value`` to the current format and show it, as typing it does."""
        self.bits = F.encode(value, self.fmt)
        self._refresh(update_number=False)

    def set_format(self, name: str) -> None:
        """Switch format, keeping the value (rounded to the new format)."""
        value = F.decode(self.bits, self.fmt)
        self.fmt = F.get_format(name)
        self.bits = F.encode(value, self.fmt)
        self._build_buttons()
        self._refresh(update_number=True)

    @property
    def value(self) -> float:
        """The value of the current bit pattern."""
        return float(F.decode(self.bits, self.fmt))

    # --- widget plumbing ---
    def _build_buttons(self) -> None:
        import ipywidgets as W

        f = self.fmt
        buttons = []
        for i in range(f.total_bits):
            pos = f.total_bits - 1 - i
            field = "sign" if i == 0 else ("exponent" if i <= f.exp_bits else "mantissa")
            b = W.ToggleButton(description="0", tooltip=f"{field} bit {pos}",
                               layout=W.Layout(width="26px", padding="0", margin="1px"))
            b.add_class("lk-bit")
            b.add_class(f"lk-{field}")
            b.observe(lambda change, pos=pos: self._on_click(pos, change), names="value")
            buttons.append(b)
        self.buttons = buttons
        self.bit_box.children = tuple(buttons)

    def _on_click(self, pos: int, change: dict) -> None:
        if not self._busy:
            self.toggle_bit(pos)

    def _on_format(self, change: dict) -> None:
        if not self._busy:
            self.set_format(change["new"])

    def _on_number(self, change: dict) -> None:
        if self._busy:
            return
        try:
            self.set_value(_parse_number(change["new"]))
        except (ValueError, OverflowError, ZeroDivisionError):
            self.details.value = f"<b>Could not read {html.escape(change['new'])!s} as a number.</b>"

    def _refresh(self, update_number: bool = False) -> None:
        f, fl = self.fmt, F.fields_from_bits(self.bits, self.fmt)
        self._busy = True
        try:
            for i, b in enumerate(self.buttons):
                on = bool(self.bits >> (f.total_bits - 1 - i) & 1)
                b.value, b.description = on, "1" if on else "0"
            if update_number:
                self.number.value = repr(fl.value)
            self.format_picker.value = f.name
        finally:
            self._busy = False
        self.value_label.value = f"{f.name} {self.bits:#0{2 + (f.total_bits + 3) // 4}x} = {F._fmt_exact(fl.value)}"
        self.details.value = self._details_html(fl)

    def _details_html(self, fl: F.Fields) -> str:
        f = self.fmt
        s, e, m = fl.bitstring.split("|")
        colored = "".join(f'<span style="background:{FIELD_COLORS[k]};padding:0 3px;font-family:monospace">'
                          f"{html.escape(v)}</span>" for k, v in zip(FIELD_COLORS, (s, e, m)))
        rows = [f"<b>{f.name}</b>: {f.description}", f"bits {colored} &nbsp; kind: <b>{fl.kind}</b>",
                f"value: {html.escape(fl.meaning)}"]
        if fl.kind not in ("nan",):
            below, v, above = F.neighbours(fl.value, f)
            rows.append(f"neighbours: {below!r} &lt; {v!r} &lt; {above!r}")
            if math.isfinite(v):
                rows.append(f"ulp here: {F.ulp(v, f)!r} (relative {F.ulp(v, f) / abs(v) if v else math.inf:.3g})")
        return "<br>".join(rows)

    def _repr_mimebundle_(self, **kwargs: Any) -> dict:
        bundle = self.widget._repr_mimebundle_(**kwargs)
        bundle["text/plain"] = repr(self)  # short and stable: nbval compares it
        return bundle

    def __repr__(self) -> str:
        return f"BitExplorer(format={self.fmt.name!r}, bits={self.bits:#x}, value={self.value!r})"


def bit_explorer(fmt: str = "fp16", value: float = 1.0) -> BitExplorer:
    """Build a :class:`BitExplorer` for ``fmt`` starting at ``value``. Introduced in notebook 01."""
    return BitExplorer(fmt, value)
