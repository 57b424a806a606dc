# %% [markdown]
# # 17 · The low-precision frontier: FP8 scaling, MX and NVFP4
#
# Notebook 05 scaled FP8 the way Transformer Engine first did (2022): one scale per tensor, taken from an amax history.
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

# %% [markdown] lang="zh" en="119e322fb357"
# # 17 · 低精度前沿：FP8 缩放、MX 与 NVFP4
#
# notebook 05 按 Transformer Engine 最初（2022 年）的做法对 FP8 做缩放：每个张量一个缩放因子，取自 amax 历史。
# 此后，训练的做法已有了新进展。torchao 放弃了延迟缩放，改为根据每个张量（或每一行）自身的值计算缩放因子；
# DeepSeek-V3 用 FP8 训练，激活值每个 1 × 128 的块、权重每个 128 × 128 的块各有一个缩放因子；OCP 微缩放（MX）
# 格式让每 32 个元素共享一个 2 的幂缩放因子；NVIDIA 的 NVFP4 给每 16 个元素一个 FP8 缩放因子，并以 4 位进行训
# 练。只有较新的 GPU 原生支持这些格式（Ada 和 Hopper 支持 FP8，Blackwell 支持 MX 和 NVFP4），但它们无一例外都
# 是位上的算术，所以 CPU 也能复现：这里量化得到的值与 torchao 参考实现的结果逐位相同。求和结果与训练曲线在累加
# 顺序允许的范围内尽量接近；只是速度无从体现。
#
# **学习目标**
# - 沿着**缩放阶梯**逐级量化真实的激活值和梯度：逐张量（延迟缩放与即时缩放）、逐行、分块 1 × 128、MX（32）以及
#   NVFP4（16 + 每个张量一个），逐一测量误差、每个元素分摊的缩放因子字节数，以及一个离群值造成的破坏会波及多远；
# - 手工计算一个 **MX 共享指数**，并弄清为什么向下取整（规范的做法）会导致饱和，而向上取整（2025 年的
#   MXFP8 方案）不会；
# - 以 FP32 累加，**用这些格式做矩阵乘法**，并弄清 DeepSeek-V3 为什么沿 K 每 128 个元素就把部分和提升到 FP32；
# - 用模拟的 FP8、MXFP8 和 NVFP4 线性层（前向与反向）**训练**小型 GPT，并测量 NVFP4 的随机舍入和随机哈达玛变换
#   起了什么作用；
# - 了解哪种 GPU 原生支持哪种格式，以及模拟能告诉你什么、不能告诉你什么。
#
# **前置知识：** notebook 01（位布局、FP4 与 E8M0）、notebook 05（FP8、逐张量缩放与延迟缩放）。
#
# **预计用时：** 60 分钟

# %%
# %matplotlib inline
# %load_ext labkit
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

# %% [markdown] lang="zh" en="f1cbb5bc799c"
# ## 1. 格式，以及提供张量的小模型
#
# 元素格式越来越窄（FP8、FP6、FP4），缩放因子也成了一种独立的格式：E8M0 是一个没有符号位、也没有尾数位的指数
# （取值为 2^-127 到 2^127 之间的 2 的幂，0xFF 表示 NaN）；NVFP4 则用 E4M3 作为缩放因子。notebook 01 展示了它
# 们的位。下面要紧的是，一个元素能取的值有多么少：FP4 E2M1 只有 15 个。

# %%
print(formats.table(["e4m3fn", "e5m2", "e2m3fn", "e3m2fn", "e2m1fn", "e8m0fnu"]))
fp4 = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float64)  # ml_dtypes decodes
print("FP4 E2M1:", sorted(set(fp4.tolist())))
assert np.array_equal(formats.round_array(fp4, "e2m1fn"), fp4)  # labkit's rounding keeps every FP4 value

