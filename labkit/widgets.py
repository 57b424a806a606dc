"""Interactive widgets for the notebooks; ipywidgets is imported only when a widget is built.

Introduced in notebook 01.
"""

from __future__ import annotations

import html
import math
from typing import Any

from labkit import formats as F
from labkit import memory as M
from labkit._validate import MAX_PREDICTED_PARAMS, MAX_WORLD_SIZE, safe_repr

__all__ = ["FIELD_COLORS", "BitExplorer", "bit_explorer", "memory_calculator", "memory_calculator_report"]

FIELD_COLORS = {"sign": "#ef9a9a", "exponent": "#a5d6a7", "mantissa": "#90caf9"}
#: The most GPUs per node and GB per GPU :func:`memory_calculator_report` takes (see its docstring).
MAX_GPUS_PER_NODE = 1024
MAX_GPU_GB = 10_000
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


def _as_shown(value: float) -> float:
    """``float(value)``; an int beyond a float's range (10**400) is shown as the inf it encodes to."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


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
    verdict = (f"fits, {M.fmt_bytes(cap - per_gpu)} left for activations" if per_gpu <= cap
               else f"does NOT fit ({M.fmt_bytes(per_gpu - cap)} over)")
    line = f"per GPU: {M.fmt_bytes(per_gpu)} of model states on a {gpu_gb:g} GB GPU: {verdict}"
    if est.host:
        line += f"; CPU per node: {M.fmt_bytes(est.host_per_node(gpn))}"
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
        "preset": widgets.Dropdown(options=[*M.MODEL_PRESETS, "custom"], value=preset, description="model"),
        "billions": widgets.BoundedFloatText(value=billions, min=0.001, max=10000, step=0.5,
                                             description="params (B)"),
        "gpus_per_node": widgets.BoundedIntText(value=gpus_per_node, min=1, max=64, description="GPUs/node"),
        "nodes": widgets.BoundedIntText(value=nodes, min=1, max=4096, description="nodes"),
        "stage": widgets.Dropdown(options=[0, 1, 2, 3], value=stage, description="ZeRO stage"),
        "offload": widgets.Dropdown(options=["none", "optimizer", "optimizer+params"], value=offload,
                                    description="offload"),
        "policy": widgets.Dropdown(options=list(M.POLICIES), value=M.get_policy(policy).name, description="precision"),
        "optimizer": widgets.Dropdown(options=list(M.OPTIMIZERS), value=M.get_optimizer(optimizer).name,
                                      description="optimizer"),
        "gpu_gb": widgets.BoundedFloatText(value=gpu_gb, min=1, max=1000, description="GPU GB"),
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

    def update(*_: Any) -> None:
        try:
            result.value = memory_calculator_report(
                round(c["billions"].value * 1e9), c["gpus_per_node"].value, c["nodes"].value,
                c["stage"].value, c["offload"].value, c["policy"].value, c["optimizer"].value,
                c["gpu_gb"].value)
        except (ValueError, TypeError) as exc:
            result.value = f"invalid setup: {exc}"

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
