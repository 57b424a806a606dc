# %% [markdown]
# # 01 · Float bit layouts: FP32, TF32, FP16, BF16, FP8
#
# **Objectives**
# - take any floating-point number apart into sign, exponent and mantissa, and put it back together;
# - read off a format's range (max, smallest normal, smallest subnormal) and precision (eps) from its bit widths;
# - see why BF16 keeps FP32's range, why FP16 "hears badly", what TF32 is, and how the two FP8 formats differ;
# - know where torch and ml_dtypes disagree (E4M3FN overflow);
# - read the newest, smallest formats: FP6 and FP4 elements and the E8M0 scale, which carry MX and NVFP4.
#
# **Prerequisites:** notebook 00; binary numbers.
#
# **Estimated time:** 35 min

# %% [markdown] lang="zh" en="60e059fbdd3f"
# # 01 · 浮点数的位布局：FP32、TF32、FP16、BF16、FP8
#
# **学习目标**
# - 把任意浮点数拆成符号位、指数位和尾数位，再把它拼回去；
# - 从位宽直接读出一种格式的范围（max、最小正规数、最小次正规数）和精度（eps）；
# - 理解 BF16 为什么保留了 FP32 的范围、FP16 为什么“耳背”、TF32 是什么，以及两种 FP8 格式有何不同；
# - 知道 torch 与 ml_dtypes 在哪里结果不一致（E4M3FN 上溢）；
# - 看懂最新、最小的格式：FP6、FP4 元素格式和 E8M0 缩放因子，MX 和 NVFP4 正是建立在它们之上。
#
# **前置知识：** notebook 00；二进制数。
#
# **预计用时：** 35 分钟

# %%
# %matplotlib inline
# %load_ext labkit
import math

import matplotlib.pyplot as plt
import ml_dtypes
import numpy as np
import torch

from labkit import device, plots, widgets
from labkit import formats as F
from labkit.check import check, predict, reveal

# %% [markdown]
# ## 1. Three fields
#
# A binary float with $e$ exponent bits and $m$ mantissa bits stores
#
# $$x = (-1)^{s} \times 2^{E - \text{bias}} \times 1.M_2, \qquad \text{bias} = 2^{e-1}-1$$
#
# for a *normal* number (exponent field $E$ neither all zeros nor all ones). With $E = 0$ the leading 1
# becomes a 0 and the exponent stays at its minimum: these are the **subnormals**, which fill the gap
# down to zero. An all-ones exponent holds ±inf and NaN (except in E4M3FN, below).
#
# `labkit.formats` is a small hand-written codec for all of this, tested bit for bit against torch and ml_dtypes.

# %% [markdown] lang="zh" en="11ef3ee03447"
# ## 1. 三个字段
#
# 对于*正规数*（指数字段 $E$ 既不全为 0，也不全为 1），一个有 $e$ 个指数位、$m$ 个尾数位的二进制浮点数表示的值是
#
# $$x = (-1)^{s} \times 2^{E - \text{bias}} \times 1.M_2, \qquad \text{bias} = 2^{e-1}-1$$
#
# 当 $E = 0$ 时，前导的 1 变成 0，指数停留在最小值：这就是**次正规数**（非规格化数），它们填补了最小正规数
# 与零之间的空隙。全 1 的指数用来表示 ±inf 和 NaN（E4M3FN 例外，见下文）。
#
# `labkit.formats` 是一个手写的小型编解码器，实现了上面的全部规则，并与 torch 和 ml_dtypes 逐位对照测试过。

# %%
fl = F.fields(-1.5, "fp16")
print(fl.bitstring, "  kind:", fl.kind)
print(fl.meaning)
assert (fl.sign, fl.exponent, fl.mantissa) == (1, 15, 0b1000000000)
assert torch.tensor(-1.5, dtype=torch.float16).view(torch.int16).item() & 0xFFFF == fl.bits == 0xBE00