# %% [markdown]
# The tensors to quantise come from training: the tiny GPT of notebooks 04 and 05 learns to reverse 6 digits, in
# float64, so that every number below prints the same on every CPU (float32 kernels differ between CPUs in their
# last bits, and a quantiser turns a last-bit difference into a whole step; in float64 the differences stay near
# 1e-16, far below every printed digit). The run records, at every step, the input of one MLP's
# down-projection (an activation, 256 channels) and the gradient of its up-projection's output (also 256 wide). This is also the reference
# run of section 5.

# %% [markdown] lang="zh" en="29c2179cbcd9"
# 要量化的张量来自训练：notebook 04 和 05 中的小型 GPT 学习把 6 位数字倒序，这里以 float64 运行，使下面的每个
# 数字在任何 CPU 上打印出来都一样（不同 CPU 上的 float32 内核在最后几位上互有差别，而量化器会把最后一位的差别
# 放大成整整一个量化台阶；在 float64 中，这些差别停留在 1e-16 附近，远低于任何一位打印出来的数字）。
# 这次训练在每一步记录一个 MLP 下投影层的输入（一个激活值，256 个通道），以及上投影层输出的梯度（同样是 256
# 维）。它也是第 5 节的参考训练。

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

# %% [markdown] lang="zh" en="19a84449eb29"
# 真实 LLM 的激活值中有少数**离群通道**，比其余通道大 10 到 100 倍，而且对每个 token 都出现在同样的通道上
# （Dettmers et al., LLM.int8(), 2022；SmoothQuant, 2023）：逐张量缩放的 INT8 和 FP8 在大模型上失效，
# 原因就在于它们。这么小的模型长不出离群通道，所以下面的副本把真实激活值的三个通道乘以 50。梯度保持原样：
# 梯度本身就跨越许多个 binade（binade 即区间 [2^k, 2^(k+1))；见 notebook 03）。

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

# %% [markdown] lang="zh" en="945201fc2f9a"
# ## 2. 缩放阶梯
#
# 每种方案存储的都是 `x ≈ element × scale`，区别只在于哪些元素共享一个缩放因子。`labkit.microscaling` 把每种方
# 案都写了出来（读一读：每种不过十几行），并与 torchao 的 MX 和 NVFP4 参考代码逐位对照检验：
#
# | 方案 | 共享一个缩放因子的元素 | 缩放因子格式 | 使用者 |
# |---|---|---|---|
# | 逐张量，延迟 | 整个张量；缩放因子取自之前各步的 amax | FP32 | Transformer Engine（2022） |
# | 逐张量，即时 | 整个张量；缩放因子取自它自身的 amax | FP32 | torchao 默认的 float8 |
# | 逐行 | 一行中的 K 个值 | FP32（torchao 把它舍入为 2 的幂） | torchao "rowwise" |
# | 分块 | 1 × 128（激活值），128 × 128（权重） | FP32 | DeepSeek-V3 |
# | MXFP8 | 1 × 32 | E8M0（2 的幂） | OCP MX v1.0、Blackwell |
# | NVFP4 | 1 × 16，外加每个张量一个 | E4M3，外加 FP32 | NVIDIA Blackwell |
#
# 误差的度量是信噪比，SNR = 10 log10(Σx² / Σ(x − x̂)²)，以分贝为单位：每个尾数位大约值 6 dB。在激活值上要测两
# 次：一次针对整个张量，一次只针对 253 个普通通道（`rest`），也就是离群值可能伤害到的那些值。每种方案都分别以
# FP8 E4M3 元素和 FP4 E2M1 元素运行（于是每 32 个一组的 MX 就分别是 MXFP8 和 MXFP4；NVFP4 只有 FP4）。
# 延迟缩放（仅 FP8）按 Transformer Engine 的规则（notebook 05），从之前 16 步的 amax 中得到缩放因子。

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
# (checked below against torch's own FP8 cast); why, is the subject of a prediction further down this section. Per-tensor
# FP8 breaks only when a tensor's values span more than E4M3's normal range (values 2^15 below the amax lose bits),
# far more than these outliers' 50×. Delayed scaling's stale amax (the ratio printed above) left the top binades of
# E4M3 unused and pushed every value as many binades towards the subnormals, where few of them lie yet.
#
# **In FP4**, E2M1 spans 3.6 binades, so one shared scale flushes almost everything that is not an outlier to zero.
# The "rest" column then climbs most where the last one does: a block without an outlier channel gets a scale of its own, and only
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

