# %% [markdown]
# # 17 · The low-precision frontier: FP8 scaling, MX and NVFP4
#
# Notebook 05 scaled FP8 the way Transformer Engine did in 2023: one scale per tensor, taken from an amax history.
# Training has moved on. torchao dropped delayed scaling and scales each tensor (or each row) from its own values;
# DeepSeek-V3 trained in FP8 with a scale per 1 × 128 block of activations and per 128 × 128 block of weights; the
# OCP Microscaling (MX) formats give every 32 elements a shared power-of-two scale; NVIDIA's NVFP4 gives every 16
# elements an FP8 scale and trains in 4 bits. Only recent GPUs run these natively (Ada and Hopper FP8, Blackwell MX
# and NVFP4), but every one of them is arithmetic on bits, so a CPU can reproduce it: the quantised values here are
# those of torchao's reference implementation, bit for bit. Sums and training curves come as close as the order of
# accumulation allows, and the speed is missing.
#
# **Objectives**
# - quantise real activations and gradients down the **scaling ladder**: per-tensor (delayed and current),
#   rowwise, blockwise 1 × 128, MX (32) and NVFP4 (16 + one per tensor), and measure for each the error, the bytes
#   of scales per element and how far one outlier's damage spreads;
# - compute an **MX shared exponent** by hand, and see why rounding it down (the spec) saturates and rounding it
#   up (the 2025 MXFP8 recipe) does not;
# - run **matmuls in the formats** with FP32 accumulation, and see why DeepSeek-V3 promotes the partial sums to
#   FP32 every 128 elements of K;
# - **train** the tiny GPT with emulated FP8, MXFP8 and NVFP4 linear layers, forward and backward, and measure
#   what NVFP4's stochastic rounding and random Hadamard transform do;
# - know which GPU runs which format natively, and what an emulation can and cannot tell you.
#
# **Prerequisites:** notebook 01 (bit layouts, FP4 and E8M0), notebook 05 (FP8, per-tensor and delayed scaling).
#
# **Estimated time:** 60 min

# %%
# %matplotlib inline
import inspect

import matplotlib.pyplot as plt
import ml_dtypes
import numpy as np
import torch

from labkit import data, device, formats, fp8, models, qtrain
from labkit import microscaling as mx
from labkit.check import check, predict, reveal
from labkit.exercises.nb17 import RECIPE_CHOICES, SITUATIONS, exercise_blocks, round_to

torch.set_num_threads(1)  # tiny models: one thread is fastest (and CI shares 2 cores)
caps = device.capabilities()

# %% [markdown]
# ## 1. The formats, and a tiny model to take tensors from
#
# The element formats get narrower (FP8, FP6, FP4), and the scale becomes a format of its own: E8M0 is an exponent
# with no sign and no mantissa (a power of two from 2^-127 to 2^127, NaN at 0xFF); NVFP4 uses E4M3 as its scale.
# Notebook 01 shows their bits. What matters below is how few values an element can take: FP4 E2M1 has 15.

# %%
print(formats.table(["e4m3fn", "e5m2", "e2m3fn", "e3m2fn", "e2m1fn", "e8m0fnu"]))
fp4 = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float64)  # ml_dtypes decodes
print("FP4 E2M1:", sorted(set(fp4.tolist())))
assert np.array_equal(formats.round_array(fp4, "e2m1fn"), fp4)  # labkit's rounding keeps every FP4 value

# %% [markdown]
# The tensors to quantise come from training: the tiny GPT of notebooks 04 and 05 learns to reverse 6 digits, in
# float64, so that every number below prints the same on every CPU (float32 kernels differ between CPUs in their
# last bits, and a quantiser turns a last-bit difference into a whole step; in float64 the differences stay near
# 1e-16, far below every printed digit). The run records the input of one MLP
# projection (an activation, 256 channels) and the gradient of its output at every step. This is also the reference
# run of section 5.

# %%
task = data.make_token_task("reverse", n=4096, n_digits=6, vocab_size=12, seed=0)
batches = data.Batches(task.inputs, task.targets, batch_size=32, seed=0)
STEPS, ACT_LAYER, GRAD_LAYER = 60, "blocks.1.mlp.2", "blocks.1.mlp.0"

def train_run(cfg=None, steps=STEPS, tap=None, seed=0):
    model = models.TinyGPT(vocab_size=task.vocab_size, seq_len=task.seq_len, d_model=64, seed=seed).double()
    if cfg is not None:  # every linear layer of the blocks becomes a QLinear; the head stays in high precision
        qtrain.quantise_linears(model, cfg, skip=("head",))
    tapper = fp8.TensorTap(model, layers=[ACT_LAYER, GRAD_LAYER], keep_all=True) if tap else None
    opt, losses = torch.optim.AdamW(model.parameters(), lr=3e-3), []
    for step in range(steps):
        x, y = batches(step)
        loss = models.lm_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, tapper

