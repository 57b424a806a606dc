# %% [markdown]
# # 02 · Underflow, overflow, rounding
#
# **Objectives**
# - read a format's number line: normals, the subnormal ramp, flush to zero, overflow to inf (and FP8
#   E4M3FN's saturation or NaN, where torch and ml_dtypes disagree);
# - predict round-to-nearest-even, including ties;
# - see *swamping*: why adding 0.01 a thousand times does not give 10 in FP16, and why an update of 1e-5 to a
#   weight of 1.0 vanishes in FP16. That is the argument for **FP32 master weights**;
# - see an FP16 softmax overflow to inf/NaN, and fix it by subtracting the row maximum or with an FP32 island
#   (`autocast(enabled=False)`).
#
# **Prerequisites:** notebook 01 (sign, exponent, mantissa; what an ulp is).
#
# **Estimated time:** 50 min

# %% [markdown] lang="zh" en="a4d7afa1d3ea"
# # 02 · 下溢、上溢与舍入
#
# **学习目标**
# - 读懂一种格式的数轴：正规数、次正规数的“斜坡”、下溢为 0、上溢为 inf（以及 FP8 E4M3FN 的饱和或 NaN，
#   在这一点上 torch 与 ml_dtypes 的做法不同）；
# - 预测就近舍入（偶数优先）的结果，包括恰好位于中点的情形；
# - 理解*大数吃小数*（swamping）：为什么在 FP16 中把 0.01 累加 1000 次得不到 10，为什么在 FP16 中
#   给权重 1.0 加上 1e-5 的更新会完全消失。这正是需要 **FP32 主权重** 的理由；
# - 观察 FP16 下的 softmax 上溢为 inf/NaN，并通过减去行最大值或使用 FP32 局部计算区
#   （`autocast(enabled=False)`）加以修复。
#
# **前置知识：** notebook 01（符号位、指数位、尾数位；什么是 ulp）。
#
# **预计用时：** 50 分钟

# %%
# %matplotlib inline
# %load_ext labkit
import math

import matplotlib.pyplot as plt
import ml_dtypes
import numpy as np
import torch

from labkit import formats as F
from labkit import models, plots
from labkit.check import check, predict, reveal
from labkit.exercises.nb02 import UNDERFLOW_VALUES

# %% [markdown]
# ## 1. The number line of a format
#
# A format with `e` exponent bits and `m` mantissa bits has three regions on the positive axis:
#
# - **normals**, from `smallest_normal` = 2^(1-bias) up to `max`: every binade [2^k, 2^(k+1)) holds 2^m values,
#   so the *relative* spacing is the same everywhere (2^-m);
# - **subnormals**, below `smallest_normal`: the hidden bit is 0 and the spacing stays fixed at the smallest
#   subnormal, so each step down the ramp loses one bit of precision;
# - at or below half the smallest subnormal, a value **flushes to zero**; above `max` (plus half an ulp), it
#   **overflows** to inf (or, in E4M3FN, which has no inf, to NaN or a saturated ±448).
#
# Pale bars are subnormals, solid bars normals:

# %% [markdown] lang="zh" en="95ff72a9802b"
# ## 1. 一种格式的数轴
#
# 一种有 `e` 个指数位、`m` 个尾数位的格式，在正半轴上分为三个区域：
#
# - **正规数**，从 `smallest_normal` = 2^(1-bias) 到 `max`：每个二进制数量级（binade，即区间
#   [2^k, 2^(k+1))）都含有 2^m 个值，因此*相对*间距处处相同（2^-m）；
# - **次正规数**，位于 `smallest_normal` 之下：隐含的前导位为 0，间距固定为最小次正规数，因此沿着这段
#   “斜坡”每往下走一个 binade，就损失一位精度；
# - 小于或等于最小次正规数的一半时，数值**下溢为 0**；大于 `max`（再加半个 ulp）时，数值**上溢**为 inf
#   （E4M3FN 没有 inf，上溢时变为 NaN 或饱和到 ±448）。
#
# 浅色条为次正规数，实色条为正规数：

# %%
ax = plots.format_ranges(("fp32", "bf16", "fp16", "e5m2", "e4m3fn"))
ax.set_xlim(-160, 140)
plt.show()

# %% [markdown]
# The landmarks of FP16, exact:

# %% [markdown] lang="zh" en="040e50d1d283"
# FP16 的几个关键值（精确值）：

# %%
fp16 = F.get_format("fp16")
for what in ("smallest_subnormal", "smallest_normal", "max", "eps"):
    v = getattr(fp16, what)
    print(f"{what:>18} = 2^{math.log2(v):g} = {v!r}" if what != "max" else f"{what:>18} = {v!r}")
assert fp16.smallest_subnormal == 2.0**-24 and fp16.smallest_normal == 2.0**-14 and fp16.max == 65504.0

# %% [markdown]
# Now cast a ladder of values to FP16 with torch and watch each region. `2^-25` is exactly half the smallest
# subnormal: a tie between 0 and 2^-24, and ties go to the *even* neighbour, 0. Just above the tie it rounds up.
# At the top, 65504 + 15 still rounds down to 65504; from 65520 (half an ulp above `max`) it is inf.

# %% [markdown] lang="zh" en="efecabd8fc84"
# 现在用 torch 把一串由小到大的值转换为 FP16，逐一观察各个区域。`2^-25` 恰好是最小次正规数的一半：
# 它正好落在 0 与 2^-24 的中点上，而中点情形要舍入到*偶数*一侧的邻值，即 0。只要比中点稍大一点，
# 就会向上舍入。在顶端，65504 + 15 仍会向下舍入为 65504；从 65520（比 `max` 大半个 ulp）开始，结果就是 inf。

