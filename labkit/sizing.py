"""3D-parallelism sizing by hand: tensor x pipeline x data (ZeRO) parallel memory per GPU for a GPT-style model.

A worked calculator for "does a 70B model train on 64 GPUs of 80 GB, and with which layout?". Every number
comes from a model the workbook already has or from a formula named here:

- **Model states** are :func:`labkit.memory.model_state_bytes` (notebook 06) for the parameters one GPU holds,
  sharded by ZeRO over the data-parallel group only (``world_size=dp``): tensor and pipeline parallelism
  split the model, ZeRO then splits each model-parallel shard's states over its ``dp`` replicas.
- **Parameters** follow the plain GPT count ``12·L·h² + V·h`` (4h² attention + 8h² MLP per layer, one
  tied V x h embedding; biases, LayerNorms and position embeddings left out). A GPU holds ``P / (tp·pp)``
  of them (rounded up): the even-split approximation. Megatron-LM really splits every weight matrix,
  embedding included, over the ``tp`` ranks and gives each pipeline stage ``L/pp`` layers, but only the
  first stage holds the embedding and only the last the output head (a copy of the tied embedding), so those
  two stages hold ``V·h/tp·(1 - 1/pp)`` parameters more than the average:
  :attr:`ParallelPlan.heaviest_stage_params` and :attr:`ParallelPlan.embedding_extra_bytes` say how much;
  the total does not include it.
- **Activations** follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
  Models", the paper behind Megatron-LM's sequence parallelism and selective recomputation). With 16-bit
  activations and 1-byte dropout masks one layer stores, per micro-batch of ``b`` sequences of ``s`` tokens,
  ``s·b·h·(10 + 24/t + 5·a·s/(h·t))`` bytes under tensor parallelism of degree ``t``. The 24/t part is split
  over the TP ranks: Q and K (4), V (2), the attention projection's input (2), the GELU's input (8) and the
  second MLP matmul's input (8). The 10 part is replicated on every TP rank: the two LayerNorms' inputs (4),
  their outputs, which the column-parallel QKV and first MLP matmuls need whole (4), and the two dropout
  masks on the residual stream (2). The 5·a·s/(h·t) part is the a x s x s attention: softmax output (2),
  its dropout mask (1) and the dropout's output (2). Sequence parallelism splits the replicated part along
  the sequence too: ``s·b·h·(34/t + 5·a·s/(h·t))``.
  Selective recomputation drops the attention-score term (recomputed in backward, cheap in FLOPs);
  full recomputation keeps only each layer's 16-bit input, ``2·s·b·h`` (``2·s·b·h/t`` with sequence
  parallelism, where that input is split along the sequence). A recomputed layer's activations exist again
  while that layer runs backward: :func:`plan_3d` counts that one layer as the recomputation working set.
  The embedding's and the output layer's activations (logits), temporary buffers, the communication buckets,
  the CUDA context and fragmentation are not counted: keep ``reserve_bytes`` for them.
- **Pipeline** (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
  Megatron-LM"): ``m = B / (b·dp)`` micro-batches per step. GPipe runs all m forwards before any backward,
  so a stage keeps the activations of all m; 1F1B starts backward as soon as the last stage can, so the
  first stage (the fullest) keeps at most ``min(pp, m)``. Either way the bubble is ``(pp - 1)/(m + pp - 1)``
  (:func:`labkit.handpar.bubble_fraction`).

Why tensor parallelism stays inside a node (``tp <= gpus_per_node``): every layer all-reduces its activations
(two all-reduces of ``s·b·h`` values forward and two backward; with sequence parallelism all-gathers and
reduce-scatters of the same volume) on the critical path, where nothing else can run meanwhile, so it needs
NVLink bandwidth (hundreds of GB/s per GPU) rather than the network's (tens of GB/s per GPU). Pipeline
parallelism sends one ``s·b·h`` activation per micro-batch and stage boundary, and data parallelism reduces
gradients once per step, overlapped with backward: both cross nodes well. Ranks are laid out as in
Megatron-LM (:func:`parallel_groups`): TP groups are consecutive ranks, so a group of ``tp`` dividing the
node size sits in one node.

``GB`` is :data:`labkit.memory.GB` (10**9 bytes).

Introduced in notebook 11.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from labkit import handpar, memory
from labkit._validate import as_float, safe_repr
from labkit.activations import ActivationEstimate, check_count
from labkit.i18n import N_
from labkit.i18n import gettext as _
from labkit.memory import GB, ModelState

__all__ = [
    "DEFAULT_POLICY",
    "MAX_GPUS",
    "RECOMPUTE",
    "SCHEDULES",
    "SHAPES",
    "ParallelPlan",
    "TransformerShape",
    "layer_activation_bytes",
    "live_micro_batches",
    "parallel_groups",
    "plan_3d",
    "search_plans",
]

#: The precision policy by default: DeepSpeed's estimators' mixed precision, 20 B/param with Adam (bf16 params
#: and grads, fp32 grads, fp32 master, Adam's two fp32 moments). At ZeRO-1 DeepSpeed keeps the bf16 gradients
#: whole (micro-batches accumulate there) and shards the fp32 gradient partition with the optimizer. Megatron-LM's
#: distributed optimizer differs: it accumulates into a whole fp32 ``main_grad`` and keeps no bf16 gradient, so at
#: ZeRO-1 it holds 2 + 4 + 12/dp B/param, which :func:`labkit.memory.model_state_bytes` does not model (its
#: ``"bf16-master-fp32-grads"`` shards the fp32 gradients at stage 1): add it by hand (notebook 11 does).
DEFAULT_POLICY = "bf16-master-fp32-accum"

#: Activation recomputation modes: Korthikanti et al.'s none, selective (attention scores) and full (per layer).
RECOMPUTE = ("none", "selective", "full")

#: Pipeline schedules: GPipe (all forwards, then all backwards) and 1F1B (one forward, one backward).
SCHEDULES = ("1f1b", "gpipe")

#: The largest GPU count the functions accept (a bound that keeps the searches small).
MAX_GPUS = 2**17


# ----------------------------------------------------------------------------------------------------
# The model's shape
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TransformerShape:
    """A GPT-style decoder's shape: ``layers`` L, ``hidden`` h, ``heads`` a, ``seq_len`` s, ``vocab`` V.

    ``n_params`` is the plain GPT count ``12·L·h² + V·h`` (4h² attention and 8h² MLP weights per layer, one
    tied embedding; no biases, LayerNorms or position embeddings). For a Llama-like model this undercounts:
    Llama-2-70B's shape (L=80, h=8192, a=64, V=32000) gives about 64.7e9 here, not 69e9, because Llama's
    SwiGLU MLP (3 matrices of h x 28672) is larger than 8h² and its grouped-query attention smaller than 4h².

    Introduced in notebook 11.
    """

    layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    name: str = "GPT"

    def __post_init__(self) -> None:
        for field_name in ("layers", "hidden", "heads", "seq_len", "vocab"):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{field_name} must be an int, got {type(value).__name__}")
            if value < 1:
                raise ValueError(f"{field_name} must be >= 1, got {value}")
        if not isinstance(self.name, str):
            raise TypeError(f"name must be a str, got {type(self.name).__name__}")
        if self.hidden % self.heads:
            raise ValueError(f"heads ({self.heads}) must divide hidden ({self.hidden})")

    @property
    def n_params(self) -> int:
        """Parameters by the plain GPT formula ``12·L·h² + V·h``."""
        return 12 * self.layers * self.hidden**2 + self.vocab * self.hidden

    @property
    def layer_params(self) -> int:
        """Parameters of one transformer layer, ``12·h²``."""
        return 12 * self.hidden**2

    def describe(self) -> str:
        """One line: the name, the shape and the parameter count."""
        return _("{name} (L={layers}, h={hidden}, a={heads}, s={seq_len}, V={vocab}): {n:.2f}e9 params by "
                 "12·L·h² + V·h").format(name=_(self.name), layers=self.layers,
                                         hidden=self.hidden, heads=self.heads, seq_len=self.seq_len,
                                         vocab=self.vocab, n=self.n_params / 1e9)


#: Llama-2-like shapes for the keys of :data:`labkit.memory.MODEL_PRESETS` that have one. The presets there are
#: bare parameter counts (70e9 for "70B"); the activations need a shape, and the GPT formula on these shapes
#: gives 6.57e9, 12.75e9 and 64.69e9 parameters.
SHAPES: dict[str, TransformerShape] = {
    "7B": TransformerShape(32, 4096, 32, 4096, 32000, N_("GPT with Llama-2-7B's shape")),
    "13B": TransformerShape(40, 5120, 40, 4096, 32000, N_("GPT with Llama-2-13B's shape")),
    "70B": TransformerShape(80, 8192, 64, 4096, 32000, N_("GPT with Llama-2-70B's shape")),
}


def _shape(model: object) -> TransformerShape:
    if isinstance(model, TransformerShape):
        return model
    if not isinstance(model, str):
        raise TypeError(f"model must be a TransformerShape or one of {sorted(SHAPES)}, got {type(model).__name__}")
    if model not in SHAPES:
        hint = (" (labkit.memory.MODEL_PRESETS has it as a parameter count only; pass a TransformerShape)"
                if model in memory.MODEL_PRESETS else "")
        raise ValueError(f"no shape for model {safe_repr(model)}{hint}; choose one of {sorted(SHAPES)} "
                         "or pass a TransformerShape(layers, hidden, heads, seq_len, vocab)")
    return SHAPES[model]


def _degree(name: str, value: object) -> int:
    n = check_count(name, value, 1)
    if n > MAX_GPUS:
        raise ValueError(f"{name} must be <= {MAX_GPUS}, got {n}")
    return n


def _choice(name: str, value: object, options: tuple[str, ...]) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, one of {list(options)}, got {type(value).__name__}")
    v = value.strip().lower()
    if v not in options:
        raise ValueError(f"{name} must be one of {list(options)}, got {safe_repr(value)}")
    return v


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__}")
    return value


def _bytes(name: str, value: object, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of bytes, got {type(value).__name__}")
    if not math.isfinite(as_float(name, value)) or value < 0 or (positive and value == 0):
        raise ValueError(f"{name} must be a finite number {'> 0' if positive else '>= 0'}, got {safe_repr(value)}")
    return value


# ----------------------------------------------------------------------------------------------------
# The formulas
# ----------------------------------------------------------------------------------------------------


def layer_activation_bytes(model: TransformerShape | str, micro_batch: int, tp: int = 1,
                           sequence_parallel: bool = False, recompute: str = "none") -> int:
    """Bytes one transformer layer keeps for backward per micro-batch on one GPU (Korthikanti et al. 2022).

    ``s·b·h·(10 + 24/t + 5·a·s/(h·t))`` with tensor parallelism ``t``; ``s·b·h·(34/t + 5·a·s/(h·t))`` with
    sequence parallelism; ``recompute="selective"`` drops the ``5·a·s/(h·t)`` attention term; ``"full"`` keeps
    only the layer's 16-bit input, ``2·s·b·h`` (``2·s·b·h/t`` with sequence parallelism). Exact integers:
    ``t`` divides ``a`` and ``h``. (:func:`labkit.activations.gpt_activation_bytes` counts TinyGPT's fp32/CPU
    autocast layout op by op, without tensor parallelism; this is the paper's 16-bit Megatron layout.)

    Introduced in notebook 11.
    """
    shape = _shape(model)
    b = check_count("micro_batch", micro_batch, 1)
    t = _degree("tp", tp)
    sp = _flag("sequence_parallel", sequence_parallel)
    mode = _choice("recompute", recompute, RECOMPUTE)
    s, h, a = shape.seq_len, shape.hidden, shape.heads
    if a % t:
        raise ValueError(f"tp must divide the number of attention heads ({a}), got {t}")
    if h % t:
        raise ValueError(f"tp must divide the hidden size ({h}), got {t}")
    sbh = s * b * h
    if mode == "full":
        return 2 * sbh // t if sp else 2 * sbh
    replicated = 10 * sbh // t if sp else 10 * sbh   # LayerNorm inputs and outputs, residual dropout masks
    split = 24 * sbh // t                            # Q, K, V, projection input, GELU input, 2nd MLP input
    scores = 5 * a * s * s * b // t                  # softmax output, its dropout mask and output: 5·a·s²·b/t
    return replicated + split + (0 if mode == "selective" else scores)


def live_micro_batches(pp: int, micro_batches: int, schedule: str = "1f1b") -> int:
    """Micro-batches whose activations the first pipeline stage holds at once: ``min(pp, m)`` under 1F1B, ``m``
    under GPipe (all forwards before any backward).

    Introduced in notebook 11.
    """
    p = _degree("pp", pp)
    m = check_count("micro_batches", micro_batches, 1)
    return min(p, m) if _choice("schedule", schedule, SCHEDULES) == "1f1b" else m


def parallel_groups(tp: int, pp: int, dp: int) -> dict[str, list[list[int]]]:
    """The communication groups of a tp x pp x dp layout, ranks ordered as in Megatron-LM: TP fastest, then DP,
    then PP, so ``rank = t + tp·(d + dp·p)``. Returns ``{"tp": [...], "dp": [...], "pp": [...]}``, each a list of
    groups (lists of ranks): TP groups are ``tp`` consecutive ranks (inside a node when ``tp`` divides its size),
    DP groups have stride ``tp``, PP groups stride ``tp·dp``.

    Introduced in notebook 11.
    """
    t, p, d = _degree("tp", tp), _degree("pp", pp), _degree("dp", dp)
    if t * p * d > MAX_GPUS:
        raise ValueError(f"tp*pp*dp must be <= {MAX_GPUS}, got {t * p * d}")

    def rank(i: int, j: int, k: int) -> int:  # tp rank i, dp rank j, pp rank k
        return i + t * (j + d * k)

    return {
        "tp": [[rank(i, j, k) for i in range(t)] for k in range(p) for j in range(d)],
        "dp": [[rank(i, j, k) for j in range(d)] for k in range(p) for i in range(t)],
        "pp": [[rank(i, j, k) for k in range(p)] for j in range(d) for i in range(t)],
    }


# ----------------------------------------------------------------------------------------------------
# One plan, and the search over plans
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParallelPlan:
    """Memory per GPU of one tp x pp x dp layout (what :func:`plan_3d` returns); byte counts are ints.

    ``params_per_gpu``: ``ceil(P / (tp·pp))``. ``model_state``: :func:`labkit.memory.model_state_bytes` for them,
    ZeRO over ``dp``. ``act_per_layer``: :func:`layer_activation_bytes` with the chosen recomputation.
    ``activations``: an :class:`~labkit.activations.ActivationEstimate` for the first stage: ``per_layer``
    without recomputation, ``activations`` = layers per stage x ``act_per_layer`` x live micro-batches,
    ``peak`` adds one recomputed layer, ``tokens`` = s·b. :meth:`lines` prints the breakdown in GB.

    Introduced in notebook 11.
    """

    shape: TransformerShape
    n_gpus: int
    gpu_bytes: float
    gpus_per_node: int
    tp: int
    pp: int
    dp: int
    zero: int
    micro_batch: int
    global_batch: int
    micro_batches: int
    policy: str
    optimizer: str
    recompute: str
    sequence_parallel: bool
    schedule: str
    reserve_bytes: int
    params_per_gpu: int
    largest_layer_params: int
    model_state: ModelState
    act_per_layer: int
    layers_per_stage: int
    live_micro_batches: int
    activations: ActivationEstimate
    bubble: float

    @property
    def model_parallel(self) -> int:
        """The model-parallel degree ``tp·pp``: GPUs that share one copy of the model."""
        return self.tp * self.pp

    @property
    def model_state_bytes(self) -> int:
        """Model-state bytes on one GPU (``model_state.device_total``)."""
        return self.model_state.device_total

    @property
    def activation_bytes(self) -> int:
        """Activation bytes kept on the first stage: layers per stage x per-layer bytes x live micro-batches."""
        return self.activations.activations

    @property
    def recompute_bytes(self) -> int:
        """The recomputation working set: one layer's recomputed activations, while it runs backward."""
        return self.activations.peak - self.activations.activations

    @property
    def total_bytes(self) -> int:
        """Model states + activations + recomputation working set + ``reserve_bytes`` (rounded up to a byte)."""
        return self.model_state_bytes + self.activations.peak + self.reserve_bytes

    @property
    def fits(self) -> bool:
        """Whether :attr:`total_bytes` fits in ``gpu_bytes``."""
        return self.total_bytes <= self.gpu_bytes

    @property
    def tp_within_node(self) -> bool:
        """Whether each TP group sits inside one node (``tp`` divides ``gpus_per_node``)."""
        return self.gpus_per_node % self.tp == 0

    @property
    def heaviest_stage_params(self) -> int:
        """Parameters on a GPU of the first (or last) stage: its layers plus the embedding (head), both / tp."""
        s = self.shape
        return (self.layers_per_stage * s.layer_params + s.vocab * s.hidden) // self.tp

    @property
    def embedding_extra_bytes(self) -> int:
        """Model-state bytes the first/last stage holds beyond the even split (0 for pp=1); not in the total."""
        extra = self.heaviest_stage_params - self.params_per_gpu
        if extra <= 0:
            return 0
        heavy = memory.model_state_bytes(self.heaviest_stage_params, self.policy, self.optimizer,
                                         stage=self.zero, world_size=self.dp,
                                         largest_layer_params=self.largest_layer_params)
        return heavy.device_total - self.model_state_bytes

    def lines(self) -> list[str]:
        """The breakdown, one item a line, bytes in GB (10**9)."""
        gb = memory.fmt_bytes
        s = self.shape
        node = (_("inside a node") if self.tp_within_node
                else _("ACROSS nodes of {per_node}").format(per_node=self.gpus_per_node))
        live = (_("{live} live micro-batch") if self.live_micro_batches == 1
                else _("{live} live micro-batches")).format(live=self.live_micro_batches)
        recompute = (_("recompute {mode}, sequence parallel") if self.sequence_parallel
                     else _("recompute {mode}")).format(mode=self.recompute)
        out = [
            f"{s.describe()}",
            _("layout        tp={tp} x pp={pp} x dp={dp} = {n} GPUs of {gpu}").format(
                tp=self.tp, pp=self.pp, dp=self.dp, n=self.n_gpus, gpu=gb(self.gpu_bytes)),
            _("groups        TP of {tp} ({node}), PP of {pp}, DP of {dp}").format(
                tp=self.tp, node=node, pp=self.pp, dp=self.dp),
            _("batch         B={B} = b={b} x dp={dp} x m={m} micro-batches").format(
                B=self.global_batch, b=self.micro_batch, dp=self.dp, m=self.micro_batches),
            _("params/GPU    {params:.3f}e9 (P/(tp·pp))").format(params=self.params_per_gpu / 1e9),
            _("model states  {states:>10} (ZeRO-{zero} over dp={dp}; {policy} + {optimizer}, {bpp} B/param "
              "unsharded)").format(states=gb(self.model_state_bytes), zero=self.zero, dp=self.dp,
                                   policy=self.policy, optimizer=self.optimizer,
                                   bpp=memory.bytes_per_param(self.policy, self.optimizer)),
            _("activations   {acts:>10} ({layers} layers x {per_layer} x {live}, {schedule}; {recompute})").format(
                acts=gb(self.activation_bytes), layers=self.layers_per_stage, per_layer=gb(self.act_per_layer),
                live=live, schedule=self.schedule.upper(), recompute=recompute),
        ]
        if self.recompute != "none":
            out.append(_("recompute     {recomputed:>10} (one layer's recomputed activations in backward)").format(
                recomputed=gb(self.recompute_bytes)))
        if self.reserve_bytes:
            out.append(_("reserve       {reserve:>10}").format(reserve=gb(self.reserve_bytes)))
        free = self.gpu_bytes - self.total_bytes
        verdict = (_("fits, {free} free").format(free=gb(free)) if self.fits
                   else _("does NOT fit, {over} over").format(over=gb(-free)))
        out.append(_("total         {total:>10} of {gpu}: {verdict}").format(
            total=gb(self.total_bytes), gpu=gb(self.gpu_bytes), verdict=verdict))
        out.append(_("bubble        {bubble:.1f}% ((pp-1)/(m+pp-1) = {num}/{den})").format(
            bubble=100 * self.bubble, num=self.pp - 1, den=self.micro_batches + self.pp - 1))
        if self.pp > 1:
            out.append(_("embedding     first/last stage +{extra} of model states (V·h/tp·(1-1/pp) more params; "
                         "not in the total)").format(extra=gb(self.embedding_extra_bytes)))
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


def plan_3d(
    n_gpus: int = 64,
    gpu_bytes: float = 80 * GB,
    tp: int = 8,
    pp: int = 1,
    dp: int = 8,
    *,
    model: TransformerShape | str = "70B",
    zero: int = 1,
    micro_batch: int = 1,
    global_batch: int = 1024,
    policy: str = DEFAULT_POLICY,
    optimizer: str = "adam",
    recompute: str = "selective",
    sequence_parallel: bool = True,
    schedule: str = "1f1b",
    gpus_per_node: int = 8,
    reserve_bytes: float = 0,
) -> ParallelPlan:
    """Memory per GPU of training ``model`` on ``n_gpus`` GPUs of ``gpu_bytes`` with a tp x pp x dp layout.

    ``tp·pp·dp`` must equal ``n_gpus``; ``tp`` must divide the heads and the hidden size, ``pp`` the layers;
    ``global_batch`` must be a multiple of ``micro_batch·dp`` (``m = B/(b·dp)`` micro-batches per step).
    ``zero`` (0-3) shards over the ``dp`` replicas only. ``policy`` must compute in 16 bits (the activation
    formula's assumption). Defaults: the 70B example, ZeRO-1 in DeepSpeed's layout (:data:`DEFAULT_POLICY`), selective
    recomputation with sequence parallelism (Korthikanti et al.'s recommendation), 1F1B, B = 1024 sequences
    (Llama 2's 4M tokens at s=4096). ZeRO-3's gathered working set is the largest weight matrix on the GPU,
    ``max(4h², V·h)/tp`` (as DeepSpeed's estimator counts). DeepSpeed's pipeline engine runs ZeRO-1 at most;
    stages 2-3 with ``pp > 1`` are memory arithmetic only. See the module docstring for the model.

    Introduced in notebook 11.
    """
    shape = _shape(model)
    n = _degree("n_gpus", n_gpus)
    gpu = _bytes("gpu_bytes", gpu_bytes, positive=True)
    t, p, d = _degree("tp", tp), _degree("pp", pp), _degree("dp", dp)
    if t * p * d != n:
        raise ValueError(f"tp*pp*dp must equal the number of GPUs ({n}), got {t}*{p}*{d} = {t * p * d}")
    if isinstance(zero, bool) or not isinstance(zero, int):
        raise TypeError(f"zero must be an int ZeRO stage 0, 1, 2 or 3, got {type(zero).__name__}")
    if zero not in (0, 1, 2, 3):
        raise ValueError(f"zero must be a ZeRO stage 0, 1, 2 or 3, got {zero}")
    b = check_count("micro_batch", micro_batch, 1)
    big_b = check_count("global_batch", global_batch, 1)
    if shape.heads % t:
        raise ValueError(f"tp must divide the number of attention heads ({shape.heads}), got {t}")
    if shape.layers % p:
        raise ValueError(f"pp must divide the number of layers ({shape.layers}), got {p}")
    if big_b % (b * d):
        raise ValueError(f"global_batch must be a multiple of micro_batch*dp = {b}*{d} = {b * d}, got {big_b}")
    pol = memory.get_policy(policy)
    if pol.compute_dtype.itemsize != 2:
        raise ValueError(f"policy {safe_repr(pol.name)} computes in {pol.compute_dtype}; the activation formula assumes "
                         "16-bit activations: choose a bf16/fp16 policy")
    opt = memory.get_optimizer(optimizer)
    mode = _choice("recompute", recompute, RECOMPUTE)
    sp = _flag("sequence_parallel", sequence_parallel)
    sched = _choice("schedule", schedule, SCHEDULES)
    per_node = _degree("gpus_per_node", gpus_per_node)
    reserve = math.ceil(_bytes("reserve_bytes", reserve_bytes, positive=False))  # whole bytes: exact sums

    m = big_b // (b * d)
    params = -(-shape.n_params // (t * p))
    largest = min(params, max(4 * shape.hidden**2, shape.vocab * shape.hidden) // t)
    state = memory.model_state_bytes(params, pol, opt, stage=zero, world_size=d, largest_layer_params=largest)
    stored = layer_activation_bytes(shape, b, t, sp, mode)
    full = layer_activation_bytes(shape, b, t, sp, "none")
    layers = shape.layers // p
    live = live_micro_batches(p, m, sched)
    acts = layers * stored * live
    est = ActivationEstimate(per_layer=full, activations=acts, weight_copies=0, peak=acts + (full - stored),
                             tokens=shape.seq_len * b)
    return ParallelPlan(
        shape=shape, n_gpus=n, gpu_bytes=gpu, gpus_per_node=per_node, tp=t, pp=p, dp=d, zero=zero,
        micro_batch=b, global_batch=big_b, micro_batches=m, policy=pol.name, optimizer=opt.name,
        recompute=mode, sequence_parallel=sp, schedule=sched, reserve_bytes=reserve, params_per_gpu=params,
        largest_layer_params=largest, model_state=state, act_per_layer=stored, layers_per_stage=layers,
        live_micro_batches=live, activations=est, bubble=handpar.bubble_fraction(p, m),
    )


def _divisors(n: int) -> list[int]:
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    return sorted(set(small + [n // k for k in small]))


def search_plans(
    n_gpus: int = 64,
    gpu_bytes: float = 80 * GB,
    *,
    model: TransformerShape | str = "70B",
    zero: int = 1,
    micro_batch: int = 1,
    global_batch: int = 1024,
    policy: str = DEFAULT_POLICY,
    optimizer: str = "adam",
    recompute: str = "selective",
    sequence_parallel: bool = True,
    schedule: str = "1f1b",
    gpus_per_node: int = 8,
    reserve_bytes: float = 0,
    fitting_only: bool = True,
) -> list[ParallelPlan]:
    """Every tp x pp x dp layout of ``n_gpus`` that fits (all of them with ``fitting_only=False``), best first.

    Candidates: ``tp`` divides ``gpus_per_node`` (each TP group inside one node), the heads and the hidden size;
    ``pp`` divides the layers; ``global_batch`` is a multiple of ``micro_batch·dp``; ``tp·pp·dp == n_gpus``.
    Other arguments as in :func:`plan_3d`. Preference: fitting plans first, then the smallest model-parallel
    degree ``tp·pp`` (the most data parallelism: the least communication on the critical path), then the
    smallest pipeline bubble, then the least memory per GPU, then the smaller ``tp``. So ``search_plans()[0]``
    is the smallest model-parallel degree that fits. Returns ``[]`` when none fits.

    Introduced in notebook 11.
    """
    shape = _shape(model)
    n = _degree("n_gpus", n_gpus)
    per_node = _degree("gpus_per_node", gpus_per_node)
    b = check_count("micro_batch", micro_batch, 1)
    big_b = check_count("global_batch", global_batch, 1)
    only_fit = _flag("fitting_only", fitting_only)
    common: dict[str, Any] = dict(model=shape, zero=zero, micro_batch=b, global_batch=big_b, policy=policy,
                  optimizer=optimizer, recompute=recompute, sequence_parallel=sequence_parallel, schedule=schedule,
                  gpus_per_node=per_node, reserve_bytes=reserve_bytes)
    plan_3d(1, gpu_bytes, 1, 1, 1, **{**common, "global_batch": b})  # checks the other arguments once, up front
    plans = []
    for t in _divisors(n):
        if per_node % t or shape.heads % t or shape.hidden % t:
            continue
        for p in _divisors(n // t):
            d = n // (t * p)
            if shape.layers % p or big_b % (b * d):
                continue
            plans.append(plan_3d(n, gpu_bytes, t, p, d, **common))
    if only_fit:
        plans = [x for x in plans if x.fits]
    return sorted(plans, key=lambda x: (not x.fits, x.model_parallel, x.bubble, x.total_bytes, x.tp))