ref_losses, tap = train_run(tap=True)
acts = [a.reshape(-1, 256) for a in tap.activations[ACT_LAYER]]  # (tokens, channels): 384 x 256 per step
grads = [g.reshape(-1, 256) for g in tap.gradients[GRAD_LAYER]]
grad_inputs = [a.reshape(-1, 64) for a in tap.activations[GRAD_LAYER]]  # that layer's input: for its wgrad
print(f"{len(acts)} steps, loss {ref_losses[0]:.3f} -> {ref_losses[-1]:.3f}; activation {tuple(acts[-1].shape)}, "
      f"gradient {tuple(grads[-1].shape)}")

# %% [markdown]
# Real LLM activations have a few **outlier channels**, 10 to 100 times larger than the rest, in the same channels
# for every token (Dettmers et al., LLM.int8(), 2022; SmoothQuant, 2023): they are why per-tensor INT8 and FP8 fail
# on large models. A model this small does not grow them, so the copy below multiplies three channels of the real
# activation by 50. The gradient stays as it is: gradients span many binades on their own (notebook 03).

# %%
act = acts[-1].clone()
OUTLIER_CHANNELS = [7, 100, 201]
act[:, OUTLIER_CHANNELS] *= 50.0
grad = grads[-1]
def spread(x):  # largest / median magnitude, zeros left out
    m = x.abs()[x != 0]
    return float(m.max() / m.median())

print(f"amax / median |x|: activation {spread(act):.0f}, gradient {spread(grad):.0f}")

# %% [markdown]
# ## 2. The scaling ladder
#
# Every scheme stores `x ≈ element × scale`, and differs in which elements share a scale. `labkit.microscaling`
# writes each one out (read it: each is a dozen lines), and is checked bit for bit against torchao's MX and NVFP4
# reference code:
#
# | scheme | elements sharing a scale | scale format | used by |
# |---|---|---|---|
# | per-tensor, delayed | the tensor; scale from earlier steps' amax | FP32 | Transformer Engine (2022) |
# | per-tensor, current | the tensor; scale from its own amax | FP32 | torchao's default float8 |
# | rowwise | one row of K values | FP32 (torchao rounds it to a power of two) | torchao "rowwise" |
# | blockwise | 1 × 128 (activations), 128 × 128 (weights) | FP32 | DeepSeek-V3 |
# | MXFP8 | 1 × 32 | E8M0 (a power of two) | OCP MX v1.0, Blackwell |
# | NVFP4 | 1 × 16, plus one per tensor | E4M3, plus FP32 | NVIDIA Blackwell |
#
# The error measure is the signal-to-noise ratio, SNR = 10 log10(Σx² / Σ(x − x̂)²) in decibels: each mantissa bit
# is worth about 6 dB. It is measured twice on the activation: over the whole tensor, and over the 253 ordinary
# channels only (`rest`), the values an outlier can hurt. Each scheme runs with FP8 E4M3 elements and with FP4
# E2M1 elements (MX with 32 is then MXFP8 and MXFP4; NVFP4 is FP4 only). Delayed scaling (FP8 only) takes its
# scale from the amaxes of the 16 steps before, by Transformer Engine's rule (notebook 05).

# %%
def snr_db(x, xq):
    x, xq = x.double(), xq.double()
    return float(10 * torch.log10(x.pow(2).sum() / (x - xq).pow(2).sum()))

def delayed(x, history, fmt="e4m3fn"):
    ds = fp8.DelayedScaling(fmt, history_len=16)
    for past in history[-17:-1]:  # the 16 steps before this one
        ds.update(fp8.amax(past))
    return fp8.roundtrip(x, fmt, ds.scale)

# %%
SCHEMES = {  # name: (elements per scale, quantiser(x, element format))
    "per-tensor": (None, mx.per_tensor), "rowwise": (256, mx.rowwise),
    "blockwise 1x128": (128, lambda x, f: mx.blockwise(x, (1, 128), f)),
    "MX 32 (E8M0)": (32, lambda x, f: mx.mx(x, f, scale_rounding="rceil")),
    "NVFP4 16 (E4M3)": (16, lambda x, f: mx.nvfp4(x) if f == "e2m1fn" else None),
}
REST = [c for c in range(256) if c not in OUTLIER_CHANNELS]
table = {}
for name, (_, quantise) in SCHEMES.items():
    for f in ("e4m3fn", "e2m1fn"):
        qa, qg = quantise(act, f), quantise(grad, f)
        if qa is not None:
            da = qa.dequantise()
            table[name, f] = (snr_db(act, da), snr_db(act[:, REST], da[:, REST]), snr_db(grad, qg.dequantise()),
                              mx.scale_bytes_per_element(qa))