# %%
ladder = [2.0**-26, 2.0**-25, 1.01 * 2.0**-25, 2.0**-24, 1e-7, 2.0**-14, 65504.0, 65519.0, 65520.0, 1e5]
cast = torch.tensor(ladder, dtype=torch.float64).to(torch.float16).double().tolist()
for x, y in zip(ladder, cast):
    print(f"{x:>14.6g} -> {y:<14.6g} {'(lost: 0)' if y == 0 else '(overflow)' if math.isinf(y) else ''}")
assert cast[:4] == [0.0, 0.0, 2.0**-24, 2.0**-24] and cast[6:8] == [65504.0, 65504.0]
assert math.isinf(cast[8]) and math.isinf(cast[9])

# %% [markdown]
# > **Common misconception** (seed 000 §3.1): FP16's range is "about 6e-5 to 65504", so anything smaller than
# > about 6e-5 is lost.
# >
# > **Why it is wrong:** 6.1e-5 (2^-14) is FP16's smallest *normal* number. Below it come the subnormals, down to
# > 6e-8 (2^-24), with fewer significant bits the closer they get to zero; only values at or below half of 2^-24 round to 0.
# >
# > **What is true:** FP16 spans about 6e-8 to 65504, with full precision only from 6.1e-5 up. The cell above shows
# > it: 2^-24 survives the cast and 2^-25 does not; 1e-7 survives with a 19 % error, as the next cell shows.
#
# **The subnormal ramp.** 1e-7 survives, but as 2 × 2^-24 = 1.19e-7: a 19 % error. Relative precision is
# 2^-11 for normals, and it degrades one bit per binade below 2^-14:

# %% [markdown] lang="zh" en="284b3e069a0a"
# > **常见误解**（seed 000 §3.1）：FP16 的范围“大约是 6e-5 到 65504”，所以小于约 6e-5 的数都会丢失。
# >
# > **错在哪里：** 6.1e-5（2^-14）是 FP16 最小的*正规数*。它下面还有次正规数，一直延伸到 6e-8（2^-24），
# > 越接近 0，有效位越少；只有小于或等于 2^-24 一半的值才会舍入为 0。
# >
# > **实际情况：** FP16 的范围大约是 6e-8 到 65504，只是从 6.1e-5 往上才有完整精度。上面的单元格已经表明：
# > 2^-24 经转换后保留了下来，2^-25 则没有；1e-7 也保留了下来，但有 19 % 的误差，下一个单元格会展示这一点。
#
# **次正规数的斜坡。** 1e-7 保留了下来，但变成了 2 × 2^-24 = 1.19e-7：误差 19 %。正规数的相对精度是
# 2^-11，而在 2^-14 以下，每低一个 binade 就损失一位：

# %%
for x in (1e-4, 1e-5, 1e-6, 1e-7):
    y = F.round_to(x, "fp16")
    print(f"{x:g} -> {y:.6g}   relative error {abs(y - x) / x:.2%}")
assert F.round_to(1e-7, "fp16") == 2 * 2.0**-24

# %% [markdown]
# **Flush to zero (FTZ).** Subnormal arithmetic is slow on some hardware, so CPUs and GPUs have a mode that
# treats subnormals as 0. PyTorch exposes it on CPU as `torch.set_flush_denormal`. With it on, FP32's
# subnormals (below 2^-126 ≈ 1.2e-38) vanish too. Always switch it back off.

# %% [markdown] lang="zh" en="9504422c08d8"
# **下溢清零（FTZ）。** 在某些硬件上，次正规数的运算很慢，因此 CPU 和 GPU 都提供一种把次正规数当作 0
# 处理的模式。PyTorch 在 CPU 上通过 `torch.set_flush_denormal` 提供这一模式。打开后，FP32 的次正规数
# （小于 2^-126 ≈ 1.2e-38）也会消失。用完务必把它关掉。

# %%
if torch.set_flush_denormal(True):  # returns False on CPUs without FTZ/DAZ support
    try:
        assert torch.tensor([1e-40]).item() == 0.0
    finally:
        torch.set_flush_denormal(False)
assert torch.tensor([1e-40]).item() != 0.0  # FTZ off: an FP32 subnormal
print("FP32 1e-40 is a subnormal:", torch.tensor([1e-40]).item() < torch.finfo(torch.float32).smallest_normal)

# %% [markdown]
# ## 2. FP8 at the top of its range: saturate, NaN or inf
#
# E5M2 follows IEEE: its all-ones exponent means inf/NaN, and overflow gives inf (max 57344). E4M3FN ("FN":
# finite, NaN only) spends that exponent on more normals, so its max is 448 and it *has no inf*. What an
# overflow becomes then is a choice, and the libraries choose differently: **torch saturates** to ±448,
# **ml_dtypes** returns NaN (the OCP FP8 spec's non-saturating mode).

# %% [markdown] lang="zh" en="bd0e302ffcfd"
# ## 2. FP8 在范围顶端：饱和、NaN 还是 inf
#
# E5M2 遵循 IEEE：指数位全为 1 表示 inf/NaN，上溢得到 inf（最大值 57344）。E4M3FN（“FN”表示只有有限值，
# 外加 NaN）把这个指数用来表示更多正规数，所以最大值是 448，而且*没有 inf*。于是上溢之后
# 变成什么，就成了一种选择，而各个库的选择不同：**torch 饱和**到 ±448，**ml_dtypes** 则返回 NaN
# （即 OCP FP8 规范中的非饱和模式）。

