"""Interactive widgets for the notebooks; ipywidgets is imported only when a widget is built.

Introduced in notebook 01.
"""

from __future__ import annotations

import dataclasses
import html
import math
from typing import Any

import numpy as np

from labkit import formats as F
from labkit import memory as M
from labkit._validate import MAX_PREDICTED_PARAMS, MAX_WORLD_SIZE, safe_repr
from labkit.i18n import gettext as _

__all__ = ["FIELD_COLORS", "BitExplorer", "bit_explorer", "memory_calculator", "memory_calculator_report"]

FIELD_COLORS = {"sign": "#ef9a9a", "exponent": "#a5d6a7", "mantissa": "#90caf9"}
#: The most GPUs per node and GB per GPU :func:`memory_calculator_report` takes (see its docstring).
MAX_GPUS_PER_NODE = 1024
MAX_GPU_GB = 10_000
#: The explorer's formats: notebook 01's, then notebook 17's microscaling scale (E8M0) and elements (FP6, FP4).
EXPLORER_FORMATS = ("fp32", "tf32", "fp16", "bf16", "e4m3fn", "e5m2", *F.MICROSCALING_FORMATS)
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


def _field_names(f: F.FloatFormat) -> list[str]:
    """The fields ``f`` has, most significant first: E8M0 has no sign and no mantissa, only an exponent."""
    return (["sign"] if f.signed else []) + ["exponent"] + (["mantissa"] if f.man_bits else [])


def _bit_field(f: F.FloatFormat, i: int) -> str:
    """The field of bit ``i`` of ``f``, counted from the most significant bit (0)."""
    if f.signed and i == 0:
        return "sign"
    return "exponent" if i < int(f.signed) + f.exp_bits else "mantissa"


def _round_unbounded(value: float, f: F.FloatFormat) -> float:
    """``value`` rounded to ``f``'s mantissa, with an exponent that cannot overflow: tells overflow from rounding."""
    wide = dataclasses.replace(f, name=f"{f.name}-wide", exp_bits=max(f.exp_bits, 12), nan_style="ieee",
                               overflow="inf", signed=True)
    return F.round_to(value, wide)


def _encode_note(value: float, f: F.FloatFormat) -> tuple[int | None, str]:
    """The pattern ``value`` rounds to in ``f`` (None if it has none), and what the learner should be told.

    The note says why a value did not land where one might expect: E8M0 has no zero, no negative numbers
    and nothing below 2^-127; FP6 and FP4 have no NaN (None: no pattern) and saturate past their max.
    """
    if not f.has_nan and isinstance(value, (float, np.floating)) and math.isnan(value):
        return None, _("{name} has no NaN: every one of its {count} patterns is a number, so NaN cannot be stored "
                       "(ml_dtypes' cast writes -0, labkit refuses)").format(name=f.name, count=1 << f.total_bits)
    bits = F.encode(value, f)  # TypeError for anything but a real number
    x = _as_shown(value)
    if not f.signed and not math.isnan(x):
        if x == 0:
            return bits, _("{name} has no zero (no sign, no mantissa: every pattern is 2^(E-{bias})): 0 has no "
                           "pattern and becomes NaN, {nan:#x}, as in ml_dtypes").format(
                name=f.name, bias=f.bias, nan=f.nan_bits)
        if x < 0:
            return bits, _("{name} has no sign bit, so no negative numbers: {value!r} becomes NaN, {nan:#x}, as in "
                           "ml_dtypes").format(name=f.name, value=x, nan=f.nan_bits)
        if x < f.smallest_normal:
            return bits, _("{name} has nothing below 2^{emin} (and no zero): {value!r} rounds up to 2^{emin}").format(
                name=f.name, emin=f.emin, value=x)
    if (math.isfinite(x) and abs(_round_unbounded(value, f)) > f.max) or (math.isinf(x) and not f.has_inf):
        sign = "-" if x < 0 else ""
        if f.overflow == "saturate":
            outcome = _("{value} (it saturates: {name} has no inf)").format(value=f"{sign}{F._fmt_exact(f.max)}",
                                                                         name=f.name)
        else:
            outcome = {"inf": f"{sign}inf", "nan": "NaN"}[f.overflow]
        top = f"2^{f.emax}" if not f.man_bits else F._fmt_exact(f.max)
        return bits, _("beyond {name}'s largest value {top}: {value!r} becomes {outcome}").format(
            name=f.name, top=top, value=x, outcome=outcome)
    return bits, ""