# %%
def free_blocks(size):  # how many of a row's blocks hold no outlier channel
    size = size or 256
    return sum(not any(b <= c < b + size for c in OUTLIER_CHANNELS) for b in range(0, 256, size)), 256 // size

print(f"{'scheme':<16}{'format':>7} | {'activation: all, rest':>22} | {'gradient':>9} | scale B/el | clean blocks")
for (name, f), (s_all, s_rest, s_grad, sb) in table.items():
    free, n = free_blocks(SCHEMES[name][0])
    print(f"{name:<16}{'FP8' if f == 'e4m3fn' else 'FP4':>7} | {s_all:>9.1f} dB {s_rest:>6.1f} dB | "
          f"{s_grad:>6.1f} dB | {sb:>10.5f} | {free:>2} of {n}")
hist = [a.clone() for a in acts]
for a in hist:
    a[:, OUTLIER_CHANNELS] *= 50.0
stale = max(fp8.amax(g) for g in grads[-17:-1]) / fp8.amax(grad)
d_grad, c_grad = snr_db(grad, delayed(grad, grads)), table["per-tensor", "e4m3fn"][2]
print(f"per-tensor delayed, FP8: activation {snr_db(act, delayed(act, hist)):.1f} dB, gradient {d_grad:.1f} dB: "
      f"the history's amax is {stale:.2f}x this gradient's, so its scale leaves {np.log2(stale):.1f} binades of E4M3 "
      f"unused, and the gradient's SNR moves by {d_grad - c_grad:+.1f} dB against current scaling")

# %%
rest = {k: v[1] for k, v in table.items()}
fp4_ladder = [rest[n, "e2m1fn"] for n in SCHEMES]  # coarse to fine
assert all(a + 1 < b for a, b in zip(fp4_ladder, fp4_ladder[1:]))  # in FP4 every finer step helps the rest
fp8_rest = [rest[n, "e4m3fn"] for n in SCHEMES if (n, "e4m3fn") in rest]
assert max(fp8_rest) - min(fp8_rest) < 1  # in FP8 the rest does not care: E4M3 spans 15 binades of normals
fp8_all = {n: table[n, "e4m3fn"][0] for n in ("per-tensor", "rowwise", "blockwise 1x128", "MX 32 (E8M0)")}
assert fp8_all["per-tensor"] < fp8_all["rowwise"] < fp8_all["blockwise 1x128"]  # FP32 scales: amax lands on 448
pow2 = 2.0 ** torch.ceil(torch.log2(act.abs().max() / 448))  # one power-of-two scale, rounded up as MX's RCEIL
assert abs(snr_db(act, (act / pow2).to(torch.float8_e4m3fn).double() * pow2) - fp8_all["MX 32 (E8M0)"]) < 0.05

# %%
fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 3.5))
for f, label in (("e4m3fn", "FP8 E4M3"), ("e2m1fn", "FP4 E2M1")):
    names = [n for n in SCHEMES if (n, f) in table]
    sizes = [SCHEMES[n][0] or act.numel() for n in names]
    ax0.plot(sizes, [table[n, f][1] for n in names], "o-", label=label)
    ax1.plot(sizes, [table[n, f][2] for n in names], "o-", label=label)
ax0.set(title="activation, ordinary channels", ylabel="SNR (dB)")
ax1.set(title="gradient")
for ax in (ax0, ax1):
    ax.set(xscale="log", xlabel="elements per scale (per-tensor at the left)")
    ax.invert_xaxis(), ax.legend()
plt.show()