# %%
vals = np.array([448.0, 464.0, 465.0, 500.0, 1e4, 1e5, np.inf], dtype=np.float32)
t_e4 = torch.from_numpy(vals).to(torch.float8_e4m3fn).float().numpy()
m_e4 = vals.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
t_e5 = torch.from_numpy(vals).to(torch.float8_e5m2).float().numpy()
m_e5 = vals.astype(ml_dtypes.float8_e5m2).astype(np.float32)
print(f"{'x':>8} {'torch e4m3fn':>13} {'ml_dtypes e4m3fn':>17} {'torch e5m2':>11} {'ml_dtypes e5m2':>15}")
for row in zip(vals, t_e4, m_e4, t_e5, m_e5):
    print("".join(f"{v:>{w}g}" for v, w in zip(row, (8, 14, 18, 12, 16))))

# %% [markdown]
# 464 is halfway between 448 and 480 (which is not an E4M3FN value), and the tie rounds to 448, whose mantissa
# 110 is even. Anything above overflows: torch gives 448, ml_dtypes gives NaN. E5M2 agrees in both libraries:
# up to 1e4 it rounds (coarsely: 3 bits of precision), and 1e5, beyond its max of 57344, is inf.
# In FP8 training a silent 448 hides an overflow that a NaN would have reported, which is why FP8 recipes keep
# per-tensor scales (notebook 05).

# %% [markdown] lang="zh" en="39fe685d7839"
# 464 恰好位于 448 和 480 的中点（480 不是 E4M3FN 能表示的值），这个中点舍入到 448，因为 448 的尾数
# 110 是偶数。再大的值都会上溢：torch 给出 448，ml_dtypes 给出 NaN。E5M2 在两个库中结果一致：1e4 以内的值
# 都正常舍入（只是很粗：精度仅 3 位），而 1e5 超出了它的最大值 57344，变为 inf。
# 在 FP8 训练中，一个悄无声息的 448 会掩盖上溢，而 NaN 本可以把它暴露出来；这就是 FP8 训练方案要维护
# 逐张量缩放因子的原因（notebook 05）。

# %%
assert list(t_e4) == [448.0] * 7
assert list(m_e4[:2]) == [448.0, 448.0] and np.isnan(m_e4[2:]).all()
assert t_e5.tolist() == m_e5.tolist() and np.isinf(t_e5[5:]).all() and np.isfinite(t_e5[:5]).all()

# %% [markdown]
# ## 3. Round to nearest, ties to even
#
# Every IEEE operation rounds its exact result to the nearest representable value. When a value sits exactly
# halfway, IEEE 754 picks the neighbour whose last mantissa bit is 0 (the "even" one), so ties do not all
# round the same way and no bias builds up. In BF16 (8 bits of precision) the integers above 256 are 2 apart:

# %% [markdown] lang="zh" en="5817cb46fd17"
# ## 3. 就近舍入（偶数优先）
#
# 每个 IEEE 运算都会把精确结果舍入到最近的可表示值。当一个值恰好位于两个可表示值的中点时，IEEE 754
# 选择尾数最后一位为 0 的那个邻值（即“偶数”），这样中点情形不会总朝同一方向舍入，也就不会累积偏差。
# 在 BF16（8 位精度）中，256 以上的整数间隔为 2：

# %%
for x in (256.0, 257.0, 258.0, 259.0, 260.0, 261.0):
    print(f"{x:g} -> bf16 {torch.tensor(x).to(torch.bfloat16).item():g}   (labkit: {F.round_to(x, 'bf16'):g})")
assert torch.tensor([257.0, 259.0, 261.0]).to(torch.bfloat16).tolist() == [256.0, 260.0, 260.0]
assert [F.round_to(x, "bf16") for x in (257.0, 259.0, 261.0)] == [256.0, 260.0, 260.0]

# %% [markdown]
# **A gotcha: double rounding.** torch casts float64 to fp16, bf16 and fp8 *through float32*, and ml_dtypes does the
# same for bf16 and fp8. Each step rounds, and two roundings are not one. Take `1 + 2^-11 + 2^-40`: the nearest
# fp16 value is `1 + 2^-10` (it sits just above the halfway point 1 + 2^-11). Rounded to float32 first, the tiny
# `2^-40` is lost, what is left is exactly the halfway point, and ties-to-even then goes down to 1.0.

# %% [markdown] lang="zh" en="3a453e9529e6"
# **一个陷阱：双重舍入。** torch 把 float64 转换为 fp16、bf16 和 fp8 时会*经过 float32* 中转，ml_dtypes
# 转换为 bf16 和 fp8 时也是如此。每一步都要舍入，而舍入两次并不等于舍入一次。以 `1 + 2^-11 + 2^-40` 为例：
# 离它最近的 fp16 值是 `1 + 2^-10`（它略高于中点 1 + 2^-11）。如果先舍入到 float32，微小的 `2^-40`
# 就丢掉了，剩下的恰好是中点，再按偶数优先的规则舍入，结果就落到了 1.0。

# %%
x = 1 + 2**-11 + 2**-40
direct = float(np.float16(x))                                   # numpy: one rounding from float64
via_torch = torch.tensor(x, dtype=torch.float64).to(torch.float16).item()
print(f"nearest fp16: {direct!r} (numpy, labkit: {F.round_to(x, 'fp16')!r}) | torch float64 -> fp16: {via_torch!r}")
assert direct == F.round_to(x, "fp16") == 1 + 2**-10 and via_torch == 1.0