# %% [markdown] lang="zh" en="d4ce98cb17fb"
# 两个发现，都在上面的数字里。**在 FP8 中**，普通通道在每种粒度下的结果都一样：E4M3 的正规数有 15 个 binade，
# 所以比离群值小 50 倍的值，无论缩放因子是多少，都能保住 3 个尾数位。“all” 一栏则是另一回事：离群通道几乎承载
# 了张量的全部能量，而 amax / 448 这样的 FP32 缩放因子能把每个块的最大值精确存下来，所以块越多，恰好落在 448
# 上的离群值就越多。MX 是最细的 FP8 方案，它的得分与整个张量只用一个 2 的幂缩放因子时的得分完全相同（下面用
# torch 自带的 FP8 转换做了核对）；原因留给本节稍后的一个预测。只有当一个张量的值跨度超过 E4M3 的正规数范围时
# （比 amax 小 2^15 的值会丢失位），逐张量的 FP8 才会失效，这远远超过这些离群值的 50 倍。延迟缩放过时的
# amax（上面打印的比值）让 E4M3 最高的几个 binade 闲置，并把每个值都朝次正规数的方向推了同样多个 binade，
# 不过目前落到那里的值还不多。
#
# **在 FP4 中**，E2M1 只跨越 3.6 个 binade，所以一个共享的缩放因子会让几乎所有不是离群值的值都下溢为 0。
# 这时 “rest” 一栏在最后一栏（clean blocks）上升的地方升得最多：不含离群通道的块能得到自己的缩放因子，而只有沿通道方向切分的
# 块才可能是这样的块。每行（每个 token）一个缩放因子，永远无法把通道上的离群值与它的邻居分开。MX 和 NVFP4
# 采用小块，为的正是这一点，代价体现在缩放因子那一栏：MX 每个元素 1/32 字节，NVFP4 为 1/16 字节，而一个 FP32
# 缩放因子每个张量只需 4 字节。
#
# ### 一个离群值能波及多远
#
# 取一个 384 × 256 的高斯值张量（与激活值形状相同，没有离群通道），往里面放一个 10⁴ 的值，分别在有、
# 无这个离群值时对它量化，数一数*其他* 98,303 个值中有多少个结果不同。凡是与离群值共用一个缩放因子的值，
# 其缩放因子都会因它而变大。
#
# **先预测，再运行。** 在 MXFP8 下（E4M3 元素，每 32 个一个 E8M0 缩放因子，按第 2 节的做法向上取整），
# 其他值中有多少个会改变？记下一个数字。

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
# block's E4M3 scale is recomputed and re-rounded. What does that cost? The SNR of all the other blocks together,
# with an outlier of 10⁴ and of 10⁶:

# %% [markdown] lang="zh" en="7be482974ce4"
# 比离群值所在块中的 31 个邻居还少：MX 缩放因子是 2 的幂，除以 2 的幂只是平移指数。仍留在 E4M3 正规数范围内
# 的邻居，3 个尾数位完全不变；只有被推到 2^-6 以下、进入次正规数的那些值，才可能丢失一些位。逐行缩放除以
# amax / 448，这是一个任意的 FP32 数，所以这一行的每个值都要重新舍入。NVFP4 的 16 元素块本应把破坏限制得最
# 好，它却改变了整个张量中的值：它逐张量的 FP32 缩放因子把张量的 amax 映射到 448 × 6，于是每个块的 E4M3
# 缩放因子都要重新计算、重新舍入。这有什么代价？下面是离群值分别为 10⁴ 和 10⁶ 时，除离群值所在块以外、
# 其他所有块合起来的 SNR：

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

