"""The four fused kernels of notebook 08 as cases: their inputs, the fused and unfused runs, the checks against
torch, and (on a GPU) the race against torch eager and ``torch.compile``.

Each case is a name of :data:`NAMES`; :func:`make_inputs` builds its inputs for a ``(rows, cols)`` problem with the
same bits on every machine, :func:`run_fused` launches the Triton kernel (:mod:`labkit.kernels`), :func:`run_unfused`
runs torch's op sequence or torch's own library op, :func:`verify` compares the two and :func:`race` times them.
Introduced in notebook 08.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from labkit import kernels
from labkit._validate import safe_repr

__all__ = ["NAMES", "TORCH_REFERENCE", "Verification", "make_inputs", "race", "run_fused", "run_unfused", "verify"]

#: The four fused kernels of notebook 08, in the order it teaches them.
NAMES: tuple[str, ...] = ("bias_gelu", "softmax", "layernorm", "adamw")

#: What each kernel is checked against: torch's own op, in fp32 on the (upcast) same inputs.
TORCH_REFERENCE: dict[str, str] = {"bias_gelu": "F.gelu(x + b)", "softmax": "torch.softmax",
                                   "layernorm": "F.layer_norm", "adamw": "torch.optim.AdamW"}


def _posint(name: str, v: Any, low: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if v < low:
        raise ValueError(f"{name} must be >= {low}, got {v}")
    return v




def _name(name: Any) -> str:
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, one of {NAMES}, got {type(name).__name__}")
    if name not in NAMES:
        raise ValueError(f"name must be one of {NAMES}, got {safe_repr(name)}")
    return name


def make_inputs(name: str, rows: int, cols: int, dtype: Any = "fp32", seed: int = 0,
                device: torch.device | str | None = None) -> dict[str, Any]:
    """Return the inputs of kernel ``name`` for a ``(rows, cols)`` problem, as keyword arguments.

    bias_gelu: x, bias; softmax: x; layernorm: x, weight, bias (x around 1 +- 1); adamw: p, g, m, v (rows * cols
    elements, p/m/v fp32, g in ``dtype``) and step=3. Same bits on every machine (:func:`randn`).
    Introduced in notebook 08.
    """
    name = _name(name)
    rows, cols = _posint("rows", rows), _posint("cols", cols)
    dt = kernels.randn(1, dtype=dtype, device="cpu").dtype
    kw = {"seed": _posint("seed", seed, 0), "device": device}
    if name == "bias_gelu":
        return {"x": kernels.randn(rows, cols, dtype=dt, **kw), "bias": kernels.randn(cols, scale=0.5, dtype=dt, **{**kw, "seed": seed + 1})}
    if name == "softmax":
        return {"x": kernels.randn(rows, cols, scale=2.0, dtype=dt, **kw)}
    if name == "layernorm":
        return {"x": kernels.randn(rows, cols, shift=1.0, dtype=dt, **kw),
                "weight": kernels.randn(cols, shift=1.0, scale=0.1, dtype=dt, **{**kw, "seed": seed + 1}),
                "bias": kernels.randn(cols, scale=0.1, dtype=dt, **{**kw, "seed": seed + 2})}
    n = rows * cols
    return {"p": kernels.randn(n, **kw), "g": kernels.randn(n, scale=0.1, dtype=dt, **{**kw, "seed": seed + 1}),
            "m": kernels.randn(n, scale=0.01, **{**kw, "seed": seed + 2}),
            "v": kernels.randn(n, scale=1e-3, **{**kw, "seed": seed + 3}).square(), "step": 3}


def run_fused(name: str, inputs: dict[str, Any], kernel: Any = None) -> Any:
    """Run the Triton kernel ``name`` on ``inputs`` (from :func:`make_inputs`); AdamW updates p, m, v in place.

    Returns the output (LayerNorm: ``y`` only). Introduced in notebook 08.
    """
    name = _name(name)
    if not isinstance(inputs, dict):
        raise TypeError(f"inputs must be the dict make_inputs returns, got {type(inputs).__name__}")
    try:
        if name == "bias_gelu":
            return kernels.bias_gelu(inputs["x"], inputs["bias"], kernel=kernel)
        if name == "softmax":
            return kernels.softmax(inputs["x"], kernel=kernel)
        if name == "layernorm":
            return kernels.layernorm(inputs["x"], inputs["weight"], inputs["bias"], kernel=kernel)[0]
        return kernels.adamw_step(inputs["p"], inputs["g"], inputs["m"], inputs["v"], inputs["step"], kernel=kernel)
    except KeyError as exc:
        raise ValueError(f"inputs lack {exc}: build them with make_inputs({safe_repr(name)}, ...)") from None


def run_unfused(name: str, inputs: dict[str, Any], library: bool = False) -> Any:
    """Run torch's version of kernel ``name`` on ``inputs``: the unfused op sequence, or with ``library=True``
    torch's own one-op version (``F.gelu(x + b)`` stays two ops; ``torch.softmax``; ``F.layer_norm``;
    ``AdamW(fused=True)``). AdamW updates p, m, v in place. Introduced in notebook 08.
    """
    name = _name(name)
    if not isinstance(inputs, dict):
        raise TypeError(f"inputs must be the dict make_inputs returns, got {type(inputs).__name__}")
    if not isinstance(library, bool):
        raise TypeError(f"library must be True or False, got {type(library).__name__}")
    try:
        if name == "bias_gelu":
            return kernels.bias_gelu_unfused(inputs["x"], inputs["bias"])
        if name == "softmax":
            return torch.softmax(inputs["x"], -1) if library else kernels.softmax_unfused(inputs["x"])
        if name == "layernorm":
            x, w, b = inputs["x"], inputs["weight"], inputs["bias"]
            return F.layer_norm(x, (x.shape[-1],), w, b) if library else kernels.layernorm_unfused(x, w, b)
        p, g, m, v, step = (inputs[k] for k in ("p", "g", "m", "v", "step"))
        return kernels.adamw_torch(p, g, m, v, step, impl="fused" if library else "single")()
    except KeyError as exc:
        raise ValueError(f"inputs lack {exc}: build them with make_inputs({safe_repr(name)}, ...)") from None


@dataclass(frozen=True)
class Verification:
    """A fused kernel checked against torch: the worst error as a multiple of the tolerance (<= 1 passes).

    Introduced in notebook 08.
    """

    name: str
    dtype: str
    reference: str
    rtol: float
    atol: float
    worst: float
    ok: bool


def verify(name: str, rows: int, cols: int, dtype: Any = "fp32", seed: int = 0) -> Verification:
    """Run kernel ``name`` on fresh ``(rows, cols)`` inputs in ``dtype`` and compare it with torch's own op.

    torch computes in float64 on the same values (bf16 inputs upcast exactly), which is the right answer to far
    more digits than fp32 holds; the kernel must be within :func:`labkit.kernels.tolerance` of its output's dtype
    (fp32: a few roundings; bf16: one bf16 ulp, its single rounding when it stores). torch's own fp32 ops are not
    the yardstick: they make fp32 roundings of their own (in the interpreter the kernel's ``tl.math.erf`` is even
    float64 ``math.erf`` rounded once, closer than fp32 ``F.gelu``; compiled, neither is ahead by rule). AdamW: p, m and v after one step
    against ``torch.optim.AdamW`` (``foreach=False``) on float64 copies; its state is fp32 whatever the
    gradient's dtype. Introduced in notebook 08.
    """
    name = _name(name)
    inputs = make_inputs(name, rows, cols, dtype, seed)
    if name == "adamw":
        theirs = {k: v.double() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        run_fused(name, inputs)
        run_unfused(name, theirs)
        results = [kernels.close(inputs[k], theirs[k]) for k in ("p", "m", "v")]
        ok, worst, out_dtype = all(r[0] for r in results), max(r[1] for r in results), torch.float32
    else:
        got = run_fused(name, inputs)
        want = run_unfused(name, {k: v.double() for k, v in inputs.items()}, library=True)
        (ok, worst), out_dtype = kernels.close(got, want), got.dtype
    rtol, atol = kernels.tolerance(out_dtype)
    return Verification(name, str(inputs.get("x", inputs.get("g")).dtype).replace("torch.", ""),
                        TORCH_REFERENCE[name], rtol, atol, worst, ok)


def race(name: str, rows: int = 4096, cols: int = 4096, dtype: Any = "fp32", repeats: int = 10,
         compile: bool = True) -> dict[str, float]:
    """Time kernel ``name`` against torch in one run: round-robin medians after a warm-up (that also compiles).

    Candidates: "triton" (compiled mode only: in the interpreter a timing measures NumPy and Python, not a
    kernel, so it is left out), "eager unfused", "eager library" (softmax, layernorm, adamw) and, with
    ``compile``, "torch.compile" of the unfused sequence. Returns seconds by candidate
    (:func:`labkit.profiling.interleaved_times`). Introduced in notebook 08.
    """
    name = _name(name)
    rows, cols, repeats = _posint("rows", rows), _posint("cols", cols), _posint("repeats", repeats)
    if not isinstance(compile, bool):
        raise TypeError(f"compile must be True or False, got {type(compile).__name__}")
    if rows * cols > 2**27:
        raise ValueError(f"rows * cols must be at most 2**27, got {rows * cols}")
    from labkit import profiling

    inputs = make_inputs(name, rows, cols, dtype)
    fns: dict[str, Any] = {}
    if not kernels.mode().interpreted:
        fns["triton"] = lambda: run_fused(name, inputs)
    if name == "adamw":
        # on a GPU the step counter lives beside the parameters (capturable) for the eager and the compiled step alike
        on_gpu = inputs["p"].device.type == "cuda"
        step = kernels.adamw_torch(**inputs, impl="single", capturable=on_gpu)
        fns["eager unfused"], fns["eager library"] = step, kernels.adamw_torch(**inputs, impl="fused")
        if compile:
            fns["torch.compile"] = torch.compile(kernels.adamw_torch(**inputs, impl="single", capturable=on_gpu))
    else:
        args = tuple(inputs.values())
        fns["eager unfused"] = lambda: run_unfused(name, inputs)
        if name != "bias_gelu":
            fns["eager library"] = lambda: run_unfused(name, inputs, library=True)
        if compile:
            compiled = torch.compile({"bias_gelu": kernels.bias_gelu_unfused, "softmax": kernels.softmax_unfused,
                                      "layernorm": kernels.layernorm_unfused}[name])
            fns["torch.compile"] = lambda: compiled(*args)
    return profiling.interleaved_times(fns, repeats=repeats, device=kernels.mode().device)