# %% [markdown]
# The same value in each format: the exponent field grows with the bias, the mantissa is rounded to its width.

# %% [markdown] lang="zh" en="24c5af53ce58"
# 同一个值在各种格式中的编码：指数字段随偏置（bias）增大而增大，尾数则舍入到该格式的位宽。

# %%
for name in ["fp32", "tf32", "fp16", "bf16", "e4m3fn", "e5m2"]:
    f = F.fields(0.1, name)
    print(f"{name:>7}: {f.bitstring:<36} = {f.value!r}")
assert F.round_to(0.1, "fp32") == float(np.float32(0.1)) and F.round_to(0.1, "bf16") == 0.10009765625

# %% [markdown]
# ## 2. Range and precision from the bit widths
#
# - **max** = $(2 - 2^{-m}) \times 2^{2^e - 2 - \text{bias}}$ for IEEE-style formats;
# - **smallest normal** = $2^{1-\text{bias}}$; **smallest subnormal** = $2^{1-\text{bias}-m}$;
# - **eps** (the gap after 1.0) = $2^{-m}$: about $\log_{10} 2^{m+1}$ significant decimal digits.

# %% [markdown] lang="zh" en="d2a9ca3509dd"
# ## 2. 由位宽推出范围与精度
#
# - **max** = $(2 - 2^{-m}) \times 2^{2^e - 2 - \text{bias}}$（适用于 IEEE 风格的格式）；
# - **最小正规数** = $2^{1-\text{bias}}$；**最小次正规数** = $2^{1-\text{bias}-m}$；
# - **eps**（1.0 与下一个值之间的间隔）= $2^{-m}$：约相当于 $\log_{10} 2^{m+1}$ 位十进制有效数字。

# %%
print(F.table())

# %% [markdown]
# The facts below are the ones that matter in the rest of the workbook. Each is checked against torch and ml_dtypes.

# %% [markdown] lang="zh" en="a693a8b18c63"
# 下面这些事实正是本练习册后面要用到的，每一条都与 torch 和 ml_dtypes 做了核对。

# %%
fp16, bf16, fp32 = F.get_format("fp16"), F.get_format("bf16"), F.get_format("fp32")
assert fp16.max == 65504 == torch.finfo(torch.float16).max
assert fp16.smallest_subnormal == 2**-24 == float(ml_dtypes.finfo(np.float16).smallest_subnormal)
assert fp16.smallest_normal == 2**-14 and fp16.eps == 2**-10
assert bf16.smallest_normal == fp32.smallest_normal == torch.finfo(torch.bfloat16).tiny
assert bf16.eps == 2**-7 == torch.finfo(torch.bfloat16).eps
print(f"FP16 covers 2^-24 .. 65504 (~{math.log2(fp16.max / fp16.smallest_subnormal):.0f} binades); "
      f"BF16 covers 2^-133 .. {bf16.max:.3e} (~{math.log2(bf16.max / bf16.smallest_subnormal):.0f} binades)")

# %%
plots.format_ranges()
plt.show()

# %% [markdown]
# Precision is *relative*: between two powers of two the values are evenly spaced, so `ulp(x)/x` is a sawtooth
# between $2^{-m-1}$ and $2^{-m}$. In the subnormals the spacing stays fixed, so relative precision collapses
# on the way to zero.

# %% [markdown] lang="zh" en="771b9d5a05a7"
# 精度是*相对*的：在相邻两个 2 的幂之间，数值等距分布，因此 `ulp(x)/x` 在 $2^{-m-1}$ 与 $2^{-m}$ 之间呈
# 锯齿状变化。进入次正规数区间后，间距固定不变，于是在趋近零的过程中，相对精度随之急剧下降。

# %%
plots.relative_spacing(lo=-30, hi=17)
plt.show()

# %% [markdown]
# ## 3. The bit explorer
#
# Pick a format, click bits, or type a number (`0.1`, `65504`, `2^-24`, `inf`) and press Enter. Sign bits are red,
# exponent bits green, mantissa bits blue. The panel shows the exact value, its neighbours and its ulp.