def _as_shown(value: float) -> float:
    """``float(value)``; an int beyond a float's range (10**400) is shown as the inf it encodes to."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


class BitExplorer:
    """Pick a format, click bits or type a number, and see sign/exponent/mantissa, the value and its ulp.

    The formats are ``EXPLORER_FORMATS``: FP32 to FP8, and the microscaling formats E8M0, FP6 and FP4.
    Only the fields a format has get buttons (E8M0: eight exponent bits, no sign, no mantissa). A value
    the format cannot hold as typed (0 or a negative number in E8M0, NaN in FP6/FP4, an overflow) is
    explained in ``note``, shown at the top of the panel. The state lives in ``bits``; ``set_value``,
    ``set_bits`` and ``toggle_bit`` change it the same way the widget's buttons and text box do, so tests
    can drive it without a browser.
    Introduced in notebook 01.
    """

    def __init__(self, fmt: str = "fp16", value: float = 1.0) -> None:
        import ipywidgets as W

        self.fmt = F.get_format(fmt)
        if self.fmt.name not in EXPLORER_FORMATS:
            raise ValueError(f"the explorer shows {', '.join(EXPLORER_FORMATS)}; got {self.fmt.name}")
        bits, self.note = _encode_note(value, self.fmt)
        if bits is None:  # NaN in FP6/FP4, which have none: start at 0, and say so
            bits, self.note = 0, _("{note}; showing 0 instead").format(note=self.note)
        self.bits = bits
        self._busy = False
        self.format_picker = W.Dropdown(options=list(EXPLORER_FORMATS), value=self.fmt.name, description="format")
        self.number = W.Text(value=repr(_as_shown(value)), description="number", continuous_update=False,
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
        self.note = ""
        self._refresh(update_number=True)

    def toggle_bit(self, position: int) -> None:
        """Flip bit ``position`` (0 = least significant), as clicking its button does."""
        if not 0 <= position < self.fmt.total_bits:
            raise ValueError(f"bit position must be in [0, {self.fmt.total_bits}), got {position}")
        self.set_bits(self.bits ^ (1 << position))

    def set_value(self, value: float) -> None:
        """Round ``value`` to the current format and show it, as typing it does; the number box then shows the
        value held (typing keeps the learner's text).

        A value the format cannot hold is not an error: E8M0 turns 0 and negative numbers into its NaN
        (as ml_dtypes), FP6/FP4 keep the current bits for NaN, which they lack; ``note`` (shown in the
        panel) says what happened.
        """
        self._set(value, typed=False)

    def _set(self, value: float, typed: bool) -> None:
        """Set from code: the number box shows the value held; typed: it keeps what the learner typed."""
        bits, self.note = _encode_note(value, self.fmt)
        if bits is not None:
            self.bits = bits
        self._refresh(update_number=not typed)

    def set_format(self, name: str) -> None:
        """Switch format, keeping the value (rounded to the new format; NaN becomes 0 where there is none)."""
        value = F.decode(self.bits, self.fmt)
        fmt = F.get_format(name)
        if fmt.name not in EXPLORER_FORMATS:
            raise ValueError(f"the explorer shows {', '.join(EXPLORER_FORMATS)}; got {fmt.name}")
        self.fmt = fmt
        bits, self.note = _encode_note(value, self.fmt)
        if bits is None:
            bits, self.note = 0, _("{note}; showing 0 instead").format(note=self.note)
        self.bits = bits
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
            field = _bit_field(f, i)
            b = W.ToggleButton(description="0", tooltip=f"{field} bit {pos}",
                               layout=W.Layout(width="26px", padding="0", margin="1px"))
            b.add_class("lk-bit")
            b.add_class(f"lk-{field}")
            b.observe(lambda change, pos=pos: self._on_click(pos, change), names="value")
            buttons.append(b)
        old, self.buttons = getattr(self, "buttons", []), buttons
        self.bit_box.children = tuple(buttons)
        for b in old:  # a format switch drops the old buttons: close them, or their models pile up in the kernel
            b.layout.close()
            b.style.close()
            b.close()

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
            self._set(_parse_number(change["new"]), typed=True)
        except (ValueError, OverflowError, ZeroDivisionError):
            self.details.value = "<b>{}</b>".format(html.escape(_("Could not read {text} as a number.").format(
                text=change["new"])))

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
        colored = "".join(f'<span style="background:{FIELD_COLORS[k]};padding:0 3px;font-family:monospace" '
                          f'title="{k}">{html.escape(v)}</span>'
                          for k, v in zip(_field_names(f), fl.bitstring.split("|"), strict=True))
        rows = [f"<b>{html.escape(self.note)}</b>"] if self.note else []
        rows += [f"<b>{f.name}</b>: {html.escape(f.description)}",
                 html.escape(_("specials: {specials}").format(specials=f.specials)),
                 _("bits {bits}").format(bits=colored) + " &nbsp; "
                 + _("kind: {kind}").format(kind=f"<b>{fl.kind}</b>"),
                 html.escape(_("value: {meaning}").format(meaning=fl.meaning))]
        if fl.kind not in ("nan",):
            below, v, above = F.neighbours(fl.value, f)
            rows.append(html.escape(_("neighbours: {below!r} < {value!r} < {above!r}").format(
                below=below, value=v, above=above)))
            if math.isfinite(v):
                rows.append(_("ulp here: {ulp!r} (relative {relative:.3g})").format(
                    ulp=F.ulp(v, f), relative=F.ulp(v, f) / abs(v) if v else math.inf))
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


# ----------------------------------------------------------------------------------------------------
# The ZeRO memory calculator (notebook 06): the figures come from labkit.memory
# ----------------------------------------------------------------------------------------------------


def memory_calculator_report(
    n_params: int,
    gpus_per_node: int = 8,
    nodes: int = 1,
    stage: int = 2,
    offload: str = "none",
    policy: str = "bf16-master",
    optimizer: str = "adam",
    gpu_gb: float = 80.0,
) -> str:
    """Return the calculator's answer as one line: per-GPU model states, whether they fit, CPU per node.

    ``offload`` is ``"none"``, ``"optimizer"`` or ``"optimizer+params"``. Activations come on top of the
    model states; the line says how much of the GPU is left for them. Limits (``ValueError`` saying the
    range): ``gpus_per_node`` at most 1,024 (a DGX has 8, an NVL72 rack 72), ``gpus_per_node * nodes`` at most
    2**20 ranks and ``n_params`` at most 10**15 (:func:`labkit.memory.model_state_bytes`), ``gpu_gb`` at most
    10,000 (today's largest GPUs hold under 300 GB). Introduced in notebook 06.
    """
    if not isinstance(offload, str) or offload not in ("none", "optimizer", "optimizer+params"):
        raise ValueError(f"offload must be 'none', 'optimizer' or 'optimizer+params', got {safe_repr(offload)}")
    gpn = M.check_count("gpus_per_node", gpus_per_node, 1, MAX_GPUS_PER_NODE)
    nn_ = M.check_count("nodes", nodes, 1, MAX_WORLD_SIZE)
    if gpn * nn_ > MAX_WORLD_SIZE:
        raise ValueError(f"gpus_per_node * nodes must be at most {MAX_WORLD_SIZE:,} ranks, got {gpn} * {nn_}")
    if isinstance(gpu_gb, bool) or not isinstance(gpu_gb, (int, float)) or not 0 < gpu_gb <= MAX_GPU_GB:
        raise ValueError(f"gpu_gb must be a number in (0, {MAX_GPU_GB:,}], got {safe_repr(gpu_gb)}")
    est = M.model_state_bytes(n_params, policy, optimizer, stage=stage, world_size=gpn * nn_,
                            offload_optimizer=offload != "none", offload_params=offload == "optimizer+params")
    per_gpu = est.device_total
    cap = gpu_gb * M.GB
    verdict = (_("fits, {left} left for activations").format(left=M.fmt_bytes(cap - per_gpu)) if per_gpu <= cap
               else _("does NOT fit ({over} over)").format(over=M.fmt_bytes(per_gpu - cap)))
    line = _("per GPU: {states} of model states on a {gpu_gb:g} GB GPU: {verdict}").format(
        states=M.fmt_bytes(per_gpu), gpu_gb=gpu_gb, verdict=verdict)
    if est.host:
        line += _("; CPU per node: {host}").format(host=M.fmt_bytes(est.host_per_node(gpn)))
    return line


def _within(name: str, value: object, low: float, high: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {low:g} and {high:g}, got {safe_repr(value)}")


def memory_calculator(n_params: int | str = "13B", gpus_per_node: int = 8, nodes: int = 1, stage: int = 2,
               offload: str = "optimizer", policy: str = "bf16-master", optimizer: str = "adam",
               gpu_gb: float = 80.0) -> Any:
    """Return an ipywidgets memory calculator (a VBox); its ``.result`` Label shows the per-GPU figure.

    Inputs: model size (preset or a number of billions), GPUs per node, nodes, ZeRO stage, offload,
    precision policy, optimizer and GPU memory. ``.controls`` holds the input widgets by name. CSS
    classes for browser tests: the box ``lk-memcalc``, the result ``lk-mem-result``, each control
    ``lk-mem-<name>`` (``lk-mem-stage``, ``lk-mem-gpus-per-node`` ...). Introduced in notebook 06.
    """
    import ipywidgets as widgets

    if isinstance(n_params, str):
        if n_params not in M.MODEL_PRESETS:
            raise ValueError(f"unknown preset {safe_repr(n_params)}; choose one of {list(M.MODEL_PRESETS)} or pass a "
                             "number")
        preset, billions = n_params, M.MODEL_PRESETS[n_params] / 1e9
    else:
        billions = M.check_count("n_params", n_params, 1, MAX_PREDICTED_PARAMS) / 1e9
        preset = next((k for k, v in M.MODEL_PRESETS.items() if v == n_params), "custom")
    # the widgets' own ranges: a value outside them would be clamped silently (or raise a TraitError)
    _within("n_params (billions)", billions, 0.001, 10000)
    _within("gpus_per_node", M.check_count("gpus_per_node", gpus_per_node, 1), 1, 64)
    _within("nodes", M.check_count("nodes", nodes, 1), 1, 4096)
    _within("gpu_gb", gpu_gb, 1, 1000)
    if isinstance(stage, bool) or not isinstance(stage, int) or stage not in (0, 1, 2, 3):
        raise ValueError(f"stage must be 0, 1, 2 or 3, got {safe_repr(stage)}")
    if not isinstance(offload, str) or offload not in ("none", "optimizer", "optimizer+params"):
        raise ValueError(f"offload must be 'none', 'optimizer' or 'optimizer+params', got {safe_repr(offload)}")

    class MemoryCalculator(widgets.VBox):
        def __repr__(self) -> str:
            return "MemoryCalculator()"

    c = {
        "preset": widgets.Dropdown(options=[*M.MODEL_PRESETS, "custom"], value=preset, description=_("model")),
        "billions": widgets.BoundedFloatText(value=billions, min=0.001, max=10000, step=0.5,
                                             description=_("params (B)")),
        "gpus_per_node": widgets.BoundedIntText(value=gpus_per_node, min=1, max=64, description=_("GPUs/node")),
        "nodes": widgets.BoundedIntText(value=nodes, min=1, max=4096, description=_("nodes")),
        "stage": widgets.Dropdown(options=[0, 1, 2, 3], value=stage, description=_("ZeRO stage")),
        "offload": widgets.Dropdown(options=["none", "optimizer", "optimizer+params"], value=offload,
                                    description=_("offload")),
        "policy": widgets.Dropdown(options=list(M.POLICIES), value=M.get_policy(policy).name, description=_("precision")),
        "optimizer": widgets.Dropdown(options=list(M.OPTIMIZERS), value=M.get_optimizer(optimizer).name,
                                      description=_("optimizer")),
        "gpu_gb": widgets.BoundedFloatText(value=gpu_gb, min=1, max=1000, description=_("GPU GB")),
    }
    result = widgets.Label(value="")
    result.add_class("lk-mem-result")
    for name, w in c.items():  # stable hooks for browser tests: .lk-mem-stage select, .lk-mem-result
        w.add_class(f"lk-mem-{name.replace('_', '-')}")

    def on_preset(change: dict) -> None:
        if change["new"] != "custom":
            c["billions"].value = M.MODEL_PRESETS[change["new"]] / 1e9  # triggers update()
        update()

    def on_billions(change: dict) -> None:
        p = c["preset"].value
        if p != "custom" and M.MODEL_PRESETS[p] != round(change["new"] * 1e9):
            c["preset"].value = "custom"
        update()

    def update(*_change: Any) -> None:
        try:
            result.value = memory_calculator_report(
                round(c["billions"].value * 1e9), c["gpus_per_node"].value, c["nodes"].value,
                c["stage"].value, c["offload"].value, c["policy"].value, c["optimizer"].value,
                c["gpu_gb"].value)
        except (ValueError, TypeError) as exc:
            result.value = _("invalid setup: {error}").format(error=exc)

    c["preset"].observe(on_preset, names="value")
    c["billions"].observe(on_billions, names="value")
    for k, w in c.items():
        if k not in ("preset", "billions"):
            w.observe(update, names="value")
    update()
    box = MemoryCalculator([*c.values(), result])
    box.add_class("lk-memcalc")
    box.controls = c  # type: ignore[attr-defined]
    box.result = result  # type: ignore[attr-defined]
    return box