# %% [markdown]
# Two findings, both in the numbers above. **In FP8**, the ordinary channels come out the same at every granularity:
# E4M3 has 15 binades of normal numbers, so values 50 times below the outliers keep their 3 mantissa bits whatever
# the scale. The "all" column is another story: the outlier channels carry almost all of the tensor's energy, and an
# FP32 scale of amax / 448 stores each block's largest value exactly, so the more blocks, the more outliers land
# exactly on 448. MX, the finest FP8 scheme, scores exactly what one power-of-two scale for the whole tensor scores
# (checked below against torch's own FP8 cast); why, is the subject of a prediction in the next section. Per-tensor
# FP8 breaks only when a tensor's values span more than E4M3's normal range (values 2^15 below the amax lose bits),
# far more than these outliers' 50×. Delayed scaling's stale amax (the ratio printed above) left the top binades of
# E4M3 unused and pushed every value as many binades towards the subnormals, where few of them lie yet.
#
# **In FP4**, E2M1 spans 3.6 binades, so one shared scale flushes almost everything that is not an outlier to zero.
# The "rest" column then follows the last one: a block without an outlier channel gets a scale of its own, and only
# blocks along the channels can be such blocks. A scale per row (per token) never separates a channel outlier from
# its neighbours. That is what MX and NVFP4's small blocks are for, and the price is in the scale column: 1/32 of a
# byte per element for MX, 1/16 for NVFP4, 4 bytes per tensor for one FP32 scale.
#
# ### How far one outlier reaches
#
# Take a 384 × 256 tensor of Gaussian values (the activation's shape, no outlier channels), put one value of 10⁴
# into it, quantise it with and without the outlier, and count how many of the *other* 98,303 values come out
# different. The outlier makes the scale of whatever shares it larger.
#
# **Predict, then run.** Under MXFP8 (E4M3 elements, one E8M0 scale per 32, rounded up as in section 2), how many of
# the other values change?
# Record a number.

# %%
prediction = ...
### BEGIN SOLUTION
prediction = 8
### END SOLUTION
predict("17.outlier-spread", prediction)