# %% [markdown] lang="zh" en="39beebeb7979"
# ## 3. 位浏览器
#
# 选一种格式，点击各个位，或者输入一个数（`0.1`、`65504`、`2^-24`、`inf`）后按 Enter。符号位显示为红色，
# 指数位为绿色，尾数位为蓝色。面板会显示精确值、它的两个相邻值以及它的 ulp。

# %%
explorer = widgets.bit_explorer("fp16", 1.0)
explorer

# %% [markdown]
# The explorer can be driven from code as well. Clicking the top exponent bit of 1.0 in FP16 gives the all-ones
# exponent, which is infinity; typing 65519 rounds to the largest finite value, and 65520 overflows.

# %% [markdown] lang="zh" en="ce4550c9ea31"
# 位浏览器也可以用代码来操作。在 FP16 中，点击 1.0 的最高指数位，指数就变成全 1，也就是无穷大；
# 输入 65519 会舍入到最大有限值，而 65520 则会上溢。

# %%
explorer.set_value(1.0)
explorer.toggle_bit(14)
print(explorer.value_label.value)
assert explorer.value == math.inf
explorer.set_value(65519); print(explorer.value_label.value)
explorer.set_value(65520); print(explorer.value_label.value)
assert F.round_to(65519, "fp16") == 65504 and F.round_to(65520, "fp16") == math.inf
explorer.set_value(1.0)

# %% [markdown]
# ## 4. BF16 keeps FP32's range; FP16 "hears badly"
#
# BF16 is simply the top 16 bits of an FP32 (rounded): the same 8-bit exponent, so nearly the same range, and
# only 7 mantissa bits. "Nearly": at both ends the rounding bites. FP32 values above about 3.3961e38 round up past
# BF16's largest finite value and become inf, and FP32 subnormals below 2^-133 (BF16's smallest subnormal) lose
# their bits: from 2^-134 down they flush to 0.

# %% [markdown] lang="zh" en="5995142c3d6e"
# ## 4. BF16 保留了 FP32 的范围；FP16 “耳背”
#
# BF16 其实就是 FP32 的高 16 位（经过舍入）：指数同样是 8 位，所以范围几乎相同，尾数却只有 7 位。
# 说“几乎”，是因为在范围的两端，舍入会带来影响。大于约 3.3961e38 的 FP32 值会向上舍入，越过 BF16 的最大
# 有限值而变成 inf；小于 2^-133（BF16 的最小次正规数）的 FP32 次正规数则会丢掉有效位：从 2^-134 往下，
# 它们都下溢为 0。

# %%
x = 1 / 3
b32, b16 = F.encode(x, "fp32"), F.encode(x, "bf16")
print(f"fp32 {b32:032b}\nbf16 {b16:016b}  (top 16 bits of fp32, rounded)")
assert b16 == (b32 + 0x7FFF + ((b32 >> 16) & 1)) >> 16  # round-to-nearest-even on the low 16 bits

# %%
edges = torch.tensor([3.3e38, 3.4e38, 2.0**-133, 2.0**-134], dtype=torch.float32)
as_bf16 = edges.to(torch.bfloat16).float().tolist()
print("fp32:", edges.tolist(), "\nbf16:", as_bf16)
assert torch.isfinite(edges).all() and math.isfinite(as_bf16[0]) and as_bf16[1] == math.inf
assert as_bf16[2] == 2.0**-133 and as_bf16[3] == 0.0      # the smallest bf16 subnormal survives, half of it does not

# %% [markdown]
# FP16 spends its bits the other way: 10 mantissa bits (finer than BF16) but only 5 exponent bits. Like an ear with a
# narrow dynamic range, it **doesn't hear quiet sounds** (small gradients flush to zero) and **clips loud ones**
# (activations from 65520 up become inf). BF16 hears everything FP32 hears, just less precisely.

