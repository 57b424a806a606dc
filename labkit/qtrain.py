"""Training in emulated FP8, MXFP8 and NVFP4: quantised matmuls and linear layers, written to be read.

Introduced in notebook 17 ("17 · The low-precision frontier: FP8 scaling, MX and NVFP4").

A low-precision linear layer runs three matmuls, and each quantises both of its operands along the
dimension it sums over (K), because that is the dimension a block of scales must run along for the
scales to factor out of each dot product:

=========  ==============  ======================  ======================
matmul     computes        operands, quantised     summed over
=========  ==============  ======================  ======================
forward    y = x W^T       x (T × in), W (out × in) ``in``
dgrad      dx = dy W       dy (T × out), W^T        ``out``
wgrad      dW = dy^T x     dy^T, x^T                the T tokens
=========  ==============  ======================  ======================

``qmm(a, b, recipe)`` returns ``Q(a) @ Q(b)^T`` with ``Q`` one of the ``RECIPES``, the quantisers of
:mod:`labkit.microscaling` applied along the last dimension of each operand; the products are summed
in the operands' dtype (float32 operands in float64, so that a GPU's TF32 mode cannot round them again). Run in float64 (as notebook 17 does), the sum of the dequantised products is
exact to about 2^-50, so the only error left is the quantisation's (in a low-precision dtype such as bf16 the
dequantised values are rounded once more, to that dtype): what a tensor core with an FP32
accumulator computes, bar the accumulator's own rounding (notebook 17, section 4). The emulation is as
exact as it is slow: it shows what the formats do to the numbers, never their speed.

Recipes, following what each is trained with in practice:

- ``"bf16"``: operands rounded to bf16 (what autocast feeds a tensor core);
- ``"fp8-tensor"``: one FP32 scale per tensor, computed from the tensor itself (*current* scaling, as
  torchao's default float8 training), E4M3 forward and E5M2 for gradients (Transformer Engine's hybrid);
- ``"fp8-row"``: one FP32 scale per row along K, E4M3/E5M2 as above (torchao's rowwise recipe also
  scales per row, but rounds each scale down to a power of two and keeps E4M3 for the gradients);
- ``"mxfp8"`` and ``"mxfp8-floor"``: MX blocks of 32, E4M3 everywhere (the MXFP8 pretraining recipe),
  the E8M0 scale rounded up (RCEIL, the recipe's fix) or by the OCP spec's floor;
- ``"nvfp4"``: blocks of 16 with an E4M3 scale and a per-tensor FP32 scale, E2M1 everywhere. NVIDIA's
  NVFP4 pretraining recipe adds stochastic rounding of the gradients (``stochastic=True``) and a random
  Hadamard transform of the wgrad operands (``hadamard=True``); its 2-D 16 × 16 weight scaling and its
  high-precision last layers are not emulated here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from labkit import formats, microscaling
from labkit._validate import safe_repr
from labkit.i18n import gettext as _

__all__ = [
    "RECIPES",
    "QLinear",
    "QuantConfig",
    "float8_speedup",
    "hadamard_rotation",
    "native_formats",
    "qmm",
    "quantise",
    "quantise_linears",
    "stochastic_round",
]

#: The recipes ``quantise`` and ``qmm`` know, from the widest element format to the narrowest.
RECIPES: tuple[str, ...] = ("bf16", "fp8-tensor", "fp8-row", "mxfp8", "mxfp8-floor", "nvfp4")
_HADAMARD_BLOCK = 16  # NVIDIA's NVFP4 recipe rotates the wgrad operands by 16 x 16 Hadamard blocks


def _check_recipe(recipe: object) -> str:
    if not isinstance(recipe, str):
        raise TypeError(f"recipe must be one of {RECIPES}, got {type(recipe).__name__}")
    if recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {RECIPES}, got {safe_repr(recipe)}")
    return recipe


def stochastic_round(v: torch.Tensor, fmt: str, generator: torch.Generator | None = None) -> torch.Tensor:
    """Round each value of ``v`` to ``fmt`` up or down at random, with the probability of its distance.

    A value a quarter of the way from one representable value to the next rounds up one time in four, so
    the rounding is unbiased on average (E[round(v)] = v), where rounding to nearest always loses the
    quarter. Values beyond the format's max saturate; NaN stays NaN. Returns ``v``'s dtype.
    Introduced in notebook 17.
    """
    if not isinstance(v, torch.Tensor) or not v.is_floating_point() or v.layout != torch.strided:
        raise TypeError("v must be a dense floating-point torch.Tensor")
    f = formats.get_format(fmt)
    if not f.signed or f.man_bits == 0:
        raise ValueError(f"fmt must be a signed format with mantissa bits, got {safe_repr(fmt)}")
    a = v.detach().abs().double()
    _, e = torch.frexp(torch.where(torch.isfinite(a), a, 1.0))
    step = torch.ldexp(torch.ones_like(a), (e.long() - 1).clamp(min=f.emin) - f.man_bits)  # spacing at |v|
    steps = a / step  # exact: a power-of-two rescale
    gen_device = generator.device if generator is not None else torch.device("cpu")
    u = torch.rand(a.shape, generator=generator, dtype=torch.float64, device=gen_device).to(a.device)
    r = (torch.floor(steps) + (u < steps - torch.floor(steps)).double()) * step
    r = torch.where(torch.isnan(a), a, r.clamp(max=f.max))
    return torch.copysign(r, v.double()).to(v.dtype)


def hadamard_rotation(n: int = _HADAMARD_BLOCK, generator: torch.Generator | None = None,
                      dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Return an n × n random Hadamard rotation H·diag(±1) / sqrt(n): orthogonal, so (aR)(bR)^T = ab^T.

    Rotating both operands of a matmul along K leaves the product unchanged and spreads a block's outlier
    over all n elements, which a narrow format's block scale then fits better. ``n`` is a power of two.
    Introduced in notebook 17.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1 or n & (n - 1):
        raise ValueError(f"n must be a power of two, got {safe_repr(n)}")
    h = torch.ones(1, 1, dtype=dtype)
    while h.shape[0] < n:  # Sylvester's construction: H_2n = [[H, H], [H, -H]]
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    signs = torch.randint(0, 2, (n,), generator=generator).to(dtype) * 2 - 1
    return h * signs / math.sqrt(n)


def quantise(x: torch.Tensor, recipe: str, *, grad: bool = False, stochastic: bool = False,
             generator: torch.Generator | None = None) -> torch.Tensor:
    """Return ``x`` quantised along its last dimension by ``recipe`` and dequantised, in ``x``'s dtype.

    ``grad=True`` picks the recipe's gradient format (E5M2 for the FP8 recipes); ``stochastic=True``
    rounds the elements stochastically (NVFP4's gradients; see ``stochastic_round``).
    Introduced in notebook 17.
    """
    recipe = _check_recipe(recipe)
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError("x must be a floating-point torch.Tensor")
    if recipe == "bf16":
        return x.to(torch.bfloat16).to(x.dtype)
    back = {"device": x.device, "dtype": x.dtype}  # microscaling computes on the CPU; the result goes back
    if recipe in ("fp8-tensor", "fp8-row"):
        fmt = "e5m2" if grad else "e4m3fn"
        q = (microscaling.per_tensor if recipe == "fp8-tensor" else microscaling.rowwise)(x, fmt)
    elif recipe.startswith("mxfp8"):
        q = microscaling.mx(x, "e4m3fn", scale_rounding="floor" if recipe == "mxfp8-floor" else "rceil")
    else:
        q = microscaling.nvfp4(x)
    if stochastic:  # the same scales; the scaled values x / scale rounded up or down at random
        s = q.element_scales()
        return (stochastic_round(x.detach().cpu().double() / s, q.element_format, generator) * s).to(**back)
    return q.dequantise().to(**back)


def qmm(a: torch.Tensor, b: torch.Tensor, recipe: str, *, grad_a: bool = False, grad_b: bool = False,
        stochastic: bool = False, rotation: torch.Tensor | None = None,
        generator: torch.Generator | None = None) -> torch.Tensor:
    """Return Q(a) @ Q(b)^T: a (M × K) and b (N × K) quantised along K by ``recipe``, summed in a's dtype.

    ``grad_a``/``grad_b`` say which operand is a gradient (its format, and stochastic rounding if
    ``stochastic``); ``rotation`` (from ``hadamard_rotation``) rotates both operands along K, block by
    block, before quantising. Introduced in notebook 17.
    """
    if not all(isinstance(t, torch.Tensor) and t.dim() == 2 for t in (a, b)):
        raise TypeError("a and b must be 2-D torch tensors, (M, K) and (N, K)")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"a and b must share K (their second dimension), got {tuple(a.shape)} and {tuple(b.shape)}")
    if rotation is not None:
        n = rotation.shape[0]
        if a.shape[1] % n:
            raise ValueError(f"K = {a.shape[1]} must be a multiple of the rotation's size {n}")
        a = (a.reshape(a.shape[0], -1, n) @ rotation.to(a)).reshape(a.shape)
        b = (b.reshape(b.shape[0], -1, n) @ rotation.to(b)).reshape(b.shape)
    qa = quantise(a, recipe, grad=grad_a, stochastic=stochastic and grad_a, generator=generator)
    qb = quantise(b, recipe, grad=grad_b, stochastic=stochastic and grad_b, generator=generator)
    if a.dtype == torch.float32:  # summed in float64: no TF32 on a GPU, no reduced-precision reduction
        return (qa.double() @ qb.double().t()).float()
    return qa @ qb.t()


@dataclass(frozen=True)
class QuantConfig:
    """How a ``QLinear`` quantises: a recipe from ``RECIPES``, and NVFP4's two tricks.

    ``stochastic``: stochastic rounding of the gradient operands; ``hadamard``: a random 16 × 16
    Hadamard rotation of the wgrad operands. ``seed`` seeds both. Introduced in notebook 17.
    """

    recipe: str = "mxfp8"
    stochastic: bool = False
    hadamard: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        _check_recipe(self.recipe)
        for name in ("stochastic", "hadamard"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {safe_repr(getattr(self, name))}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise TypeError(f"seed must be an int, got {safe_repr(self.seed)}")


class _QLinearFn(torch.autograd.Function):
    """y = x W^T with all three matmuls quantised (see the module's table)."""

    @staticmethod
    def forward(ctx, x, w, cfg, gen):  # type: ignore[override]
        ctx.save_for_backward(x, w)
        ctx.cfg, ctx.gen = cfg, gen
        return qmm(x, w, cfg.recipe)  # forward: K = in_features

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        x, w = ctx.saved_tensors
        cfg, gen = ctx.cfg, ctx.gen
        sr = cfg.stochastic
        dx = qmm(dy, w.t(), cfg.recipe, grad_a=True, stochastic=sr, generator=gen)  # dgrad: K = out_features
        rot = hadamard_rotation(_HADAMARD_BLOCK, gen, dy.dtype) if cfg.hadamard else None
        dw = qmm(dy.t(), x.t(), cfg.recipe, grad_a=True, stochastic=sr, rotation=rot, generator=gen)  # K = tokens
        return dx, dw, None, None


class QLinear(nn.Module):
    """An ``nn.Linear`` whose forward and backward matmuls run in an emulated low-precision recipe.

    Holds the original layer's weight and bias (the same Parameters, in high precision: the optimizer
    keeps master weights as in every FP8/FP4 recipe); only the matmuls' operands are quantised. The bias
    is added in high precision. Every K must fit the recipe's blocks: the layer's in and out features, and the
    number of tokens in a batch (wgrad sums over them), multiples of 32 for MXFP8 and of 16 for NVFP4 and the
    Hadamard rotation. Runs on any device (the quantisers compute on the CPU and hand the result back).
    Introduced in notebook 17.
    """

    def __init__(self, linear: nn.Linear, cfg: QuantConfig) -> None:
        super().__init__()
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be an nn.Linear, got {type(linear).__name__}")
        if not isinstance(cfg, QuantConfig):
            raise TypeError(f"cfg must be a QuantConfig, got {type(cfg).__name__}")
        self.weight, self.bias, self.cfg = linear.weight, linear.bias, cfg
        self.gen = torch.Generator().manual_seed(cfg.seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _QLinearFn.apply(x.reshape(-1, x.shape[-1]), self.weight, self.cfg, self.gen)
        y = y.reshape(*x.shape[:-1], self.weight.shape[0])
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"in={self.weight.shape[1]}, out={self.weight.shape[0]}, {self.cfg}"


def quantise_linears(model: nn.Module, cfg: QuantConfig, skip: tuple[str, ...] = ()) -> list[str]:
    """Replace every ``nn.Linear`` of ``model`` (but those whose name starts with one of ``skip``) by a
    ``QLinear`` sharing its parameters; return the names replaced. Introduced in notebook 17.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not isinstance(cfg, QuantConfig):
        raise TypeError(f"cfg must be a QuantConfig, got {type(cfg).__name__}")
    if not isinstance(skip, tuple) or not all(isinstance(s, str) for s in skip):
        raise TypeError(f"skip must be a tuple of module-name prefixes, got {safe_repr(skip)}")
    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and not n.startswith(skip or ("\0",))]
    for i, name in enumerate(names):
        parent, _, child = name.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        layer_cfg = QuantConfig(cfg.recipe, cfg.stochastic, cfg.hadamard, cfg.seed + i)
        setattr(owner, child, QLinear(getattr(owner, child), layer_cfg))
    return names


def native_formats(caps: object) -> str:
    """Say which of this notebook's formats the machine described by ``caps`` runs natively.

    ``caps`` is ``labkit.device.capabilities()``. Read from the CUDA compute capability: 8.9 (Ada) and 9.0
    (Hopper) have FP8 tensor cores; 10.x and 12.x (Blackwell) add MXFP8/MXFP6/MXFP4 and NVFP4 with the
    block scales in the instruction. Introduced in notebook 17.
    """
    cc = getattr(caps, "cuda_capability", None)
    name = getattr(caps, "device_name", _("this device"))
    if not hasattr(caps, "tier"):
        raise TypeError(f"caps must be labkit.device.capabilities(), got {type(caps).__name__}")
    if cc is not None and getattr(torch.version, "hip", None):
        return _("{name}: a ROCm GPU (gfx capability {major}.{minor}); this table reads NVIDIA compute capabilities, "
                 "so check AMD's documentation (MI300: FP8; MI350: MXFP8/MXFP6/MXFP4).").format(
                     name=name, major=cc[0], minor=cc[1])
    if cc is None:
        return _("{name}: no CUDA GPU. Every format in this notebook is emulated here: exact values, "
                 "no speed-up to measure.").format(name=name)
    if cc >= (10, 0):
        text = _("{name} (compute capability {major}.{minor}): FP8 (E4M3/E5M2), MXFP8, MXFP6, MXFP4 and NVFP4, "
                 "block scales in the tensor cores.")
    elif cc >= (8, 9):
        text = _("{name} (compute capability {major}.{minor}): FP8 (E4M3/E5M2) with per-tensor or rowwise scales; "
                 "MX and NVFP4 only emulated.")
    else:
        text = _("{name} (compute capability {major}.{minor}): no FP8 tensor cores: bf16/fp16 are the narrowest; "
                 "FP8, MX and NVFP4 only emulated.")
    return text.format(name=name, major=cc[0], minor=cc[1])


def float8_speedup(dim: int = 4096, tokens: int = 8192, recipe: str = "tensorwise", repeats: int = 10,
                   caps: object = None) -> str:
    """On a CUDA GPU with FP8 (compute capability 8.9+), time one training step of a 4-layer MLP in bf16
    and with torchao's ``convert_to_float8_training`` (both compiled), and return the speed-up as a line.

    Times the GPU with CUDA events (``labkit.bench.compare``), medians of ``repeats`` after warm-up. On
    Blackwell too it times per-tensor (or rowwise) FP8, not MXFP8: torchao's MX training is a prototype.
    Needs torchao (``pip install labkit[lowprecision]``); returns why it did not run otherwise. ``caps`` is
    ``labkit.device.capabilities()`` (read if not given). Introduced in notebook 17.
    """
    from labkit import bench
    from labkit import device as dev_gate

    caps = dev_gate.capabilities() if caps is None else caps
    cc, name = getattr(caps, "cuda_capability", None), getattr(caps, "device_name", _("this GPU"))
    if getattr(caps, "device_type", None) != "cuda" or cc is None:
        return _("float8 training needs a CUDA GPU: not run here.")
    if getattr(torch.version, "hip", None):
        return _("a ROCm GPU: torchao's float8 training is timed here on NVIDIA GPUs only.")
    if cc < (8, 9):
        return _("{name} has no FP8 tensor cores: float8 training not run.").format(name=name)
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError:
        return _("torchao is not installed (pip install 'labkit[lowprecision]'): float8 training not run.")
    dev = torch.device("cuda")
    x = torch.randn(tokens, dim, device=dev, dtype=torch.bfloat16)

    def make(fp8_on: bool) -> nn.Module:
        torch.manual_seed(0)
        m = nn.Sequential(*[nn.Linear(dim, dim, bias=False) for _ in range(4)]).to(dev, torch.bfloat16)
        if fp8_on:
            convert_to_float8_training(m, config=Float8LinearConfig.from_recipe_name(recipe))
        return torch.compile(m)

    try:
        models = {"bf16": make(False), f"float8 {recipe}": make(True)}
        steps = {n: (lambda m=m: m(x).float().pow(2).mean().backward()) for n, m in models.items()}
        cmp = bench.compare(steps, warmup=3, repeats=repeats, device=dev)
    except Exception as e:  # a compile or kernel failure is a result to report, not a crash of the notebook
        return _("float8 training did not run on {name}: {error}: {message}").format(
            name=name, error=type(e).__name__, message=e)
    t_bf16, t_fp8 = (cmp.timings[n].median for n in steps)
    return _("{name}: a training step of 4 linear layers {dim} x {dim}, {tokens} tokens: bf16 {bf16_ms:.2f} ms, "
             "float8 {recipe} {fp8_ms:.2f} ms (medians of {repeats}, CUDA events): {speedup:.2f}x").format(
                 name=name, dim=dim, tokens=tokens, bf16_ms=t_bf16 * 1e3, recipe=recipe, fp8_ms=t_fp8 * 1e3,
                 repeats=repeats, speedup=t_bf16 / t_fp8)
