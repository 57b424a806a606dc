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
from playwright.sync_api import expect

pytestmark = pytest.mark.slow  # a JupyterLab server, Chromium and whole notebooks

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
        expect(pressed).to_have_count(bits.bit_count())
        match = LABEL.match(self.value.inner_text().strip())
        assert match, self.value.inner_text()
        return float(match["value"])


@pytest.mark.parametrize("number", ["01"])  # in the test id: make test runs it beside that notebook's run
def test_bit_explorer_clicks_and_typing(lab: Lab, number: str) -> None:
    """Clicking bits changes the decoded value correctly; typing a number sets the right bits."""
    run = lab.run_notebook(_notebook(number))
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
    expect(ex.value).to_have_text(re.compile(r"^fp16 0xfc01 = (-)?nan$", re.IGNORECASE))
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


def zero_per_gpu_gb(n_params: float, gpus: int, stage: int, offload_optimizer: bool = False) -> float:
    """Per-GPU model-state memory (GB) for mixed precision + Adam, from the ZeRO paper (K = 12).

    Weights and gradients take 2 bytes per parameter each, fp32 master weights and Adam's two moments 12.
    Stage 1 shards the 12, stage 2 the gradients too, stage 3 everything; offloading the optimizer moves the
    12 bytes (and, from stage 2, the gradient shard) to the CPU.
    """
    weights, grads, states = 2 * n_params, 2 * n_params, 12 * n_params
    if stage >= 1:
        states /= gpus
    if stage >= 2:
        grads /= gpus
    if stage >= 3:
        weights /= gpus
    if offload_optimizer:
        states = 0.0
        if stage >= 2:
            grads = 0.0
    return (weights + grads + states) / 1e9


@pytest.mark.parametrize("number", ["06"])  # in the test id: make test runs it beside that notebook's run
def test_memory_calculator_follows_the_zero_stage(lab: Lab, number: str) -> None:
    """Changing ZeRO stage, offload and GPU count changes the per-GPU figure to the ZeRO paper's value."""
    run = lab.run_notebook(_notebook(number))
    root = run.code_cell_with("widgets.memory_calculator(").locator(".jp-OutputArea-output").first
    result = root.locator(".lk-mem-result")
    stage = root.get_by_label("ZeRO stage", exact=True)
    offload = root.get_by_label("offload", exact=True)
    gpus = root.get_by_label("GPUs/node", exact=True)
    psi = 13e9

    def shows(gb: float) -> str:
        expect(result).to_have_text(re.compile(rf"^per GPU: {gb:.2f} GB of model states"))
        return result.inner_text()

    # The notebook leaves it at 13B on 8 GPUs, bf16, ZeRO-3 without offload (its stage loop ends there).
    expect(stage).to_have_value("3")
    expect(offload).to_have_value("none")
    shows(zero_per_gpu_gb(psi, 8, 3))  # 26 GB
    stage.select_option("0")
    text = shows(zero_per_gpu_gb(psi, 8, 0))  # 208 GB: everything replicated
    assert "does NOT fit (128.00 GB over)" in text
    stage.select_option("1")
    shows(zero_per_gpu_gb(psi, 8, 1))  # 71.5 GB
    stage.select_option("2")
    shows(zero_per_gpu_gb(psi, 8, 2))  # 48.75 GB
    offload.select_option("optimizer")
    assert "fits" in shows(zero_per_gpu_gb(psi, 8, 2, offload_optimizer=True))  # 26 GB, the seeds' setup
    stage.select_option("3")
    shows(zero_per_gpu_gb(psi, 8, 3, offload_optimizer=True))  # 3.25 GB
    stage.select_option("1")
    shows(zero_per_gpu_gb(psi, 8, 1, offload_optimizer=True))  # 52 GB

    # A combination DeepSpeed rejects is reported in the widget, not raised into the log.
    stage.select_option("0")
    expect(result).to_have_text(re.compile(r"^invalid setup: .*stage"))
    offload.select_option("none")
    shows(zero_per_gpu_gb(psi, 8, 0))

    stage.select_option("3")
    shows(zero_per_gpu_gb(psi, 8, 3))
    gpus.fill("16")
    gpus.press("Enter")
    shows(zero_per_gpu_gb(psi, 16, 3))  # 13 GB