# %% [markdown] lang="zh" en="8c2e345377c4"
# FP16 的位分配正好反过来：10 个尾数位（比 BF16 更精细），但只有 5 个指数位。它就像一只动态范围很窄的耳朵：
# **听不见轻声**（小梯度下溢为 0），**遇到大声就削波**（从 65520 起的激活值变成 inf）。
# BF16 能听见 FP32 听得见的一切，只是听得没那么精确。

# %%
for v in [1e-8, 3e-5, 70000.0, 1 + 2**-9]:
    print(f"{v!r:>22}  fp16 -> {F.round_to(v, 'fp16')!r:<24} bf16 -> {F.round_to(v, 'bf16')!r}")
assert F.round_to(1e-8, "fp16") == 0 and F.round_to(1e-8, "bf16") != 0
assert F.round_to(70000, "fp16") == math.inf and F.round_to(70000, "bf16") == 70144
assert F.round_to(1 + 2**-9, "fp16") == 1 + 2**-9 and F.round_to(1 + 2**-9, "bf16") == 1.0

# %% [markdown]
# ## 5. TF32: FP32's range with a 10-bit mantissa, inside the tensor cores
#
# TF32 is not a storage format: tensors stay FP32 in memory. On NVIDIA GPUs from Ampere on, a matmul with
# `torch.backends.cuda.matmul.allow_tf32 = True` (or `torch.set_float32_matmul_precision("high")`) rounds its
# FP32 *inputs* to 1+8+10 bits inside the tensor cores and accumulates in FP32. PyTorch's default is off; NVIDIA's
# NGC containers turn it on. Notebook 05 measures what that costs in accuracy.

# %% [markdown] lang="zh" en="730d1b6027cc"
# ## 5. TF32：FP32 的范围加 10 位尾数，只存在于张量核心内部
#
# TF32 不是一种存储格式：张量在显存中仍然是 FP32。在 Ampere 及之后的 NVIDIA GPU 上，设置
# `torch.backends.cuda.matmul.allow_tf32 = True`（或 `torch.set_float32_matmul_precision("high")`）后，
# 矩阵乘法会在张量核心（Tensor Core）内部把 FP32 *输入*舍入为 1+8+10 位，并以 FP32 累加。PyTorch 默认
# 关闭这一功能，NVIDIA 的 NGC 容器则默认打开。notebook 05 会测量它在精度上的代价。

# %%
tf32 = F.get_format("tf32")
# FP32's range (torch's own float32 limits), FP16's precision (torch's own float16 epsilon):
assert 2.0**tf32.emin == torch.finfo(torch.float32).tiny and 2.0**tf32.emax <= torch.finfo(torch.float32).max < 2.0 ** (
    tf32.emax + 1) and tf32.eps == torch.finfo(torch.float16).eps
print(f"1/3: fp32 {F.round_to(1/3, 'fp32')!r}, tf32 {F.round_to(1/3, 'tf32')!r}, fp16 {F.round_to(1/3, 'fp16')!r}")
assert F.round_to(1 / 3, "tf32") == F.round_to(1 / 3, "fp16")  # same mantissa, and 1/3 is in both ranges

# %% [markdown]
# What your device does with TF32 (the flags exist everywhere; only NVIDIA tensor cores act on them):

# %% [markdown] lang="zh" en="fd81543281a6"
# 你的设备如何处理 TF32（这些开关在任何设备上都存在，但只有 NVIDIA 的张量核心会真正据此行事）：

# %%
# NBVAL_IGNORE_OUTPUT
caps = device.capabilities()
print(f"tier {caps.tier}: allow_tf32 (matmul) = {caps.tf32_matmul}, float32_matmul_precision = "
      f"{caps.float32_matmul_precision!r}")
print("TF32 is used by matmuls on this device" if caps.tier.startswith("cuda") and caps.tf32_matmul else
      "No TF32 here: fp32 matmuls run in full fp32. The workbook emulates TF32 by rounding inputs (notebook 05).")