# %% [markdown]
# 257 and 259 are both ties, yet one rounds down and the other up: 256 = 1.0000000 × 2^8 and
# 260 = 1.0000010 × 2^8 end in 0. Python's own `round()` does the same with decimals: `round(2.5) == 2`.

# %% [markdown] lang="zh" en="382a1a029f20"
# 回到上面 BF16 的例子：257 和 259 都是中点情形，却一个向下舍入、一个向上舍入，因为 256 = 1.0000000 × 2^8
# 和 260 = 1.0000010 × 2^8 的末位都是 0。Python 自带的 `round()` 对十进制数也是这样做的：`round(2.5) == 2`。

# %%
ties = [0.5, 1.5, 2.5, 3.5]
print([round(x) for x in ties])
assert [round(x) for x in ties] == torch.round(torch.tensor(ties)).tolist()  # torch rounds ties to even too

# %% [markdown]
# ## 4. Swamping: small numbers added to big ones
#
# Adding `b` to `a` rounds the exact sum to `a`'s format. If `|b|` is below half of `ulp(a)`, the sum rounds
# back to `a`: `b` is *swamped*. Summing 1000 copies of 0.01 makes this visible, first with both accumulator and
# increments in FP32, then both in FP16, then an FP32 accumulator with FP16 increments:

# %% [markdown] lang="zh" en="8c821aab29e9"
# ## 4. 大数吃小数：小数加到大数上
#
# 把 `b` 加到 `a` 上，精确的和会舍入到 `a` 的格式。如果 `|b|` 小于 `ulp(a)` 的一半，和就会舍入回 `a`：
# `b` 被“吃掉”了（*swamped*）。把 1000 个 0.01 相加就能看到这一点：先让累加器和增量都用 FP32，再都用
# FP16，最后用 FP32 累加器加 FP16 增量：

# %%
def accumulate(acc_dtype, inc_dtype, n=1000, x=0.01):
    acc, inc = acc_dtype(0), acc_dtype(inc_dtype(x))
    for _ in range(n):
        acc = acc_dtype(acc + inc)
    return float(acc)

sums = {"fp32 / fp32": accumulate(np.float32, np.float32), "fp16 / fp16": accumulate(np.float16, np.float16),
        "fp32 acc / fp16 inc": accumulate(np.float32, np.float16)}
for k, v in sums.items():
    print(f"{k:>20}: {v!r}")

# %% [markdown]
# All three results are exact and the same on every machine (IEEE arithmetic is deterministic):
#
# - **FP32/FP32: 10.000133514404297.** 0.01 is not a binary number; FP32 stores 0.0099999998, and 1000 roundings
#   of the running sum add a small error.
# - **FP16/FP16: 9.953125.** Each `+ 0.01` rounds to a whole number of FP16 spacings, and the spacing grows with
#   the sum. Between 4 and 8 it is 2^-8, and 0.01 rounds *up* to 3 spacings (0.0117): the sum overshoots and
#   reaches 8 after only 750 additions. Above 8 the spacing is 2^-7 = 0.0078125, and 0.01 rounds *down* to one
#   spacing: the sum undershoots for the remaining 250. The two errors partly cancel. At 32 the spacing would be
#   0.03125 and `+ 0.01` would vanish entirely.
# - **FP32 accumulator, FP16 increments: 10.00213623046875.** The accumulator keeps every addition; what is left is
#   FP16's representation error of 0.01 (0.01000213623046875), times 1000.

# %% [markdown] lang="zh" en="d74e2543888c"
# 三个结果都是精确值，在任何机器上都一样（IEEE 运算是确定性的）：
#
# - **FP32/FP32：10.000133514404297。** 0.01 无法用有限位的二进制小数表示；FP32 存的是 0.0099999998，
#   累加和经过 1000 次舍入，积累了一点误差。
# - **FP16/FP16：9.953125。** 每次 `+ 0.01` 都会舍入成 FP16 间距的整数倍，而间距随着和的增大而增大。
#   在 4 到 8 之间，间距是 2^-8，0.01 *向上*舍入为 3 个间距（0.0117）：和增长偏快，只加了 750 次就到了 8。
#   8 以上间距是 2^-7 = 0.0078125，0.01 *向下*舍入为 1 个间距：剩下的 250 次和增长偏慢。两种误差部分抵消。
#   到了 32，间距将是 0.03125，`+ 0.01` 会完全消失。
# - **FP32 累加器、FP16 增量：10.00213623046875。** 累加器保住了每一次加法；剩下的误差是 0.01 在 FP16
#   中的表示误差（存为 0.01000213623046875）乘以 1000。

# %%
assert sums == {"fp32 / fp32": 10.000133514404297, "fp16 / fp16": 9.953125, "fp32 acc / fp16 inc": 10.00213623046875}
assert accumulate(np.float16, np.float16, n=4000) == 32.0  # at 32 every further + 0.01 is lost
assert float(np.float16(0.01)) == 0.01000213623046875
s16, steps = np.float16(0), []
for _ in range(1000):
    s16, prev = np.float16(s16 + np.float16(0.01)), s16
    steps.append((float(prev), float(s16) - float(prev)))
assert sum(p < 8 for p, _ in steps) == 750 and {d for p, d in steps if p >= 8} == {2.0**-7}   # overshoot, undershoot
assert {d for p, d in steps if 4 <= p < 7.99} == {3 * 2.0**-8}   # 0.01 -> 3 spacings of 2^-8