# %% [markdown] lang="zh" en="dde8afb85397"
# 离群值为 10⁴ 时，重新舍入的缩放因子没有带来可测量的代价。为 10⁶ 时，其他块的缩放因子会落到 E4M3 最小的正规数
# 2^-6 以下，NVFP4（与 torchao 一样）把它们钳制在 2^-6：于是这样一个块的 amax 映射到远小于 6 的值，
# 它的大部分元素都舍入为 0。这就是两级缩放的代价：它的第二级本身就是一种很窄的浮点格式。
#
# ## 3. 手工计算一个 MX 块
#
# 一个 MX 块是沿 K 方向连续的 32 个值。它的缩放因子是一个 2 的幂 2^k，以 E8M0 存储（字节值为 k + 127）。
# OCP 规范规定 k = floor(log2(amax)) − emax，其中 emax 是元素格式最大值的指数：448 = 1.75 × 2^8，所以 E4M3 的
# emax = 8。这使 amax / 2^k 落在 [256, 512) 中，而 E4M3 到 448 为止：一个块的 amax 的尾数如果大于 1.75，
# 它的最大元素就会饱和。改为把缩放因子向上取整，即 k = ceil(log2(amax / 448))，就永远不会饱和，代价是在低端最
# 多损失一位的范围。MXFP8 预训练方案（Mishra et al., NVIDIA, 2025）发现向下取整的规则会让训练发散，
# 因此改为向上取整。

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

# %% [markdown] lang="zh" en="caf3f386310c"
# ## 4. 用这些格式做矩阵乘法
#
# 张量核心把元素块相乘，在一个宽累加器中对乘积求和，再把两个块的缩放因子作用到每个部分和上：为此，
# 块必须沿 K 方向排布，K 就是点积求和所沿的维度。`qtrain.qmm(a, b, recipe)` 在 float64 中做同样的事：
# 它沿 K 量化 a（M × K）和 b（N × K），把反量化后的值相乘并精确求和，于是剩下的只有量化误差。
# 随着 K 增大，与 float64 对比：

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

# %% [markdown] lang="zh" en="750abc126624"
# 输入误差不随 K 增长：相互独立的舍入误差会部分抵消，点积的相对误差保持在与其输入误差相近的水平。**累加器**则
# 是另一回事。DeepSeek-V3 的技术报告实测发现，Hopper 的 FP8 张量核心只保留累加和的大约 14 位，由此产生的误差随
# K 增长：在真实硬件上，K = 4096 时最坏情况下接近 2 %。他们的解决办法是：让张量核心先对 K 方向的 128 个元素求
# 和，再把这个部分和加到 CUDA 核心上的一个 FP32 寄存器里，然后重新开始。下面的 `acc14` 把累加和舍入到 14
# 个有效位；张量核心每次加入 32 个精确的乘积。

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

# %% [markdown] lang="zh" en="6c7933ea48aa"
# 输入为正时（例如 ReLU 之后，或在 softmax 加权求和中），累加和只增不减，每个新加入的 32 个乘积的部分和与它相
# 比都很小，会丢掉低位：这就是 notebook 02 讲的大数吃小数。模拟采用就近舍入，误差会部分抵消，大约按 √K 增长；
# 真实累加器的误差增长得更快（DeepSeek 测得的 2 %），但两者都在增长。每 128 个元素提升一次，让每段短累加只有 4
# 次加法，长的求和则交给 FP32 寄存器。
#
# ## 5. 以 FP8、MXFP8 和 NVFP4 训练
#
# `qtrain.QLinear` 用来替换一个 `nn.Linear`：它的前向矩阵乘法和两个反向矩阵乘法都经过 `qmm`，每个操作数沿各自
# 的 K 量化。权重保持高精度（优化器的主权重副本），并在每次矩阵乘法时重新量化，所有 FP8 和 FP4 方案都是这样做
# 的。完整的机制如下：

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
#   matrix along K (the tokens). The product is unchanged, and an outlier is spread over the 16 positions of its block, which
#   a block scale then fits better.
#
# The same seed and batches as the reference run, one run per recipe (the stochastic one with two more seeds for its
# random draws):