# %% [markdown]
# ## 6. FP8: E4M3FN for the forward pass, E5M2 for gradients
#
# With 8 bits, every pattern can be listed. **E4M3FN** ("finite, NaN only at S.1111.111") trades infinity away to
# keep one more binade of normals: max 448, 3 mantissa bits. **E5M2** is IEEE-like: max 57344, inf, only 2 mantissa
# bits, and the wider range gradients need.

# %% [markdown] lang="zh" en="cb3deecacf0a"
# ## 6. FP8：前向传播用 E4M3FN，梯度用 E5M2
#
# 只有 8 位时，所有位模式都可以一一列出。**E4M3FN**（FN 表示只有有限值，NaN 仅为 S.1111.111）放弃了无穷大，
# 换来多一个二进制数量级（binade）的正规数：最大值 448，3 个尾数位。**E5M2** 与 IEEE 格式类似：最大值 57344，
# 有 inf，只有 2 个尾数位，但具备梯度所需的更宽范围。

# %%
fig, axes = plt.subplots(2, 1, figsize=(9, 3.2), sharex=True)
plots.value_grid("e4m3fn", ax=axes[0]); plots.value_grid("e5m2", ax=axes[1])
fig.tight_layout(); plt.show()
pos = lambda name: F.decode_array(np.arange(1, 128), name)
print("finite positive values:", int(np.isfinite(pos("e4m3fn")).sum()), "in E4M3FN,",
      int(np.isfinite(pos("e5m2")).sum()), "in E5M2")

# %% [markdown]
# **Predict, then run.** E4M3FN's largest finite value is 448, and it has no infinity. What does torch give for
# `torch.tensor(500.0).to(torch.float8_e4m3fn).float()`? (A number: `448.0`, `math.inf`, `math.nan`, ...)

# %% [markdown] lang="zh" en="1effbdcb1a70"
# **先预测，再运行。** E4M3FN 的最大有限值是 448，而且它没有无穷大。那么对于
# `torch.tensor(500.0).to(torch.float8_e4m3fn).float()`，torch 会给出什么？（填一个数，例如 `448.0`、
# `math.inf`、`math.nan` 等。）

# %%
prediction = ...
### BEGIN SOLUTION
prediction = 448.0
### END SOLUTION
predict("01.e4m3-overflow", prediction)

# %% [markdown]
# Four values through torch's cast and through ml_dtypes':

# %% [markdown] lang="zh" en="e0965698fe52"
# 把四个值分别交给 torch 和 ml_dtypes 做类型转换：

# %% tags=["workspace-clear"]
vals = np.array([300.0, 464.0, 500.0, np.inf], dtype=np.float32)
t = torch.from_numpy(vals).to(torch.float8_e4m3fn).float().tolist()
m = vals.astype(ml_dtypes.float8_e4m3fn).astype(np.float32).tolist()
print("input         ", vals.tolist(), "\ntorch         ", t, "\nml_dtypes     ", m)
reveal("01.e4m3-overflow", t[2])  # torch's answer for 500.0

# %% [markdown]
# **Where libraries disagree.** E4M3FN has no infinity, so what should an overflow become? ml_dtypes (and the OCP
# spec's non-saturating mode) makes it NaN. torch's cast **saturates** to ±448, even for inf, since torch 2.13 (the
# oldest release labkit admits); before it, eager casts gave NaN like ml_dtypes, so the same line of code changed
# its answer between releases. E5M2 has inf, and both libraries agree. labkit exposes both rules by name:

# %% [markdown] lang="zh" en="953b24560f0f"
# **库与库之间的分歧。** E4M3FN 没有无穷大，那么上溢时应该得到什么？ml_dtypes（以及 OCP 规范中的非饱和
# 模式）给出 NaN。torch 的转换则会**饱和**到 ±448，连 inf 也不例外；这是从 torch 2.13（labkit 允许的最低
# 版本）开始的行为。在此之前，eager 模式下的转换和 ml_dtypes 一样给出 NaN，所以同一行代码在不同版本间给出了
# 不同的答案。E5M2 有 inf，两个库的结果一致。labkit 把两种规则都提供出来，按名字选用：