# %% [markdown]
# This is why reductions in mixed precision accumulate in FP32. `torch.sum` of an FP16 tensor does so
# internally and only rounds the final result to FP16:

# %% [markdown] lang="zh" en="c60205b50be0"
# 这就是混合精度中的归约运算要用 FP32 累加的原因。对 FP16 张量调用 `torch.sum` 时，内部就是用 FP32
# 累加的，只在最后把结果舍入为 FP16：

# %%
s = torch.full((1000,), 0.01, dtype=torch.float16).sum()
print(s.dtype, s.item())
assert s.dtype == torch.float16 and s.item() == 10.0

# %% [markdown]
# **Predict, then run.** A weight of 1.0 stored in FP16 receives 1000 updates of `+1e-5`, each added and rounded in
# FP16 (`w16 = w16 + dw`). What is the weight afterwards? Record a number, then read on.

# %% [markdown] lang="zh" en="dbaed43f7349"
# **先预测，再运行。** 一个以 FP16 存储的权重 1.0 接受 1000 次 `+1e-5` 的更新，每次都在 FP16 中相加并舍入
# （`w16 = w16 + dw`）。更新之后权重是多少？先记下一个数，再往下读。

# %%
prediction = ...
### BEGIN SOLUTION
prediction = 1.0
### END SOLUTION
predict("02.fp16-weight", prediction)

# %% [markdown]
# ### The FP32 master-weights argument
#
# An optimizer step is `w = w - lr * g`: a small number added to a big one. Take a weight of 1.0 and an update of
# 1e-5 (a learning rate of 1e-3 times a gradient of 0.01). In FP16, `ulp(1.0)` = 2^-10 ≈ 0.00098, so anything
# below 0.00049 is swamped:

# %% [markdown] lang="zh" en="c4fcfc9bdfcd"
# ### 为什么需要 FP32 主权重
#
# 优化器的一步更新是 `w = w - lr * g`：把一个小数加到一个大数上。取权重 1.0、更新量 1e-5（学习率 1e-3
# 乘以梯度 0.01）。在 FP16 中，`ulp(1.0)` = 2^-10 ≈ 0.00098，所以小于 0.00049 的量都会被吃掉：

# %%
w16, w32 = torch.tensor(1.0, dtype=torch.float16), torch.tensor(1.0, dtype=torch.float32)
dw = 1e-5
for _ in range(1000):
    w16, w32 = w16 + dw, w32 + dw
print(f"ulp(1.0): fp16 {F.ulp(1.0, 'fp16')!r}, fp32 {F.ulp(1.0, 'fp32')!r}")
print(f"after 1000 updates of {dw}: fp16 weight {w16.item()!r}, fp32 weight {w32.item()!r}")

# %% tags=["workspace-clear"]
reveal("02.fp16-weight", w16.item())
assert w16.item() == 1.0                          # every single update was lost
assert w32.item() == 1.0100135803222656            # FP32 kept them all (each rounded to 2^-23)
assert dw < F.ulp(1.0, "fp16") / 2 and dw > F.ulp(1.0, "fp32") / 2

# %% [markdown]
# Training a model whose weights live in FP16 would simply stop learning once updates fall below half an ulp of
# the weights. Mixed-precision training therefore keeps an **FP32 master copy** of the weights: forward and
# backward run in FP16/BF16 (fast, half the bytes), and the optimizer adds the update to the FP32 copy. BF16 has
# even fewer mantissa bits (`ulp(1.0)` = 2^-7), so it needs the FP32 master weights just as much.
#
# > **Common misconception** (seed 000 §3.2): weight updates smaller than FP16's smallest normal number (about
# > 6e-5) are flushed to zero, and that is why the weights need an FP32 master copy.
# >
# > **Why it is wrong:** it confuses underflow with swamping. An update of 1e-5 is a perfectly good FP16 number (a
# > subnormal); it is lost only when it is *added* to a weight of 1.0, because it is below half an ulp of the weight.
# > An update of 2e-4, well above the smallest normal, is lost just the same, and the same 1e-5 added to a weight of
# > 0.001 survives.
# >
# > **What is true:** whether an update survives depends on its size *relative to the weight* (half an ulp of the
# > weight), not on the format's smallest normal. The cell below shows all three cases.

# %% [markdown] lang="zh" en="286393a4b627"
# 如果模型权重以 FP16 存储，一旦更新量小于权重的半个 ulp，模型就会干脆停止学习。因此混合精度训练会保留
# 一份 **FP32 主权重副本**：前向和反向传播用 FP16/BF16 运行（速度快，字节数减半），优化器则把更新加到
# FP32 副本上。BF16 的尾数位还要更少（`ulp(1.0)` = 2^-7），所以同样离不开 FP32 主权重。
#
# > **常见误解**（seed 000 §3.2）：小于 FP16 最小正规数（约 6e-5）的权重更新会被清零，所以权重需要
# > 一份 FP32 主权重副本。
# >
# > **错在哪里：** 它把下溢和大数吃小数混为一谈。1e-5 的更新量是一个完全合法的 FP16 数（一个次正规数）；
# > 它之所以丢失，只是因为它被*加到*权重 1.0 上，而它小于该权重的半个 ulp。2e-4 的更新量远大于最小正规数，
# > 照样会丢失；而同样的 1e-5 加到权重 0.001 上，却能保留下来。
# >
# > **实际情况：** 更新能否保留，取决于它*相对于权重*的大小（与权重的半个 ulp 相比），而不是格式的最小
# > 正规数。下面的单元格展示了这三种情况。