# %% [markdown] lang="zh" en="a5f92230acda"
# NVFP4 的预训练方案（NVIDIA, 2025）让一小部分线性层保持 BF16，以 16 × 16 的二维块缩放权重，使 W 和 Wᵀ 的量化
# 结果一致，并在反向传播中加了两个技巧，`qtrain` 对它们做了模拟：
#
# - 对梯度做**随机舍入**（`qtrain.stochastic_round`）：以到下方相邻值的距离作为向上舍入的概率，使舍入*在平均意
#   义上*是正确的。在 FP4 中就近舍入，会把小于所在块最大值约 1/24（在 E2M1 从 0 到 6 的刻度上即 0.25）
#   的每个梯度都下溢为 0，而且总是偏向同一个方向；
# - 对 wgrad 的两个操作数做**随机哈达玛变换**：沿 K（即 token）把两者乘以同一个随机的 16 × 16 正交矩阵。
#   乘积不变，而一个离群值会被分摊到它所在块的 16 个位置上，块缩放因子就能更好地适配它们。
#
# 与参考训练使用相同的种子和批次，每种方案训练一次（带随机性的那一种另用两个种子做随机抽样）：

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

# %% [markdown] lang="zh" en="11045988c4d0"
# 在这么小的模型、这么短的训练上，每种方案与 float64 的差距都在几个百分点以内，上面一行则说明了这些技巧在
# 各个随机抽样种子下起了什么作用。随机舍入是用噪声换掉偏差；在小型模型 60 步的训练中，显现出来的是噪声，
# 而已发表的收益来自数十亿参数、数万亿 token 的训练，在那里微小的偏差会不断累积。这些技巧的作用在单次矩阵
# 乘法上更容易看清。取最后一步的 wgrad，dW = dyᵀ x，只把 dy 转为 NVFP4：就近舍入时，它的误差每一步都一样，
# 永远不会被平均掉；随机舍入时，单次抽样的噪声更大，但多次抽样的均值（也就是许多步累加起来的效果）
# 接近真实的 dW。

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

# %% [markdown] lang="zh" en="ceff31e91885"
# 均值的误差在降到 0 之前就不再减小：E4M3 块缩放因子可能向下舍入，于是块中最大的值会超出 E2M1 的 6 而饱和，
# 对元素的任何舍入都撤销不了这种钳制。除了块最大值饱和之处，随机舍入都是无偏的。
#
# 哈达玛旋转针对的是沿 K 方向的离群值。在 wgrad 矩阵乘法中，K 遍历的是 token；一个 token 的梯度如果比邻近
# token 大得多，就会决定它所在块的缩放因子：旋转之后，它的幅值被分摊到 16 个 token 上。两个操作数用同一个矩阵
# 旋转，所以精确乘积不变：

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

# %% [markdown] lang="zh" en="4807c9bd8d72"
# ## 6. 硬件能做什么
#
# | GPU | FP8 | 张量核心中的块缩放格式 |
# |---|---|---|
# | A100（Ampere） | 不支持 | 不支持：用 bf16 训练 |
# | L4、L40S、RTX 4090（Ada） | E4M3/E5M2，逐张量或逐行缩放 | 不支持 |
# | H100、H200、H800（Hopper） | E4M3/E5M2；缩放在 MMA 之外施加（逐张量、逐行、块缩放并配合 FP32 提升累加） | 不支持 |
# | B200、GB200、B300（Blackwell）、RTX 50 | 支持 | MXFP8、MXFP6、MXFP4（每 32 个一个 E8M0 缩放因子）、NVFP4（每 16 个一个 E4M3） |
#
# 在 Hopper 上，矩阵乘法足够大（K 和 N 达到数千）时，torchao 的 `convert_to_float8_training` 配合逐张量或逐行
# 缩放能加快训练：torchao 报告 Llama 规模的模型大约快 1.2–1.5×。DeepSeek-V3 的块缩放方案附带了自己的内核
# （DeepGEMM）；现在 Transformer Engine（`Float8BlockScaling`）和 torchao
# （`prototype.blockwise_fp8_training`）也提供了它。在 Blackwell 上，块缩放因子是张量核心指令的一部分，所以一次
# MXFP8 矩阵乘法的开销不比逐张量缩放的 FP8 更高；不过每个张量仍须沿它的两个 K 方向各量化一次（激活值和权重在
# 前向传播中沿一个 K 读取，在反向传播中沿另一个 K 读取，`QLinear` 也是这样做的）。FP4 又把张量核心的速率翻了
# 一倍。这些在这里都看不到：模拟能准确展示这些格式对数值做了什么，却说明不了速度。这台机器：

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