# %% tags=["workspace-clear"]
clean = torch.randn(384, 256, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
spiked = clean.clone()
spiked[5, 40] = 1e4
changed = {}
mxfp8 = lambda x: mx.mx(x, "e4m3fn", scale_rounding="rceil")
for name, quantise in (("per-tensor", mx.per_tensor), ("rowwise", mx.rowwise), ("MXFP8", mxfp8), ("NVFP4", mx.nvfp4)):
    diff = quantise(clean).dequantise() != quantise(spiked).dequantise()
    diff[5, 40] = False
    changed[name] = int(diff.sum())
reveal("17.outlier-spread", changed["MXFP8"])
print("other values changed by one outlier:", changed)

# %%
assert changed["per-tensor"] > 0.9 * (clean.numel() - 1) and changed["rowwise"] == clean.shape[1] - 1
assert changed["MXFP8"] < 31 < changed["NVFP4"]  # part of its block; NVFP4: everywhere

# %% [markdown]
# Fewer than the 31 neighbours in the outlier's block: an MX scale is a power of two, and dividing by a power of two
# only shifts an exponent. A neighbour that stays in E4M3's normal range keeps exactly the same 3 mantissa bits; only
# those pushed below 2^-6, into the subnormals, may lose some. Rowwise scaling divides by amax / 448, an arbitrary
# FP32 number, so every value of the row is re-rounded. NVFP4's 16-element blocks should confine the damage best,
# yet it changed values all over the tensor: its per-tensor FP32 scale maps the tensor's amax onto 448 × 6, so every
# block's E4M3 scale is recomputed and re-rounded. What does that cost? The SNR of every block but the outlier's,
# with an outlier of 10⁴ and of 10⁶:

# %%
others = torch.ones_like(clean, dtype=torch.bool)
others[5, 32:48] = False  # the outlier's own 16-element block
nv_snr = {"none": snr_db(clean[others], mx.nvfp4(clean).dequantise()[others])}
for big in (1e4, 1e6):
    spiked[5, 40] = big
    nv_snr[f"{big:.0e}"] = snr_db(clean[others], mx.nvfp4(spiked).dequantise()[others])
print("NVFP4, SNR of the other blocks by outlier:", {k: round(v, 2) for k, v in nv_snr.items()})
assert abs(nv_snr["1e+04"] - nv_snr["none"]) < 0.5 and nv_snr["1e+06"] < nv_snr["none"] - 10

# %% [markdown]
# At 10⁴ the re-rounded scales cost nothing measurable. At 10⁶ the other blocks' scales would fall below 2^-6, the
# smallest E4M3 normal, and NVFP4 (as torchao does) clamps them there: such a block's amax then maps to well below
# 6, and most of its elements round to 0. That is the price of a two-level scale whose second level is itself a
# narrow float.
#
# ## 3. An MX block by hand
#
# An MX block is 32 consecutive values along K. Its scale is a power of two, 2^k, stored as E8M0 (the byte k + 127).
# The OCP spec sets k = floor(log2(amax)) − emax, where emax is the exponent of the element format's largest
# value: 448 = 1.75 × 2^8, so emax = 8 for E4M3. That puts amax / 2^k in [256, 512), and E4M3 stops at 448: a block
# whose amax has a mantissa above 1.75 saturates its largest element. Rounding the scale up instead,
# k = ceil(log2(amax / 448)), never saturates, at the cost of up to one bit of range at the bottom. The MXFP8
# pretraining recipe (Mishra et al., NVIDIA, 2025) found the floor rule made training diverge and rounds up.

# %%
block = acts[-1][0, :32].double() * 60 / acts[-1][0, :32].abs().max()  # a block whose amax is 60: mantissa 1.875
amax = block.abs().max()
for rounding in ("floor", "rceil"):
    k = int(mx.mx_scale_exponent(amax.reshape(1), "e4m3fn", rounding))
    q = mx.mx(block.reshape(1, 32), "e4m3fn", scale_rounding=rounding)
    print(f"{rounding:>5}: k = {k}, scale 2^{k}, amax / scale = {float(amax / 2**k):g}, stored max element "
          f"{float(q.elements.abs().max()):g}, SNR {snr_db(block, q.dequantise().reshape(-1)):.1f} dB")

# %%
k_floor = int(torch.floor(torch.log2(amax))) - 8  # the spec, written out
assert k_floor == int(mx.mx_scale_exponent(amax.reshape(1), "e4m3fn", "floor")) == -3
e8m0 = torch.tensor([2.0**k_floor]).to(torch.float8_e8m0fnu)  # torch's own E8M0: the byte is k + 127
assert e8m0.view(torch.uint8).item() == k_floor + 127
floor_q = mx.mx(block.reshape(1, 32), "e4m3fn", scale_rounding="floor")
assert float(floor_q.elements.abs().max()) == 448 < float(amax / 2**k_floor)  # saturated: E4M3 stops at 448

# %% [markdown]
# ## 4. Matmuls in the formats
#
# A tensor core multiplies blocks of elements, sums the products in a wide accumulator and applies the two blocks'
# scales to each partial sum: for that, a block must run along K, the dimension the dot product sums over.
# `qtrain.qmm(a, b, recipe)` does the same in float64: it quantises a (M × K) and b (N × K) along K, multiplies the
# dequantised values and sums them exactly, so what is left is the quantisation error alone. Against float64, for
# growing K:

# %%
g = torch.Generator().manual_seed(0)
KS, RECIPES = (128, 512, 2048), ("bf16", "fp8-row", "mxfp8", "nvfp4")
gemm_err = {r: [] for r in RECIPES}
for K in KS:
    a, b = torch.randn(64, K, generator=g, dtype=torch.float64), torch.randn(64, K, generator=g, dtype=torch.float64)
    exact = a @ b.t()
    for r in RECIPES:
        gemm_err[r].append(float((qtrain.qmm(a, b, r) - exact).norm() / exact.norm()))
for r in RECIPES:
    print(f"{r:>8}: relative error", "  ".join(f"K={K}: {e:.2e}" for K, e in zip(KS, gemm_err[r])))

# %%
for r in RECIPES:
    assert max(gemm_err[r]) < 1.5 * min(gemm_err[r])  # the error of the inputs does not grow with K
assert gemm_err["bf16"][0] < gemm_err["mxfp8"][0] < gemm_err["nvfp4"][0]  # 8, 4, 2 significant bits

# %% [markdown]
# The input error does not grow with K: independent rounding errors partly cancel, and the relative error of a dot
# product stays near that of its inputs. The **accumulator** is another matter. DeepSeek-V3's report measured that
# Hopper's FP8 tensor cores keep only about 14 bits of the running sum, and that the resulting error grows with K:
# nearly 2 % in the worst case at K = 4096, on real hardware. Their fix: let the tensor core sum 128 elements of K, then add that partial sum into an
# FP32 register on the CUDA cores, and start again. Below, `acc14` rounds the running sum to 14 significant bits;
# the tensor core adds 32 exact products at a time.

# %%
def acc14(v):  # a running sum that keeps 14 significant bits
    m, e = torch.frexp(v)
    return torch.ldexp(torch.round(m * 2**14) / 2**14, e)

def gemm_low_acc(a, b, promote_every=None, chunk=32):
    total, acc = 0.0, torch.zeros(a.shape[0], b.shape[0], dtype=torch.float64)
    for k in range(0, a.shape[1], chunk):
        acc = acc14(acc + a[:, k:k + chunk] @ b[:, k:k + chunk].t())
        if promote_every and (k + chunk) % promote_every == 0:
            total, acc = total + acc, torch.zeros_like(acc)  # promote (float64 here), restart the short sum
    return total + acc

# %%
g = torch.Generator().manual_seed(1)
KS_ACC, acc_err = (256, 1024, 4096, 16384), {"14-bit accumulator": [], "promoted every 128": []}
for K in KS_ACC:
    a = qtrain.quantise(torch.rand(32, K, generator=g, dtype=torch.float64), "fp8-row")  # positive: errors add up
    b = qtrain.quantise(torch.rand(32, K, generator=g, dtype=torch.float64), "fp8-row")
    exact = a @ b.t()
    acc_err["14-bit accumulator"].append(float(((gemm_low_acc(a, b) - exact) / exact).abs().max()))
    acc_err["promoted every 128"].append(float(((gemm_low_acc(a, b, 128) - exact) / exact).abs().max()))
for name, errs in acc_err.items():
    print(f"{name:>19}:", "  ".join(f"K={K}: {e:.1e}" for K, e in zip(KS_ACC, errs)))

# %%
low, promoted = acc_err["14-bit accumulator"], acc_err["promoted every 128"]
assert low[-1] > 4 * low[0]  # the short accumulator's error grows with K
assert max(promoted) <= promoted[0] and low[-1] > 10 * promoted[-1]  # promotion: it does not grow

# %% [markdown]
# With positive inputs (as after a ReLU, or in a softmax-weighted sum) the running sum only grows, and each new
# 32-product partial sum is small against it and loses its low bits: notebook 02's swamping. The emulation rounds to
# nearest, so the errors partly cancel and grow about as √K; the real accumulator's error grew faster (DeepSeek's
# 2 %), but both grow. Promotion every 128 keeps each short sum to 4
# additions, and the FP32 register does the long sum.
#
# ## 5. Training in FP8, MXFP8 and NVFP4
#
# `qtrain.QLinear` replaces an `nn.Linear`: its forward and both backward matmuls go through `qmm`, each operand
# quantised along its own K. The weights stay in high precision (the optimizer's master copy) and are re-quantised at
# every matmul, as in every FP8 and FP4 recipe. The whole mechanism:

# %%
print(inspect.getsource(qtrain._QLinearFn))

# %% [markdown]
# NVFP4's pretraining recipe (NVIDIA, 2025) keeps a small share of the linear layers in BF16, scales weights in 2-D 16 × 16
# blocks so that W and Wᵀ quantise alike, and adds two tricks on the backward pass, which `qtrain` emulates:
#
# - **stochastic rounding** of the gradients (`qtrain.stochastic_round`): round up with the probability of the
#   distance to the value below, so that the rounding is right *on average*. Rounding to nearest in FP4 flushes every
#   gradient below about 1/24 of its block's largest value (0.25 on E2M1's scale of 0 to 6) to zero, always in the
#   same direction;
# - a **random Hadamard transform** of the wgrad operands: multiply both by the same random 16 × 16 orthogonal
#   matrix along K (the tokens). The product is unchanged, and an outlier is spread over its 16 neighbours, which
#   a block scale then fits better.
#
# The same seed and batches as the reference run, one run per recipe (the stochastic one with two more seeds for its
# random draws):

# %%
RUNS = {"bf16": qtrain.QuantConfig("bf16"), "FP8 rowwise": qtrain.QuantConfig("fp8-row"),
        "MXFP8": qtrain.QuantConfig("mxfp8"), "MXFP8 floor": qtrain.QuantConfig("mxfp8-floor"),
        "NVFP4": qtrain.QuantConfig("nvfp4"),
        "NVFP4 + SR + RHT": qtrain.QuantConfig("nvfp4", stochastic=True, hadamard=True)}
curves = {"float64": ref_losses}
for name, cfg in RUNS.items():
    curves[name] = train_run(cfg)[0]
draws = [curves["NVFP4 + SR + RHT"]] + [train_run(qtrain.QuantConfig("nvfp4", True, True, seed=s))[0] for s in (1, 2)]

# %%
fig, ax = plt.subplots(figsize=(7, 3.5))
for name, c in curves.items():
    ax.plot(c, label=name, lw=1)
ax.set(yscale="log", xlabel="step", ylabel="loss", title="the tiny GPT in emulated formats")
ax.legend(fontsize=8)
plt.show()

# %%
end = {name: float(np.mean(c[-10:])) for name, c in curves.items()}  # the last 10 steps' mean
for name, v in end.items():
    print(f"{name:>17}: final loss {v:.4f}  ({100 * (v / end['float64'] - 1):+.1f} % against float64)")
tricks = [100 * (np.mean(c[-10:]) / end["NVFP4"] - 1) for c in draws]
verdict = "worse on every seed" if min(tricks) > 0 else "better on every seed" if max(tricks) < 0 else "no consistent effect"
print(f"NVFP4 + SR + RHT against plain NVFP4, 3 seeds of the draws: {min(tricks):+.1f} to {max(tricks):+.1f} %: {verdict}")
print(f"MXFP8 with the spec's floor against RCEIL: {100 * (end['MXFP8 floor'] / end['MXFP8'] - 1):+.1f} %")

# %%
assert all(abs(end[n] / end["float64"] - 1) < 0.1 for n in ("bf16", "FP8 rowwise", "MXFP8", "NVFP4"))
assert all(abs(np.mean(c[-10:]) / end["float64"] - 1) < 0.15 for c in draws)

# %% [markdown]
# On a model this small and a run this short, every recipe tracks float64 within a few per cent, and the line above
# says what the tricks did on every seed of their random draws. Stochastic rounding trades a bias for noise; over
# 60 steps of a tiny model the noise is what shows, and the published gains come from runs of billions of
# parameters over trillions of tokens, where small biases add up. What the tricks do is easier to see on one matmul.
# Take the last step's wgrad, dW = dyᵀ x, with only dy in NVFP4: rounded to nearest, its error is the same at every
# step and never averages out; stochastically rounded, one draw is noisier, but the mean of many draws (what many
# steps add up to) comes close to the true dW.

# %%
dy, x_in = grads[-1].double(), grad_inputs[-1].double()  # the up-projection's output gradient and its input
exact, gen = dy.t() @ x_in, torch.Generator().manual_seed(0)
err = lambda m: float((m - exact).norm() / exact.norm())
rne = qtrain.quantise(dy.t(), "nvfp4") @ x_in
sr = torch.stack([qtrain.quantise(dy.t(), "nvfp4", stochastic=True, generator=gen) @ x_in for _ in range(256)])
print(f"wgrad error: nearest {err(rne):.4f}; stochastic, one draw {err(sr[0]):.4f}, mean of 16 draws "
      f"{err(sr[:16].mean(0)):.4f}, of 256 {err(sr.mean(0)):.4f}")
assert err(sr.mean(0)) < err(rne) / 2 < err(sr[0]) / 2  # noisier alone, far closer on average
q = mx.nvfp4(dy.t())  # what is left: the elements clamped at ±6, which no rounding undoes
per = q.element_scales()  # each element's scale: its block's E4M3 scale × the FP32 tensor scale
assert abs(err(sr.mean(0)) / err(((dy.t() / per).clamp(-6, 6) * per) @ x_in) - 1) < 0.15

# %% [markdown]
# The mean stops improving short of zero: an E4M3 block scale can round down, so a block's largest values land above
# E2M1's 6 and saturate, and no rounding of the elements undoes that clamp. Stochastic rounding is unbiased except
# where a block's maximum saturates.
#
# The Hadamard rotation works on outliers along K. In the wgrad matmul K runs over the tokens, and a token whose
# gradient is far larger than its neighbours' sets its block's scale: rotated, its weight is spread over 16 tokens.
# Both operands are rotated with the same matrix, so the exact product does not change:

# %%
R = qtrain.hadamard_rotation(16, torch.Generator().manual_seed(0))  # orthogonal: R Rᵀ = I
spiky = dy.t().clone()
spiky[:, ::48] *= 30.0  # every 48th token's gradient 30x larger: a few loud tokens
exact_s = spiky @ x_in
rht = {name: float((qtrain.qmm(spiky, x_in.t(), "nvfp4", rotation=rot) - exact_s).norm() / exact_s.norm())
       for name, rot in (("plain", None), ("rotated", R))}
print(f"wgrad error in NVFP4: plain {rht['plain']:.3f}, rotated {rht['rotated']:.3f} "
      f"({100 * (1 - rht['rotated'] / rht['plain']):.0f} % less)")
assert rht["rotated"] < 0.95 * rht["plain"]

# %% [markdown]
# ## 6. What the hardware does
#
# | GPU | FP8 | block-scaled formats in the tensor cores |
# |---|---|---|
# | A100 (Ampere) | no | no: train in bf16 |
# | L4, L40S, RTX 4090 (Ada) | E4M3/E5M2, per-tensor or rowwise scales | no |
# | H100, H200, H800 (Hopper) | E4M3/E5M2; scales applied around the MMA (per tensor, per row, per block with FP32 promotion) | no |
# | B200, GB200, B300 (Blackwell), RTX 50 | yes | MXFP8, MXFP6, MXFP4 (E8M0 scale per 32), NVFP4 (E4M3 per 16) |
#
# On Hopper, torchao's `convert_to_float8_training` with per-tensor or rowwise scales speeds up training where the
# matmuls are large (K and N in the thousands): torchao reports about 1.2–1.5× for Llama-sized models. DeepSeek-V3's
# blockwise recipe came with its own kernels (DeepGEMM); Transformer Engine (`Float8BlockScaling`) and torchao
# (`prototype.blockwise_fp8_training`) now ship it too. On Blackwell the block scales are part of the tensor-core
# instruction, so an MXFP8 matmul costs no more than a per-tensor FP8 one; each tensor must still be quantised along
# both of its K directions (activations and weights are read along one K in the forward pass and the other in the
# backward pass, as `QLinear` does). FP4 doubles the tensor cores' rate again. None of that can be seen here: the emulation shows exactly what the formats do to the
# numbers, and nothing about speed. This machine:

# %%
# NBVAL_IGNORE_OUTPUT
print(qtrain.native_formats(caps))
if caps.device_type == "cuda":
    print(qtrain.float8_speedup(caps=caps))

# %% [markdown]
# ## 7. Exercises
#
# **17.1 MX scales by hand.** `exercise_blocks()` holds two MX blocks of 32 values, one per row. Give each block's
# E8M0 shared scale for **MXFP4** (E2M1 elements) by the OCP spec's rule, as a list of two Python floats (powers of
# two), without `labkit.microscaling`.

# %%
xb = exercise_blocks()
scales = ...
### BEGIN SOLUTION
scales = [2.0 ** (int(torch.floor(torch.log2(b.abs().max()))) - 2) for b in xb]  # E2M1: 6 = 1.5 x 2^2, emax 2
### END SOLUTION
check("17.mx-scale", scales)

# %% [markdown]
# **17.2 An NVFP4 block.** Write `nvfp4_block(x, tensor_scale)`: quantise 16 values and return the values they
# decode to. `tensor_scale` is the *decode* scale of the whole tensor, amax / (448 × 6): it multiplies a decoded
# value back (NVIDIA's paper stores its inverse, the encode scale). The block scale maps the block's amax onto
# E2M1's largest value, in units of the tensor scale, and is stored in E4M3; `round_to(v, fmt)` rounds a tensor to
# a format (nearest, ties to even, saturating). The check compares with `labkit.microscaling.nvfp4` on fresh
# blocks (none so small that the block scale needs E4M3's lower clamp).

# %%
def nvfp4_block(x, tensor_scale):
    ...
    ### BEGIN SOLUTION
    block_scale = round_to(x.abs().max() / 6 / tensor_scale, "e4m3fn")
    elements = round_to(x / (block_scale * tensor_scale), "e2m1fn")
    return elements * block_scale * tensor_scale
    ### END SOLUTION


check("17.nvfp4-block", nvfp4_block)

# %% [markdown]
# **17.3 Pick a recipe.** For each situation, choose one of `RECIPE_CHOICES`:

# %%
for key, text in SITUATIONS.items():
    print(f"{key:>14}: {text}")
print("choices:", RECIPE_CHOICES)

# %%
answer = {k: ... for k in SITUATIONS}
### BEGIN SOLUTION
answer = {"a100": "bf16", "l40s": "fp8-tensor", "h100-simple": "fp8-tensor", "h100-outliers": "fp8-blockwise",
          "b200-fp8": "mxfp8", "b200-fp4": "nvfp4"}
### END SOLUTION
check("17.recipe", answer)

# %% [markdown]
# ## Summary
#
# - **Granularity buys accuracy with scale bytes**, and matters more the narrower the format: FP8's 15 binades of
#   normals absorb a 50× outlier channel at any granularity, FP4's 3.6 do not, and only blocks along the channels
#   (1 × 32, 1 × 16) give the ordinary values scales of their own. MXFP8 costs 8.25 bits per element, NVFP4 4.5.
# - **MX scales are powers of two** (E8M0): the spec rounds the exponent down, which saturates a block's largest
#   value when its mantissa exceeds the format's; rounding up does not.
# - **NVFP4 has two levels**: an E4M3 scale per 16 elements and an FP32 scale per tensor, so the E4M3 scales' narrow
#   range is centred on the tensor; an outlier re-rounds every block's scale, harmlessly until the blocks' scales
#   fall below E4M3's normal range.
# - **Accumulate in FP32**: quantised inputs cost a fixed error, a short accumulator an error that grows with K;
#   DeepSeek-V3 promotes every 128.
# - **Training** with FP8, MXFP8 and NVFP4 matmuls tracked float64 on this tiny model; section 5 printed by how much,
#   and what NVFP4's tricks did. Stochastic rounding makes low-precision gradients unbiased (bar saturated block
#   maxima) at the price of noise, and a Hadamard rotation spreads outliers along K before they are quantised.
#
# Back to notebook 05 for the FP8 basics, or on to notebook 06 for where a training step's memory goes.