# %%
one, small = torch.tensor(1.0, dtype=torch.float16), torch.tensor(0.001, dtype=torch.float16)
print("1e-5 in fp16:", torch.tensor(1e-5, dtype=torch.float16).item(), "| 1.0 + 2e-4:", (one + 2e-4).item(),
      "| 0.001 + 1e-5 changes the weight:", (small + 1e-5).item() != small.item())
assert torch.tensor(1e-5, dtype=torch.float16).item() != 0    # representable: a subnormal
assert (one + 2e-4).item() == 1.0 and 2e-4 > 2.0**-14          # above the smallest normal, and still swamped
assert (small + 1e-5).item() != small.item()                   # the same 1e-5 survives next to a small weight

# %% [markdown]
# > **Common misconception** (seed 000 §3.2): gradients are accumulated in FP32 and converted to half precision
# > just before the weight update.
# >
# > **Why it is wrong:** that is the cast in the wrong direction. Accumulating gradients in FP32 is sound; casting
# > them down right before the update gains nothing. Either the update is then done in FP16, on FP16 weights, where
# > all 1000 updates of 1e-5 above were lost, or it is cast up again for the FP32 master, after the cast down has
# > rounded every gradient to 11 significant bits and flushed the smallest (below 2^-25) to zero. The master copy
# > exists so that the update itself happens in FP32, on gradients at least as precise as backward produced.
# >
# > **What is true:** with FP16 model weights (the master-weights scheme), backward produces FP16 gradients; they are
# > cast *up* to FP32, the optimizer applies the update to the FP32 master weights, and the result is copied back
# > (rounded) into the FP16 weights for the next forward pass. Under autocast there is no FP16 weight at all: the
# > parameters and their `.grad` stay FP32. The next cell runs the master-weights scheme by hand, with the update of
# > 1e-5 that FP16 alone lost; the one after it reads the dtypes under `torch.amp.autocast`.

# %% [markdown] lang="zh" en="6a84a25be280"
# > **常见误解**（seed 000 §3.2）：梯度先在 FP32 中累积，直到权重更新前一刻才转换为半精度。
# >
# > **错在哪里：** 转换的方向弄反了。在 FP32 中累积梯度没有问题；但在更新前把梯度降为半精度，没有任何好处。
# > 这样一来，要么更新在 FP16 中、对 FP16 权重进行，而上面 1000 次 1e-5 的更新正是这样全部丢失的；要么为了
# > 更新 FP32 主权重再把梯度转回 FP32，而此前的降精度转换已经把每个梯度舍入到 11 个有效位，并把最小的那些
# > （小于 2^-25）变成了 0。保留主权重副本，正是为了让更新本身在 FP32 中进行，所用梯度的精度至少不低于反向传播
# > 产生它们时的精度。
# >
# > **实际情况：** 模型权重为 FP16 时（即主权重方案），反向传播产生 FP16 梯度；这些梯度被*升*为 FP32，
# > 优化器把更新加到 FP32 主权重上，结果再（经舍入）复制回 FP16 权重，供下一次前向传播使用。在 autocast
# > 下则根本没有 FP16 权重：参数及其 `.grad` 始终是 FP32。下一个单元格手动运行主权重方案，用的正是单靠
# > FP16 时丢失的 1e-5 更新；再下一个单元格读取 `torch.amp.autocast` 下的各个 dtype。

# %%
p16 = torch.nn.Parameter(torch.ones(1, dtype=torch.float16))   # the FP16 model weight (forward and backward)
master = p16.detach().float()                                    # its FP32 master copy
for _ in range(1000):
    (p16 * 0.01).sum().backward()                # the gradient, 0.01, comes out in FP16
    g16, p16.grad = p16.grad, None
    master -= 1e-3 * g16.float()                 # cast *up* to FP32, update the master: ~1e-5 per step
    with torch.no_grad():
        p16.copy_(master)                        # round the master back into the FP16 weight
print(f"gradient {g16.dtype}, master {master.dtype}: master {master.item():.6f}, FP16 weight {p16.item()!r}")

# %%
assert g16.dtype == torch.float16 and master.dtype == torch.float32
assert abs(master.item() - (1 - 1000 * 1e-3 * float(np.float16(0.01)))) < 1e-4   # every step of ~1e-5 kept
assert p16.item() == float(np.float16(master.item())) != 1.0                       # the FP16 weight follows it
lin = torch.nn.Linear(8, 8)
with torch.amp.autocast(device_type="cpu", dtype=torch.bfloat16):
    out = lin(torch.randn(4, 8))                 # the matmul runs in BF16...
out.float().sum().backward()
print("under autocast: output", out.dtype, "| weight", lin.weight.dtype, "| weight.grad", lin.weight.grad.dtype)
assert out.dtype == torch.bfloat16 and lin.weight.dtype == lin.weight.grad.dtype == torch.float32  # ...not weights

# %% [markdown]
# ## 5. Overflow: activations above 65504
#
# FP16's range ends at 65504, and values far from rare in a network go beyond it: a squared activation of 300,
# a sum over many large terms, `exp(12)`. Once one value is inf, it spreads: `inf - inf` and `0 × inf` are NaN.

# %% [markdown] lang="zh" en="036e814a3899"
# ## 5. 上溢：超过 65504 的激活值
#
# FP16 的范围止于 65504，而网络中超出这个范围的值并不罕见：激活值 300 的平方、许多大项之和、`exp(12)`。
# 一旦某个值变成 inf，它就会扩散：`inf - inf` 和 `0 × inf` 都是 NaN。