# %% [markdown] lang="zh" en="fbaa10cc672e"
# ## 7. 练习
#
# **17.1 手工计算 MX 缩放因子。** `exercise_blocks()` 中有两个 MX 块，每块 32 个值，每行一块。请不借助
# `labkit.microscaling`，按 OCP 规范的规则给出每个块用于 **MXFP4**（E2M1 元素）的 E8M0 共享缩放因子，写成由两个
# Python float（2 的幂）组成的列表。

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

# %% [markdown] lang="zh" en="71b79c0e2e24"
# **17.2 一个 NVFP4 块。** 编写 `nvfp4_block(x, tensor_scale)`：量化 16 个值，返回它们解码后的值。
# `tensor_scale` 是整个张量的*解码*缩放因子 amax / (448 × 6)：用它把解码出的值乘回去（NVIDIA 的论文存储的是它
# 的倒数，即编码缩放因子）。块缩放因子以张量缩放因子为单位，把块的 amax 映射到 E2M1 的最大值上，并以 E4M3
# 存储；`round_to(v, fmt)` 把张量舍入到某种格式（就近舍入、偶数优先、饱和）。检查程序会在新生成的块上与
# `labkit.microscaling.nvfp4` 对比（这些块都不会小到让块缩放因子需要用到 E4M3 的下限钳制）。

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

# %% [markdown] lang="zh" en="d6a1de0d472f"
# **17.3 选择方案。** 对每种情形，从 `RECIPE_CHOICES` 中选出一个：

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

# %% [markdown] lang="zh" en="afb60ecc7fc5"
# ## 小结
#
# - **粒度用缩放因子的字节换来准确度**，格式越窄，粒度越重要：FP8 的正规数有 15 个 binade，在任何粒度下都能吸收
#   50× 的离群通道，FP4 的 3.6 个则不能；只有沿通道方向的块（1 × 32、1 × 16）才能让普通值拥有自己的缩放因子。
#   MXFP8 每个元素占 8.25 位，NVFP4 占 4.5 位。
# - **MX 缩放因子是 2 的幂**（E8M0）：规范把指数向下取整，当块最大值的尾数超过元素格式的最大尾数时，
#   这个值就会饱和；向上取整则不会。
# - **NVFP4 有两级缩放**：每 16 个元素一个 E4M3 缩放因子，每个张量一个 FP32 缩放因子，使 E4M3 缩放因子狭窄的
#   范围以这个张量为中心；一个离群值会让每个块的缩放因子重新舍入，在各块的缩放因子跌出 E4M3 的正规数范围之
#   前，这并无害处。
# - **以 FP32 累加**：量化输入带来的误差是固定的，短累加器带来的误差却随 K 增长；DeepSeek-V3 每 128
#   个元素提升一次。
# - **训练**：在这个小型模型上，使用 FP8、MXFP8 和 NVFP4 矩阵乘法的训练都紧跟 float64；第 5 节打印了差距有多
#   大，以及 NVFP4 的技巧起了什么作用。随机舍入以噪声为代价，使低精度梯度变得无偏（饱和的块最大值除外）；
#   哈达玛旋转则在量化之前沿 K 把离群值分散开。
#
# 回到 notebook 05 复习 FP8 的基础，或者前往 notebook 06，看看一个训练步的显存都花在了哪里。
