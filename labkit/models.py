"""Small models for the notebooks: an MLP and a tiny GPT with hand-written attention.

- :class:`MLP` — a plain multi-layer perceptron. ``init_scale`` shrinks (or grows) every weight at
  initialisation, which shrinks the gradients geometrically with depth: notebook 03 uses it to make part
  of the gradients underflow in fp16.
- :class:`TinyGPT` — a decoder-only transformer of a few hundred thousand parameters (configured by
  :class:`GPTConfig`). Its attention is written out (``q @ k^T``, mask, softmax, ``@ v``) so that the
  softmax implementation can be swapped: ``"naive"`` (``exp(x) / sum(exp(x))`` in whatever dtype the
  scores have; overflows in fp16), ``"stable"`` (max subtracted first), ``"fp32"`` (an fp32 island:
  autocast off, upcast, stable softmax, cast back) and ``"torch"`` (``F.softmax``).
- :func:`softmax` — those four implementations as one function, for tensors you build yourself.
- :func:`lm_loss` — the next-token cross-entropy, ignoring ``labkit.data.IGNORE_INDEX`` targets.

Example::

    from labkit import data, models
    task = data.make_token_task("reverse", n_digits=6, vocab_size=12)
    model = models.TinyGPT(models.GPTConfig(vocab_size=task.vocab_size, seq_len=task.seq_len))
    logits = model(task.inputs[:8])                 # (8, seq_len, vocab_size)
    loss = models.lm_loss(logits, task.targets[:8])

Introduced in notebook 03.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from labkit._validate import MAX_DEPTH, MAX_MODEL_PARAMS, as_float, check_dense, mlp_param_count, safe_repr

__all__ = [
    "ACTIVATIONS",
    "MLP",
    "SOFTMAX_IMPLS",
    "CausalSelfAttention",
    "GPTConfig",
    "TinyGPT",
    "count_parameters",
    "lm_loss",
    "softmax",
]

#: Activation functions the :class:`MLP` accepts, by name.
ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh}

#: Softmax implementations :func:`softmax` and :class:`CausalSelfAttention` accept.
SOFTMAX_IMPLS = ("naive", "stable", "fp32", "torch")


#: The most bytes a model's fp32 weights and causal masks may take when labkit builds it: 80 GB, one 80 GB GPU.
_MAX_MODEL_BYTES = 4 * MAX_MODEL_PARAMS


def _check_size(what: str, n_params: int, mask_bytes: int = 0) -> None:
    """Refuse a model whose fp32 weights (4 bytes a parameter) and boolean masks pass 80 GB, before building it."""
    if n_params > MAX_MODEL_PARAMS or 4 * n_params + mask_bytes > _MAX_MODEL_BYTES:
        masks = f" and {safe_repr(mask_bytes, 40)} bytes of causal masks" if mask_bytes else ""
        raise ValueError(f"{what} would have {safe_repr(n_params, 40)} parameters{masks}; labkit builds models of "
                         f"at most {MAX_MODEL_PARAMS:,} parameters and {_MAX_MODEL_BYTES // 10**9} GB of fp32 "
                         "weights and masks (one 80 GB GPU's memory)")


def _attention_params(d_model: int) -> int:
    return 3 * d_model * d_model + 3 * d_model + d_model * d_model + d_model  # qkv and proj, with biases


def _gpt_param_count(cfg: GPTConfig) -> int:
    """Parameters of ``TinyGPT(cfg)``: embeddings, blocks (attention, MLP, two LayerNorms), final LayerNorm, head."""
    d, hidden = cfg.d_model, cfg.mlp_ratio * cfg.d_model
    block = _attention_params(d) + 4 * d + (d + 1) * hidden + (hidden + 1) * d
    return (cfg.vocab_size + cfg.seq_len) * d + cfg.n_layers * block + 2 * d + d * cfg.vocab_size


def _check_seed(seed: object) -> None:
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63):
        raise TypeError(f"seed must be None or an int >= 0, got {safe_repr(seed)}")


def softmax(scores: torch.Tensor, impl: str = "fp32", dim: int = -1) -> torch.Tensor:
    """Return the softmax of ``scores`` along ``dim`` with one of :data:`SOFTMAX_IMPLS`; same dtype out.

    - ``"naive"``: ``e = exp(scores); e / e.sum()`` in the scores' dtype. In fp16 ``exp(x)`` overflows to
      ``inf`` for ``x > 11.09``, and ``inf / inf`` is NaN.
    - ``"stable"``: subtracts the row maximum first (so ``exp <= 1``), still in the scores' dtype.
    - ``"fp32"``: an *fp32 island*: autocast disabled, the scores upcast to float32, the stable softmax
      computed there, the result cast back to the input dtype.
    - ``"torch"``: ``torch.softmax`` (CUDA autocast runs it in fp32; CPU autocast does not).

    Introduced in notebook 04.
    """
    check_dense("scores", scores)
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"dim must be an int, got {type(dim).__name__}")
    if scores.dim() == 0 or not -scores.dim() <= dim < scores.dim() or scores.shape[dim] == 0:
        raise ValueError(f"dim {dim} must name a non-empty dimension of scores {tuple(scores.shape)}")
    if impl == "naive":
        e = torch.exp(scores)
        return e / e.sum(dim=dim, keepdim=True)
    if impl == "stable":
        e = torch.exp(scores - scores.amax(dim=dim, keepdim=True))
        return e / e.sum(dim=dim, keepdim=True)
    if impl == "fp32":
        with torch.autocast(device_type=scores.device.type, enabled=False):
            s = scores.float()
            e = torch.exp(s - s.amax(dim=dim, keepdim=True))
            return (e / e.sum(dim=dim, keepdim=True)).to(scores.dtype)
    if impl == "torch":
        return torch.softmax(scores, dim=dim)
    raise ValueError(f"unknown softmax impl {safe_repr(impl)}; choose one of {SOFTMAX_IMPLS}")


class MLP(nn.Module):
    """A multi-layer perceptron: ``depth`` hidden layers of width ``hidden``, then a linear output layer.

    ``init_scale`` multiplies every weight after PyTorch's default initialisation (biases start at
    zero). Values below 1 make activations and back-propagated gradients shrink layer by layer, which
    is how notebook 03 produces gradients that partly underflow in fp16 without hard-coding anything.

    Size limits, checked before anything is allocated (``ValueError`` saying the range): ``depth`` at most
    10,000 layers (``labkit._validate.MAX_DEPTH``) and at most 20 billion parameters in all
    (``MAX_MODEL_PARAMS``: 80 GB of fp32 weights, one 80 GB GPU's whole memory).

    Introduced in notebook 03.
    """

    def __init__(
        self,
        in_features: int = 16,
        hidden: int = 64,
        out_features: int = 1,
        depth: int = 2,
        activation: str = "relu",
        init_scale: float = 1.0,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        for name, v in (("in_features", in_features), ("hidden", hidden), ("out_features", out_features)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {safe_repr(v)}")
        if isinstance(depth, bool) or not isinstance(depth, int) or not 0 <= depth <= MAX_DEPTH:
            raise ValueError(f"depth must be an int between 0 and {MAX_DEPTH:,}, got {safe_repr(depth)}")
        n_params = mlp_param_count(in_features, hidden, out_features, depth)
        if n_params > MAX_MODEL_PARAMS:
            shape = ", ".join(safe_repr(v, 30) for v in (in_features, hidden, out_features))
            raise ValueError(f"MLP({shape}, depth={depth}) would have {safe_repr(n_params, 40)} parameters; labkit "
                             f"builds at most {MAX_MODEL_PARAMS:,} (80 GB of fp32 weights, one 80 GB GPU's memory)")
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {safe_repr(activation)}; choose one of {sorted(ACTIVATIONS)}")
        if not (isinstance(init_scale, (int, float)) and init_scale > 0
                and math.isfinite(as_float("init_scale", init_scale))):
            raise ValueError(f"init_scale must be a positive finite number, got {safe_repr(init_scale)}")
        init_scale = float(init_scale)  # a 2**64 would not fit the int64 scalar of mul_
        _check_seed(seed)
        self.config = {"in_features": in_features, "hidden": hidden, "out_features": out_features,
                       "depth": depth, "activation": activation, "init_scale": float(init_scale)}
        layers: list[nn.Module] = []
        with torch.random.fork_rng(devices=[]):  # a seeded init leaves the global RNG untouched
            if seed is not None:
                torch.manual_seed(seed)
            width = in_features
            for _ in range(depth):
                layers += [nn.Linear(width, hidden), ACTIVATIONS[activation]()]
                width = hidden
            layers.append(nn.Linear(width, out_features))
        self.net = nn.Sequential(*layers)
        with torch.no_grad():
            for m in self.net:
                if isinstance(m, nn.Linear):
                    m.weight.mul_(init_scale)
                    m.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


@dataclass(frozen=True)
class GPTConfig:
    """Shape of a :class:`TinyGPT`. The defaults give about 230 K parameters.

    ``vocab_size``/``seq_len`` must match the data (``TokenTask.vocab_size``/``.seq_len``);
    ``d_model`` must be divisible by ``n_heads``; ``softmax`` is one of :data:`SOFTMAX_IMPLS`. Size limits
    (``ValueError``): at most 10,000 layers, 20 billion parameters, and 80 GB for the fp32 weights plus the
    causal masks (``seq_len**2`` bytes per layer): what one 80 GB GPU holds.

    Introduced in notebook 04.
    """

    vocab_size: int = 12
    seq_len: int = 12
    d_model: int = 96
    n_layers: int = 2
    n_heads: int = 4
    mlp_ratio: int = 4
    softmax: str = "fp32"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "seq_len", "d_model", "n_layers", "n_heads", "mlp_ratio"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"GPTConfig.{name} must be a positive int, got {safe_repr(v)}")
        if self.n_layers > MAX_DEPTH:
            raise ValueError(f"GPTConfig.n_layers must be between 1 and {MAX_DEPTH:,}, got {safe_repr(self.n_layers)}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({safe_repr(self.d_model)}) must be divisible by n_heads "
                             f"({safe_repr(self.n_heads)})")
        if not isinstance(self.softmax, str) or self.softmax not in SOFTMAX_IMPLS:
            raise ValueError(f"unknown softmax {safe_repr(self.softmax)}; choose one of {SOFTMAX_IMPLS}")
        _check_size("this GPTConfig", _gpt_param_count(self), self.n_layers * self.seq_len**2)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention, written out: project, ``q @ k^T / sqrt(d)``, mask, softmax, ``@ v``.

    ``softmax_impl`` picks the softmax (see :func:`softmax`); it can be changed on a live model
    (``attn.softmax_impl = "naive"``). After each forward pass ``last_scores_absmax`` holds the largest
    ``|score|`` seen (a float), which shows how close the scores came to fp16's ``exp`` overflow.

    Introduced in notebook 04.
    """

    def __init__(self, d_model: int, n_heads: int, seq_len: int, softmax_impl: str = "fp32") -> None:
        super().__init__()
        for name, v in (("d_model", d_model), ("n_heads", n_heads), ("seq_len", seq_len)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {safe_repr(v)}")
        if d_model % n_heads:
            raise ValueError(f"d_model ({safe_repr(d_model)}) must be divisible by n_heads ({safe_repr(n_heads)})")
        if not isinstance(softmax_impl, str) or softmax_impl not in SOFTMAX_IMPLS:
            raise ValueError(f"unknown softmax {safe_repr(softmax_impl)}; choose one of {SOFTMAX_IMPLS}")
        _check_size("this attention layer", _attention_params(d_model), seq_len**2)
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.softmax_impl = softmax_impl
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        mask = torch.tril(torch.ones(seq_len, seq_len, dtype=torch.bool))
        self.register_buffer("mask", mask, persistent=False)
        self.last_scores_absmax: float | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        if t > self.mask.shape[0]:
            raise ValueError(f"sequence length {t} exceeds the model's seq_len {self.mask.shape[0]}")
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, self.d_head).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.d_head))
        self.last_scores_absmax = float(scores.detach().abs().amax())
        scores = scores.masked_fill(~self.mask[:t, :t], float("-inf"))
        att = softmax(scores, self.softmax_impl, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        return self.proj(y)


class _Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg.d_model, cfg.n_heads, cfg.seq_len, cfg.softmax)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model),
            nn.GELU(),
            nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """A decoder-only transformer: token + position embeddings, pre-LayerNorm blocks, a linear head.

    ``TinyGPT(cfg)(idx)`` maps int64 token ids of shape (batch, t <= seq_len) to logits of shape
    (batch, t, vocab_size). Weights are initialised GPT-2 style (normal, std 0.02; residual projections
    scaled by ``1/sqrt(2 * n_layers)``); pass ``seed`` to make the initialisation independent of the
    global RNG. Keyword arguments override fields of ``cfg`` (``TinyGPT(vocab_size=16, seq_len=8)``).

    Introduced in notebook 04.
    """

    def __init__(self, cfg: GPTConfig | None = None, seed: int | None = None, **overrides: object) -> None:
        super().__init__()
        if cfg is None:
            cfg = GPTConfig()
        if not isinstance(cfg, GPTConfig):
            raise TypeError(f"cfg must be a GPTConfig, got {type(cfg).__name__}")
        if overrides:
            unknown = set(overrides) - set(asdict(cfg))
            if unknown:
                raise ValueError(f"unknown GPTConfig fields {sorted(unknown)}")
            cfg = GPTConfig(**{**asdict(cfg), **overrides})  # type: ignore[arg-type]
        _check_seed(seed)
        self.config = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        self._init_weights(gen)

    def _init_weights(self, gen: torch.Generator | None) -> None:
        std_res = 0.02 / math.sqrt(2 * self.config.n_layers)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    p.zero_()
                elif ".ln" in name or name.startswith("ln_"):
                    p.fill_(1.0)
                else:
                    std = std_res if name.endswith(("attn.proj.weight", "mlp.2.weight")) else 0.02
                    p.normal_(0.0, std, generator=gen)

    @property
    def attentions(self) -> list[CausalSelfAttention]:
        """The attention modules, first block first. Introduced in notebook 04."""
        return [b.attn for b in self.blocks]

    def set_softmax(self, impl: str) -> None:
        """Switch every attention layer to softmax ``impl`` (one of :data:`SOFTMAX_IMPLS`).

        Introduced in notebook 04.
        """
        if impl not in SOFTMAX_IMPLS:
            raise ValueError(f"unknown softmax {safe_repr(impl)}; choose one of {SOFTMAX_IMPLS}")
        for a in self.attentions:
            a.softmax_impl = impl

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        if idx.dtype != torch.long or idx.dim() != 2:
            raise ValueError(f"idx must be an int64 tensor of shape (batch, t), got {idx.dtype} {tuple(idx.shape)}")
        t = idx.shape[1]
        if t > self.config.seq_len:
            raise ValueError(f"sequence length {t} exceeds seq_len {self.config.seq_len}")
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Return the mean next-token cross-entropy over positions whose target is not ``IGNORE_INDEX``.

    ``logits`` has shape (batch, t, vocab), ``targets`` (batch, t). Introduced in notebook 04.
    """
    if not isinstance(logits, torch.Tensor) or not isinstance(targets, torch.Tensor):
        raise TypeError(f"logits and targets must be tensors, got {type(logits).__name__} and "
                        f"{type(targets).__name__}")
    if logits.dim() < 2 or logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)} do not match")
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)


def count_parameters(model: nn.Module) -> int:
    """Return the number of trainable parameters of ``model``. Introduced in notebook 03."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