# %%
a = torch.tensor([300.0, 60000.0], dtype=torch.float16)
sq, doubled = a[0] * a[0], a[1] * 2
print(sq.item(), doubled.item(), (doubled - doubled).item())
assert math.isinf(sq.item()) and math.isinf(doubled.item()) and math.isnan((doubled - doubled).item())

# %% [markdown]
# ### The softmax that blew up
#
# A custom attention softmax written as `exp(x) / exp(x).sum()` works in FP32 and fails in FP16: `exp(x)`
# overflows as soon as `x > ln(65504) ≈ 11.09`, and `inf / inf` is NaN. Attention scores of 12 are ordinary.

# %% [markdown] lang="zh" en="cfe3a2f8f46e"
# ### 溢出的 softmax
#
# 一个自定义的注意力 softmax 写成 `exp(x) / exp(x).sum()`，在 FP32 中没问题，在 FP16 中却会出错：只要
# `x > ln(65504) ≈ 11.09`，`exp(x)` 就会上溢，而 `inf / inf` 是 NaN。注意力分数达到 12 是很平常的事。

# %%
def naive_softmax(x):
    e = torch.exp(x)
    return e / e.sum(dim=-1, keepdim=True)

scores = torch.tensor([[10.0, 11.0, 12.0]])
print("fp32:", naive_softmax(scores).numpy().round(4), "  fp16:", naive_softmax(scores.half()).float().numpy())
assert torch.isnan(naive_softmax(scores.half())).any() and math.log(65504) < 12

# %% [markdown]
# Under CPU autocast the same thing happens: **CPU autocast does not upcast `exp` or `softmax` to FP32**. CUDA
# autocast does (both are on its FP32 list), but it cannot help a model converted with `.half()`, nor an op that
# is not on its list. Two fixes, and labkit's softmax uses both. **Subtract the row maximum** before `exp` (the
# "stable" softmax, as `torch.softmax` does): every exponent is then at most 0, so nothing overflows in any format
# (notebook 04 shows it in FP16). And an **FP32 island**: turn autocast off for the region, upcast, compute, cast
# back. The island is the general tool for any numerically delicate op, but for the naive formula it only moves the
# overflow from 11.09 to FP32's ln(3.4e38) ≈ 88.7.

# %% [markdown] lang="zh" en="53f2e1ee5b12"
# 在 CPU 上的 autocast 下也一样：**CPU autocast 不会把 `exp` 或 `softmax` 提升到 FP32**。CUDA autocast
# 会（两者都在它的 FP32 列表上），但它帮不了用 `.half()` 转换过的模型，也帮不了不在列表上的算子。修复方法
# 有两种，labkit 的 softmax 两种都用了。一是在 `exp` 之前**减去行最大值**（即“数值稳定”的 softmax，
# `torch.softmax` 就是这么做的）：这样 `exp` 的每个输入都不大于 0，在任何格式中都不会上溢（notebook 04
# 会在 FP16 中演示）。二是 **FP32 局部计算区**：在这段代码中关闭 autocast，先升到 FP32，再计算，最后转换
# 回原来的类型。局部计算区是处理任何数值敏感算子的通用手段，但对朴素公式而言，它只是把上溢的门槛从 11.09
# 挪到了 FP32 的 ln(3.4e38) ≈ 88.7。

# %%
with torch.autocast("cpu", dtype=torch.float16):
    h = torch.nn.functional.linear(scores, torch.eye(3))       # fp16 under autocast
    broken = naive_softmax(h)
    with torch.autocast("cpu", enabled=False):                  # the FP32 island
        fixed = naive_softmax(h.float()).to(h.dtype)
print(h.dtype, broken.float().numpy(), fixed.float().numpy().round(4))

# %%
assert h.dtype == torch.float16 and torch.isnan(broken).any()
assert torch.allclose(fixed.float(), torch.softmax(scores, -1), atol=1e-3)
assert torch.allclose(models.softmax(h, "fp32").float(), fixed.float())  # labkit's island, used by TinyGPT

# %% [markdown]
# `labkit.models.softmax(x, "fp32")` is this island, and `TinyGPT`'s attention uses it by default; notebook 04
# swaps in the naive version and watches a real model produce NaN.

# %% [markdown] lang="zh" en="2b4b34497f05"
# `labkit.models.softmax(x, "fp32")` 就是这种局部计算区，`TinyGPT` 的注意力默认使用它；notebook 04
# 会换上朴素版本，观察一个真实的模型如何产生 NaN。

# %% [markdown]
# ## 6. Exercises
#
# Fill in each `...`, run the cell, and `check` tells you whether you are right.
#
# **6.1** For each value in `UNDERFLOW_VALUES`, does it become exactly 0 when cast to FP16? Answer with a list of
# booleans (True = it becomes 0). Predict first, then check with a cast if you like.

# %% [markdown] lang="zh" en="2356449d5416"
# ## 6. 练习
#
# 填好每个 `...`，运行单元格，`check` 会告诉你答得对不对。
#
# **6.1** `UNDERFLOW_VALUES` 中的每个值转换为 FP16 后，是否恰好变成 0？用一个布尔值列表作答（True 表示
# 变成 0）。先预测；如果愿意，再做一次类型转换来验证。

# %%
print(UNDERFLOW_VALUES)
answer = ...  # e.g. [True, False, ...]
### BEGIN SOLUTION
answer = [v < 2.0**-25 for v in UNDERFLOW_VALUES]
### END SOLUTION
check("02.underflows", answer)