# %%
for rule in ("saturate", "nan"):
    print(f"{rule:14}", [F.round_to(v, "e4m3fn", overflow=rule) for v in vals])
assert t == [288.0, 448.0, 448.0, 448.0] and m[:2] == [288.0, 448.0] and all(map(math.isnan, m[2:]))
assert [F.round_to(v, "e4m3fn", overflow="saturate") for v in vals] == t
assert all(map(math.isnan, [F.round_to(v, "e4m3fn", overflow="nan") for v in vals[2:]]))

# %% [markdown]
# 464 sits exactly halfway between 448 and the next would-be value 480, and rounds to even (448) in both. A value
# that silently becomes 448 hides an overflow; a NaN shouts. That is why FP8 training scales tensors so that
# their `amax` lands below the max (notebook 05).
#
# ## 7. The newest formats: FP6, FP4 and E8M0
#
# Below eight bits, the OCP Microscaling (MX) spec adds two 6-bit formats, **FP6 E2M3** (max 7.5) and **FP6 E3M2**
# (max 28), and a 4-bit one, **FP4 E2M1** (max 6). They have no inf and no NaN: every pattern is a number, and an
# overflow saturates to ±max. Four bits make 16 patterns, so FP4's values can be listed in full, here by labkit's
# codec and, independently, by ml_dtypes:

# %% [markdown] lang="zh" en="3d1dd35bd3b7"
# 464 恰好位于 448 与下一个“本应存在”的值 480 的正中间，在两个库中都按向最近偶数舍入的规则得到 448。
# 一个悄无声息变成 448 的值会掩盖上溢，而 NaN 则会大声报警。这就是为什么 FP8 训练要对张量做缩放，
# 让它们的 `amax` 落在最大值之下（notebook 05）。
#
# ## 7. 最新的格式：FP6、FP4 与 E8M0
#
# 在 8 位以下，OCP 微缩放（MX）规范新增了两种 6 位格式 **FP6 E2M3**（最大值 7.5）和 **FP6 E3M2**（最大值 28），
# 以及一种 4 位格式 **FP4 E2M1**（最大值 6）。它们没有 inf，也没有 NaN：每个位模式都是一个数，上溢时
# 饱和到 ±max。4 位只有 16 种位模式，所以 FP4 的取值可以完整列出；下面分别用 labkit 的编解码器和 ml_dtypes
# 独立列出：

# %%
fp4 = [F.decode(b, "e2m1fn") for b in range(16)]  # patterns 0000 to 1111; the top bit is the sign
print("FP4 E2M1:", fp4)
ml4 = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float64)
assert np.array_equal(fp4, ml4) and np.array_equal(np.signbit(fp4), np.signbit(ml4))  # -0.0 too
assert F.get_format("e2m3fn").max == float(ml_dtypes.finfo(ml_dtypes.float6_e2m3fn).max) == 7.5
assert F.get_format("e3m2fn").max == float(ml_dtypes.finfo(ml_dtypes.float6_e3m2fn).max) == 28

# %% [markdown]
# So few values cannot cover a tensor's range alone: each block of 32 elements (MX) or 16 (NVFP4) shares a scale.
# MX stores that scale in **E8M0**: eight exponent bits and nothing else. No sign bit, no mantissa, so the pattern
# E stands for $2^{E-127}$, from $2^{-127}$ (0x00) to $2^{127}$ (0xFE); 0xFF is NaN. E8M0 has **no zero** and no
# negative numbers: ml_dtypes turns 0 or -4 into NaN (torch's cast gives $2^{-127}$ and 4 instead). Every pattern,
# checked against both libraries:

# %% [markdown] lang="zh" en="bb459e928a98"
# 这么少的取值，单靠自身覆盖不了一个张量的数值范围，因此每 32 个元素（MX）或每 16 个元素（NVFP4）共享
# 一个缩放因子。MX 用 **E8M0** 存储这个缩放因子：8 个指数位，别无其他。没有符号位，也没有尾数，所以位模式
# E 表示 $2^{E-127}$，范围从 $2^{-127}$（0x00）到 $2^{127}$（0xFE）；0xFF 是 NaN。E8M0 **没有零**，也没有
# 负数：ml_dtypes 会把 0 或 -4 变成 NaN（torch 的转换则分别给出 $2^{-127}$ 和 4）。下面逐一检查所有位模式，
# 并与两个库核对：

# %%
e8 = F.decode_array(np.arange(256), "e8m0fnu")
assert np.array_equal(e8[:255], np.ldexp(1.0, np.arange(255) - 127)) and np.isnan(e8[255])  # 2^(E-127)
ml8 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu).astype(np.float64)
t8 = torch.arange(256, dtype=torch.uint8).view(torch.float8_e8m0fnu).double().numpy()
assert np.array_equal(e8, ml8, equal_nan=True) and np.array_equal(e8, t8, equal_nan=True)
assert torch.tensor([0.0, -4.0]).to(torch.float8_e8m0fnu).double().tolist() == [2.0**-127, 4.0]  # torch's cast
print("0x00 =", e8[0], " 0x7F =", e8[127], " 0xFE =", e8[254], " 0xFF =", e8[255])

# %% [markdown]
# The explorer above shows all four formats; in E8M0 it has only exponent bits to click, and it says what becomes
# of a 0 or a negative number typed into it:

# %% [markdown] lang="zh" en="d899954dc564"
# 上面的位浏览器支持这四种格式；在 E8M0 中它只有指数位可以点击，并且会说明输入 0 或负数时会得到什么：

# %%
explorer.set_format("e8m0fnu")
print(explorer.value_label.value, "| its buttons:", {b.tooltip.split()[0] for b in explorer.buttons})
explorer.set_value(0); print(explorer.value_label.value, "|", explorer.note)
assert {b.tooltip.split()[0] for b in explorer.buttons} == {"exponent"} and len(explorer.buttons) == 8
zero_neg = np.array([0.0, -4.0]).astype(ml_dtypes.float8_e8m0fnu).astype(np.float64)
assert math.isnan(explorer.value) and np.isnan(zero_neg).all()  # NaN, as ml_dtypes
explorer.set_format("fp16"); explorer.set_value(1.0)

# %% [markdown]
# These are the element and scale formats of the microscaling formats in notebook 17 (*The low-precision
# frontier: FP8 scaling, MX and NVFP4*): MXFP4 and MXFP6 (blocks of 32 with an E8M0 scale) and NVFP4 (FP4 in
# blocks of 16 with an E4M3 scale, times one FP32 scale per tensor).
#
# ## Exercises
#
# **1.** The largest finite FP16 value, as a number.

# %% [markdown] lang="zh" en="c42656a35b8c"
# 这些就是 notebook 17（*低精度前沿：FP8 缩放、MX 与 NVFP4*）中各种微缩放格式所用的元素格式和缩放因子
# 格式：MXFP4 和 MXFP6（每 32 个元素一块，配一个 E8M0 缩放因子），以及 NVFP4（FP4 元素每 16 个一块，配一个
# E4M3 缩放因子，再乘以整个张量共用的一个 FP32 缩放因子）。
#
# ## 练习
#
# **1.** FP16 的最大有限值，以数值形式给出。

# %%
answer = ...
### BEGIN SOLUTION
answer = (2 - 2**-10) * 2**15
### END SOLUTION
check("01.fp16-max", answer)

# %% [markdown]
# **2.** Decode the BF16 pattern `0x4049` by hand (sign, exponent, mantissa) and give its value.

# %% [markdown] lang="zh" en="42ff883d4a87"
# **2.** 手工解码 BF16 位模式 `0x4049`（符号位、指数位、尾数位），并给出它的值。