# %% [markdown]
# **6.2** What is the gap between 1000 and the next larger FP16 value? Work it out from the format, without
# `labkit.formats.ulp`.

# %% [markdown] lang="zh" en="f7dc4eafa017"
# **6.2** 1000 与下一个更大的 FP16 值之间相差多少？请根据格式推算，不要用 `labkit.formats.ulp`。

# %%
answer = ...
### BEGIN SOLUTION
answer = 2.0 ** (math.floor(math.log2(1000)) - 10)
### END SOLUTION
check("02.ulp-1000", answer)

# %% [markdown]
# **6.3** What is the smallest positive integer that FP16 cannot represent exactly?

# %% [markdown] lang="zh" en="3267d660f6ad"
# **6.3** FP16 无法精确表示的最小正整数是多少？

# %%
answer = ...
### BEGIN SOLUTION
answer = next(n for n in range(1, 100_000) if float(np.float16(n)) != n)
### END SOLUTION
check("02.first-int", answer)

# %% [markdown]
# **6.4** What is the smallest power of two `dw` such that `1.0 + dw`, rounded to FP16, is not 1.0? (Careful with
# the tie.)

# %% [markdown] lang="zh" en="6d3c2a906795"
# **6.4** 使 `1.0 + dw` 舍入到 FP16 后不等于 1.0 的、最小的 2 的幂 `dw` 是多少？（注意中点情形。）

# %%
answer = ...
### BEGIN SOLUTION
answer = next(2.0**-k for k in range(30, -1, -1) if float(np.float16(1.0 + 2.0**-k)) != 1.0)
### END SOLUTION
check("02.lost-update", answer)

# %% [markdown]
# **6.5 Debug: an RMS that overflows.** A custom RMS norm computes the root mean square of its input. It works in
# FP32 and returns inf on FP16 activations of an ordinary size:

# %% [markdown] lang="zh" en="c3cb97d795f9"
# **6.5 调试：会上溢的 RMS。** 一个自定义的 RMS 归一化计算输入的均方根。它在 FP32 中工作正常，但对大小
# 再普通不过的 FP16 激活值却返回 inf：

# %%
def rms(x):
    return x.pow(2).mean().sqrt()

acts = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 300
print(f"fp32: {rms(acts).item():.2f}   fp16: {rms(acts.half()).item()}")
assert math.isinf(rms(acts.half()).item())  # 300² = 90000 > 65504: the squares overflow

# %% [markdown]
# Write a fixed `rms(x)`: finite for any FP16 or BF16 tensor, close to the true value, and returned in the input's
# dtype. The check calls it on fresh tensors, large and small.

# %% [markdown] lang="zh" en="3471eac7bd27"
# 写一个修复后的 `rms(x)`：对任何 FP16 或 BF16 张量都返回有限值，接近真实值，并以输入的 dtype 返回。
# 检查时会用新生成的张量调用它，有大有小。

# %%
def rms(x):
    ...
    ### BEGIN SOLUTION
    return x.float().pow(2).mean().sqrt().to(x.dtype)
    ### END SOLUTION


check("02.rms-overflow", rms)

# %% [markdown]
# ## Summary
#
# - Below the normals, FP16 loses a bit of precision per binade and flushes to zero at and under 2^-25 ≈ 3e-8; above
#   65504 it overflows to inf. BF16 has FP32's range (no such trouble) but only 8 bits of precision.
# - E4M3FN has no inf: torch saturates an overflow to 448, ml_dtypes makes it NaN; E5M2 gives inf in both.
# - Rounding is to nearest, ties to even, in every cast and every operation.
# - Small numbers added to large ones are swamped: accumulate in FP32, and keep FP32 master weights, or small
#   updates vanish.
# - `exp` overflows FP16 above 11.09: subtract the row maximum before `exp`, and compute delicate ops in an FP32
#   island (`autocast(enabled=False)` + upcast).
# - Mixed precision updates FP32 master weights: FP16 gradients are cast up, never the update down; under
#   autocast the parameters and their gradients are FP32 throughout.
#
# Next, notebook 03 measures how many *real* gradients fall below FP16's range, and brings them back with loss
# scaling.

# %% [markdown] lang="zh" en="c94847ffbad7"
# ## 小结
#
# - 在正规数以下，FP16 每低一个 binade 就损失一位精度，小于或等于 2^-25 ≈ 3e-8 时下溢为 0；大于 65504 时上溢为
#   inf。BF16 拥有 FP32 的范围（没有这些麻烦），但只有 8 位精度。
# - E4M3FN 没有 inf：上溢时 torch 饱和到 448，ml_dtypes 则给出 NaN；E5M2 在两个库中都给出 inf。
# - 每次类型转换、每个运算都采用就近舍入（偶数优先）。
# - 小数加到大数上会被吃掉：要用 FP32 累加，并保留 FP32 主权重，否则小的更新会消失。
# - 输入大于 11.09 时，`exp` 在 FP16 中上溢：在 `exp` 之前减去行最大值，并把数值敏感的算子放在 FP32
#   局部计算区中计算（`autocast(enabled=False)` + 升为 FP32）。
# - 混合精度更新的是 FP32 主权重：把 FP16 梯度升为 FP32，而绝不把更新降为低精度；在 autocast 下，参数
#   及其梯度自始至终都是 FP32。
#
# 接下来，notebook 03 将测量有多少*真实*梯度落在 FP16 的范围之下，并用损失缩放把它们找回来。