# %%
answer = ...
### BEGIN SOLUTION
answer = (1 + 0b1001001 / 128) * 2 ** (0b10000000 - 127)
### END SOLUTION
check("01.decode-bf16", answer)

# %% [markdown]
# **3.** Give the fields `(sign, exponent field, mantissa field)` of -2.5 in FP16, as integers.

# %% [markdown] lang="zh" en="bd4b667bfccd"
# **3.** 以整数形式给出 -2.5 在 FP16 中的各个字段 `(sign, exponent field, mantissa field)`（符号位、指数
# 字段、尾数字段）。

# %%
answer = (..., ..., ...)
### BEGIN SOLUTION
answer = (1, 1 + 15, int(0.25 * 1024))
### END SOLUTION
check("01.fp16-fields", answer)

# %% [markdown]
# **4.** The largest finite E4M3FN value: pattern `0 1111 110` (why not `0 1111 111`?).

# %% [markdown] lang="zh" en="a189d58d226f"
# **4.** E4M3FN 的最大有限值：位模式为 `0 1111 110`（为什么不是 `0 1111 111`？）。

# %%
answer = ...
### BEGIN SOLUTION
answer = 2 ** (15 - 7) * (1 + 6 / 8)
### END SOLUTION
check("01.e4m3-max", answer)

# %% [markdown]
# **5.** BF16's machine epsilon (the gap between 1.0 and the next BF16 value).

# %% [markdown] lang="zh" en="40ba0549938d"
# **5.** BF16 的机器精度（机器 ε），即 1.0 与下一个 BF16 值之间的间隔。

# %%
answer = ...
### BEGIN SOLUTION
answer = 2.0**-7
### END SOLUTION
check("01.bf16-eps", answer)

# %% [markdown]
# ## Summary
#
# - A float is sign × 2^(exponent − bias) × 1.mantissa; subnormals drop the leading 1 near zero.
# - Exponent bits buy **range**, mantissa bits buy **precision**: FP16 has precision but little range, BF16 has
#   FP32's range and little precision, TF32 is FP32's range with FP16's mantissa inside tensor cores.
# - FP8 E4M3FN (max 448, no inf) is for forward tensors, E5M2 (max 57344) for gradients; torch saturates E4M3FN on
#   overflow where ml_dtypes gives NaN.
# - FP6 (E2M3, E3M2) and FP4 E2M1 (15 distinct values, max 6) have no inf and no NaN; E8M0 is a bare power of two
#   $2^{E-127}$ with no sign and no zero: the element and scale formats of MX and NVFP4 (notebook 17).
# - Next: notebook 02 shows what these limits do to real arithmetic: underflow, overflow, rounding and swamping.

# %% [markdown] lang="zh" en="de9c1391e6f8"
# ## 小结
#
# - 浮点数的值为：符号 × 2^(指数 − 偏置) × 1.尾数；在零附近，次正规数去掉了前导的 1。
# - 指数位换来**范围**，尾数位换来**精度**：FP16 精度尚可但范围很窄；BF16 拥有 FP32 的范围，但精度很低；
#   TF32 则是在张量核心内部使用 FP32 的范围加上 FP16 的尾数。
# - FP8 E4M3FN（最大值 448，没有 inf）用于前向张量，E5M2（最大值 57344）用于梯度；E4M3FN 上溢时，torch 会饱和，
#   而 ml_dtypes 给出 NaN。
# - FP6（E2M3、E3M2）和 FP4 E2M1（15 个不同的值，最大值 6）没有 inf，也没有 NaN；E8M0 是一个单纯的 2 的幂
#   $2^{E-127}$，没有符号，也没有零：它们是 MX 和 NVFP4 的元素格式与缩放因子格式（notebook 17）。
# - 下一步：notebook 02 会展示这些限制给实际运算带来的后果，即下溢、上溢、舍入和大数吃小数。
